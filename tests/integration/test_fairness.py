"""Issue 26's done-when, end to end: one worker of 8 slots, a tenant's backlog, another's calls.

Tenant A queues 800 calls of 50 ms (5 s of work for 8 slots); tenant B's 10
calls sent right after must all finish within 1 s, and all of A's must still
finish ok. The same with priorities: one priority-1 call behind 800 queued
priority-5 calls finishes within 1 s. Without lanes B's calls finished after
A's whole backlog (5.16 s measured on the issue's machine).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_support import cluster_run
from fairness_support import fairness_worker
from fairness_tools import QUEUE
from rigs.chaos import wait_until

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.keys import BrokerKeys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(cluster_run(), reason="lanes live on a Redis broker, not a cluster"),
]

BACKLOG = 800


@pytest.fixture(scope="module")
def fair_worker(
    worker_env: dict[str, str], settings: Settings, tmp_path_factory: Any
) -> Iterator[WorkerProcess]:
    proc = fairness_worker(worker_env, settings, tmp_path_factory.mktemp("fair"), 8)
    yield proc
    proc.stop()


@pytest.fixture
def fair_client(settings: Settings, fair_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


def _waiting(settings: Settings) -> int:
    """Calls waiting on the fairness queue: in the queue itself or sorted into its lanes."""
    broker = redis_client(settings.broker_url or settings.redis_url or "")
    keys = BrokerKeys(settings.key_prefix)
    lanes = list(broker.scan_iter(f"{keys.lane_prefix(QUEUE)}*", count=1000))
    return int(broker.llen(QUEUE)) + sum(int(broker.llen(k)) for k in lanes)


def _backlog(client: ToolClient, **lane: Any) -> tuple[threading.Thread, list[ToolResult]]:
    """BACKLOG calls of 50 ms sent from a thread; their results land in the list."""
    results: list[ToolResult] = []

    def send() -> None:
        calls = [("nap", {"ms": 50, "tag": f"bulk{i}"}) for i in range(BACKLOG)]
        results.extend(client.call_many(calls, timeout=120, **lane))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, results


def _finished(thread: threading.Thread, results: list[ToolResult]) -> None:
    thread.join(timeout=120)
    assert not thread.is_alive(), "the backlog did not finish"
    assert len(results) == BACKLOG
    bad = [(r.status, r.error) for r in results if r.status != "ok"]
    assert not bad, bad[:3]


def test_a_quiet_tenant_is_not_starved_by_a_noisy_ones_backlog(
    fair_client: ToolClient, settings: Settings
) -> None:
    thread, bulk = _backlog(fair_client, fairness_key="tenant-a")
    assert wait_until(lambda: _waiting(settings) >= BACKLOG // 2, 30), "A's backlog never queued"

    start = time.monotonic()
    quiet = fair_client.call_many(
        [("nap", {"ms": 50, "tag": f"b{i}"}) for i in range(10)],
        fairness_key="tenant-b",
        timeout=30,
    )
    took = time.monotonic() - start

    assert [r.status for r in quiet] == ["ok"] * 10
    assert took < 1.0, f"tenant B's 10 calls took {took:.2f} s behind A's backlog"
    assert _waiting(settings) > 100, "A's backlog had drained: the test proved nothing"
    _finished(thread, bulk)


def test_an_urgent_call_jumps_a_batch_backlog(fair_client: ToolClient, settings: Settings) -> None:
    thread, bulk = _backlog(fair_client, priority=5)
    assert wait_until(lambda: _waiting(settings) >= BACKLOG // 2, 30), "the backlog never queued"

    start = time.monotonic()
    urgent = fair_client.call("nap", {"ms": 50, "tag": "urgent"}, priority=1, timeout=30)
    took = time.monotonic() - start

    assert urgent.status == "ok"
    assert took < 1.0, f"the priority-1 call took {took:.2f} s behind the backlog"
    assert _waiting(settings) > 100, "the backlog had drained: the test proved nothing"
    _finished(thread, bulk)


def test_a_tools_max_in_flight_holds_fleet_wide_and_blocks_no_other_tool(
    fair_client: ToolClient,
) -> None:
    """``@tool(max_in_flight=2)``: 8 calls of 0.3 s on 8 free slots take 4 rounds, not 1."""
    results: list[ToolResult] = []
    start = time.monotonic()
    sender = threading.Thread(
        target=lambda: results.extend(
            fair_client.call_many([("capped_nap", {"ms": 300})] * 8, timeout=30)
        )
    )
    sender.start()
    assert wait_until(lambda: time.monotonic() - start > 0.2, 2)
    other_start = time.monotonic()
    other = fair_client.call("nap", {"ms": 50, "tag": "other"}, timeout=30)
    other_took = time.monotonic() - other_start
    sender.join(timeout=30)
    took = time.monotonic() - start

    assert [r.status for r in results] == ["ok"] * 8
    assert took >= 4 * 0.3 - 0.05, f"8 capped calls took {took:.2f} s: more than 2 ran at once"
    assert other.status == "ok"
    assert other_took < 0.6, f"another tool's call waited {other_took:.2f} s behind the cap"
