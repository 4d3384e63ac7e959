"""Circuit breakers across real worker processes, counted at the failing service itself.

Two workers import tests/breaker_tools.py. Both consume the tools' queue
(``breakers``) and each also a queue of its own (``breakers-a``, ``breakers-b``),
so a test can put a call on one worker by publishing it there directly, as a
producer that skipped the client's pre-check would. The FlakyServer's hit log
is the ground truth: a call the breakers refused never reaches it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from breaker_tools import LEASED, OUTAGE, QUEUE
from celery import Celery

from toolexec.breaker import BreakerState, CircuitBreaker
from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.replies import ReplyBox
from toolexec.testing import FlakyServer, Hit, Reply, WorkerProcess
from toolexec.worker.app import create_app

pytestmark = pytest.mark.integration


def _worker(
    env: dict[str, str], settings: Settings, logs: Path, name: str, queues: str
) -> WorkerProcess:
    proc = WorkerProcess(
        "breaker_tools", env, queues=queues, concurrency=16, log_path=logs / f"{name}.log"
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("breaker-workers")


@pytest.fixture(scope="module")
def workers(
    settings: Settings, worker_env: dict[str, str], logs: Path
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    a = _worker(worker_env, settings, logs, "a", f"{QUEUE},{QUEUE}-a")
    b = _worker(worker_env, settings, logs, "b", f"{QUEUE},{QUEUE}-b")
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def tx(settings: Settings, workers: tuple[WorkerProcess, WorkerProcess]) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


@pytest.fixture(scope="module")
def producer(settings: Settings) -> Iterator[Celery]:
    celery_app = create_app(settings)
    yield celery_app
    celery_app.close()


@pytest.fixture(scope="module")
def breakers(settings: Settings) -> Iterator[CircuitBreaker]:
    client = redis_client(settings.redis_url or "")
    yield CircuitBreaker(client, Keys(settings.key_prefix))
    client.close()


def _on_queue(
    producer: Celery, tx: ToolClient, queue: str, tool: str, arguments: dict[str, Any]
) -> ToolResult:
    """Run one call on the worker that consumes ``queue``, past the client's pre-check."""
    now = time.time()
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=tool,
        deadline=now + 15,
        submitted_at=now,
        reply_to=uuid.uuid4().hex,
    )
    producer.send_task(
        f"tools.{tool}",
        kwargs={"arguments": arguments, "context": ctx.to_json()},
        task_id=ctx.call_id,
        queue=queue,
    )
    box = ReplyBox(tx.keys, ctx.reply_to, [ctx.call_id])
    box.collect(tx.redis, wait=20)
    assert ctx.call_id in box.results, f"no reply from the worker on {queue}"
    return box.results[ctx.call_id]


def _kind(result: ToolResult) -> str | None:
    return None if result.error is None else str(result.error.type)


def _await_hits(flaky: FlakyServer, path: str, count: int, timeout: float = 10.0) -> list[Hit]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hits = flaky.hits(path)
        if len(hits) >= count:
            return hits
        time.sleep(0.02)
    raise AssertionError(f"{path} got {len(flaky.hits(path))} hits, expected {count}")


def _until_admitted(tx: ToolClient, tool: str, url: str, limit: float) -> list[ToolResult]:
    """Call every 0.1 s until a call is not refused as circuit_open; all results, in order."""
    results: list[ToolResult] = []
    end = time.monotonic() + limit
    while time.monotonic() < end:
        results.append(tx.call(tool, {"url": url}, timeout=10))
        if _kind(results[-1]) != ErrorType.CIRCUIT_OPEN:
            return results
        time.sleep(0.1)
    raise AssertionError(f"{tool} was still refused after {limit} s")


def test_failures_seen_by_one_worker_open_the_breaker_for_the_other(
    tx: ToolClient, producer: Celery, flaky: FlakyServer, breakers: CircuitBreaker
) -> None:
    # given a failing service, called three times through worker A
    path = flaky.unique_path("shared")
    url = flaky.script(path, Reply(503))
    seen_by_a = [
        _on_queue(producer, tx, f"{QUEUE}-a", "shared_service", {"url": url}) for _ in "abc"
    ]
    assert [_kind(r) for r in seen_by_a] == ["unavailable"] * 3

    # when worker B gets a call, past the client's pre-check
    on_b = _on_queue(producer, tx, f"{QUEUE}-b", "shared_service", {"url": url})

    # then B refuses it without running the tool: the service saw A's three calls only
    assert _kind(on_b) == ErrorType.CIRCUIT_OPEN and on_b.attempts == 0
    assert on_b.error is not None and on_b.error.retry_after is not None
    assert len(flaky.hits(path)) == 3
    assert breakers.snapshot("shared_service").state is BreakerState.OPEN


def test_while_open_only_probes_reach_the_service_and_m_successes_close_it(
    tx: ToolClient, producer: Celery, flaky: FlakyServer, breakers: CircuitBreaker
) -> None:
    # given an outage that opened the breaker (3 failures; open for 4 s)
    path = flaky.unique_path("outage")
    url = flaky.script(path, Reply(503), Reply(503), Reply(503), Reply(200, {"back": True}))
    assert {_kind(tx.call("outage_service", {"url": url}, timeout=10)) for _ in "abc"} == {
        "unavailable"
    }
    opened_at = time.monotonic()

    # when agents keep calling during the outage, through the client and past it to both workers
    refused = [tx.call("outage_service", {"url": url}, timeout=10) for _ in range(10)]
    refused += [
        _on_queue(producer, tx, f"{QUEUE}-{w}", "outage_service", {"url": url}) for w in "abab"
    ]
    assert time.monotonic() - opened_at < OUTAGE.open_s, "too slow to test the open period"

    # then none of them reached the service
    assert {_kind(r) for r in refused} == {ErrorType.CIRCUIT_OPEN}
    assert len(flaky.hits(path)) == 3

    # and once it is back, probes reach it: the first leaves it half-open, the second closes it
    first = _until_admitted(tx, "outage_service", url, limit=OUTAGE.open_s + 3)[-1]
    assert first.ok and breakers.snapshot("outage_service").state is BreakerState.HALF_OPEN
    second = tx.call("outage_service", {"url": url}, timeout=10)
    assert second.ok and breakers.snapshot("outage_service").state is BreakerState.CLOSED
    assert len(flaky.hits(path)) == 5


def _wait_admits(breakers: CircuitBreaker, name: str, within: float) -> None:
    """Until the breaker's open time has passed, as the breaker itself tells (Redis TIME)."""
    end = time.monotonic() + within
    while not breakers.snapshot(name).admits:
        assert time.monotonic() < end, f"{name} still refused calls after {within} s"
        time.sleep(0.05)


def test_half_open_with_k2_admits_exactly_two_of_twenty_concurrent_callers(
    tx: ToolClient, flaky: FlakyServer, breakers: CircuitBreaker
) -> None:
    # given an open breaker whose open time has passed, and a recovered but slow service
    path = flaky.unique_path("probed")
    url = flaky.script(path, Reply(503), Reply(503), Reply(503), Reply(200, delay=2.0))
    for _ in "abc":
        tx.call("probed_service", {"url": url}, timeout=10)
    assert breakers.snapshot("probed_service").state is BreakerState.OPEN
    _wait_admits(breakers, "probed_service", 10)  # the policy's open_s (2 s) has passed

    # when 20 agents call at once
    with ThreadPoolExecutor(20) as pool:
        results = list(
            pool.map(lambda _: tx.call("probed_service", {"url": url}, timeout=10), range(20))
        )

    # then exactly two ran, as probes, and their successes closed the breaker
    kinds = [_kind(r) for r in results]
    assert kinds.count(None) == 2 and kinds.count(ErrorType.CIRCUIT_OPEN) == 18, kinds
    assert len(flaky.hits(path)) == 3 + 2
    assert breakers.snapshot("probed_service").state is BreakerState.CLOSED


def test_retry_after_on_a_503_keeps_it_open_longer_than_its_open_time(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a breaker that opens for 1 s, and a service that answers 503 with Retry-After: 3
    path = flaky.unique_path("throttled")
    url = flaky.script(path, Reply(503, headers={"Retry-After": "3"}), Reply(200))

    # when one call fails, and agents keep calling every 0.1 s
    failed = tx.call("throttled_service", {"url": url}, timeout=10)
    assert _kind(failed) == "unavailable"
    calls = _until_admitted(tx, "throttled_service", url, limit=8)

    # then calls were refused for 3 s, not 1, saying how long to wait; the next reached the service
    first, second = flaky.hits(path)
    assert second.at - first.at >= 3.0
    assert calls[0].error is not None and calls[0].error.retry_after is not None
    assert calls[0].error.retry_after > 2.0
    assert calls[-1].ok


def test_a_killed_probe_holder_gives_its_permit_back_when_its_lease_ends(
    tx: ToolClient,
    producer: Celery,
    flaky: FlakyServer,
    breakers: CircuitBreaker,
    settings: Settings,
    worker_env: dict[str, str],
    logs: Path,
) -> None:
    # given leased_service opened by a failure (K = 1 probe, 5 s lease, open for 0.5 s)
    path = flaky.unique_path("leased")
    url = flaky.script(path, Reply(503), Reply(200, delay=30.0), Reply(200))
    assert _kind(tx.call("leased_service", {"url": url}, timeout=10)) == "unavailable"
    _wait_admits(breakers, "leased_service", 10)  # its open time (0.5 s) has passed

    # when the probe runs on a worker that is killed while the service holds its request
    doomed = _worker(worker_env, settings, logs, "doomed", f"{QUEUE}-doomed")
    now = time.time()
    ctx = CallContext(uuid.uuid4().hex, "leased_service", now + 15, now, uuid.uuid4().hex)
    producer.send_task(
        "tools.leased_service",
        kwargs={"arguments": {"url": url}, "context": ctx.to_json()},
        task_id=ctx.call_id,
        queue=f"{QUEUE}-doomed",
    )
    probe_hit = _await_hits(flaky, path, 2)[1]
    doomed.kill()

    # then its permit still blocks probing: callers are refused until its lease runs out
    view = breakers.snapshot("leased_service")
    assert view.state is BreakerState.HALF_OPEN and view.probes_in_flight == 1
    calls = _until_admitted(tx, "leased_service", url, limit=LEASED.probe_lease_s + 5)
    assert _kind(calls[0]) == ErrorType.CIRCUIT_OPEN
    admitted = flaky.hits(path)[2]
    assert admitted.at - probe_hit.at >= LEASED.probe_lease_s - 0.5
    assert calls[-1].ok and breakers.snapshot("leased_service").state is BreakerState.CLOSED
