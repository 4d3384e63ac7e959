"""Crash safety: a killed worker's calls are taken over within seconds, never written twice.

Each test starts its own workers on the ``idem_crash`` queue (lease 2 s, sweep
0.25 s), so it can kill or pause them without disturbing anything else.
"""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from idempotency_support import (
    LEASE_S,
    idem_env,
    order_arguments,
    record_of,
    run_id,
    signal_worker,
    start_worker,
    wait_until,
)

from toolexec.client import CallHandle, ToolClient
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Ledger, Reply, WorkerProcess

pytestmark = pytest.mark.integration

CALLS = 50
DEADLINE_S = 40.0
#: Longer than any test waits: the first worker's requests stay in flight until it dies.
STUCK = Reply(delay=30.0)


@pytest.fixture
def crash_client(settings: Settings) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Workers a test starts; stopped (or killed) at the end whatever happened."""
    started: list[WorkerProcess] = []
    yield started
    for proc in started:
        if proc.process is not None and proc.process.poll() is None:
            signal_worker(proc, signal.SIGCONT)
            proc.kill()


def test_sigkill_with_50_writes_in_flight_loses_none_and_duplicates_none(
    crash_client: ToolClient,
    flaky: FlakyServer,
    settings: Settings,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Given 50 side-effecting calls running on one worker, when it is SIGKILLed, then:

    every call ends with ok or unknown before its deadline; no order is written
    twice; and another worker takes each call over within lease + 8 s: seconds,
    not the broker's visibility timeout. (The lease + 2 s target is for an
    unloaded machine and is bench/idempotency.py's to measure; here a loaded
    taker starves its own sweeper thread of the GIL for seconds.)

    Calls 0-19 wrote already (the ledger holds the order, the reply never came):
    the taker's check finds it. Calls 20-39 were still in a slow read before the
    write: the check finds nothing and the taker writes. Calls 40-49 have no
    check: they end ``unknown`` and are not written again.
    """
    env = idem_env(worker_env)
    doomed = start_worker(
        env, settings, tmp_path / "doomed.log", queues="idem_crash", concurrency=64
    )
    workers.append(doomed)
    ledger = Ledger.open(flaky)
    gates = [flaky.unique_path("gate") for _ in range(CALLS)]
    handles: list[CallHandle] = []
    for i in range(CALLS):
        landed = i < 20 or i >= 40
        order = ledger.entry(f"o{i}", STUCK, Reply()) if landed else ledger.entry(f"o{i}")
        extra = {} if landed else {"prepare": flaky.script(gates[i], STUCK, Reply())}
        tool = "crash_order_blind" if i >= 40 else "crash_order"
        arguments = order_arguments(ledger, order, **extra)
        handles.append(crash_client.submit(tool, arguments, run_id=run_id(), timeout=DEADLINE_S))

    def in_flight() -> int:
        writes = sum(len(ledger.writes(f"o{i}")) for i in range(CALLS))
        return writes + sum(len(flaky.hits(gates[i])) for i in range(20, 40))

    wait_until(lambda: in_flight() == CALLS, 30, "50 calls in flight on the first worker")
    workers.append(
        start_worker(env, settings, tmp_path / "taker.log", queues="idem_crash", concurrency=32)
    )

    killed_at = time.time()
    doomed.kill()
    results = [h.result() for h in handles]

    statuses = [r.status for r in results]
    assert statuses == ["ok"] * 40 + ["unknown"] * 10, statuses
    assert all(r.elapsed_ms < DEADLINE_S * 1000 for r in results)
    assert all(r.source == "check" for r in results[:20])
    written_by_taker = [
        {"order_id": f"o{i}", "amount": 10.0, "written": True} for i in range(20, 40)
    ]
    assert [r.data for r in results[20:40]] == written_by_taker
    assert all(r.error is not None and r.error.type is ErrorType.WORKER_LOST for r in results[40:])
    writes = [len(ledger.writes(f"o{i}")) for i in range(CALLS)]
    assert writes == [1] * CALLS, writes  # zero duplicates, and the unwritten ones written once

    takeovers = sorted(ledger.checks(f"o{i}")[0].at - killed_at for i in range(40))
    print(
        f"\ntakeover after SIGKILL: median {statistics.median(takeovers):.2f} s, "
        f"max {takeovers[-1]:.2f} s (lease {LEASE_S} s)"
    )
    # Seconds, not the broker's visibility timeout (960 s here) nor the deadline (40 s).
    # The target, lease + 2 s, is bench/idempotency.py's to measure: on this shared 2-core
    # machine a loaded taker starves its own sweeper thread of the GIL for seconds.
    assert takeovers[-1] <= LEASE_S + 8.0


def test_a_paused_worker_cannot_overwrite_the_outcome_of_the_worker_that_took_over(
    crash_client: ToolClient,
    flaky: FlakyServer,
    settings: Settings,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Given a worker paused (SIGSTOP) mid-write past its lease, when another takes the call
    over and finishes it, then the resumed zombie's outcome is fenced off: the record and the
    caller keep the taker's answer, and the zombie sends none.
    """
    env = idem_env(worker_env)
    zombie = start_worker(
        env, settings, tmp_path / "zombie.log", queues="idem_crash", concurrency=2
    )
    workers.append(zombie)
    ledger = Ledger.open(flaky)
    order = ledger.entry("z1", Reply(delay=6.0, body={"from": "the first request"}), Reply())
    handle = crash_client.submit(
        "crash_order", order_arguments(ledger, order), run_id=run_id(), timeout=DEADLINE_S
    )
    wait_until(lambda: bool(ledger.writes(order)), 20, "the write reaching the ledger")
    workers.append(
        start_worker(env, settings, tmp_path / "taker.log", queues="idem_crash", concurrency=2)
    )

    signal_worker(zombie, signal.SIGSTOP)
    result = handle.result()
    signal_worker(zombie, signal.SIGCONT)

    keys = Keys(settings.key_prefix)
    wait_until(
        lambda: record_of(crash_client.redis, keys, handle.call_id).get("fenced") == "1",
        20,
        "the zombie's attempt to store its outcome",
    )
    record = record_of(crash_client.redis, keys, handle.call_id)
    assert result.ok and result.source == "check"
    assert record["state"] == "succeeded" and int(record["takeovers"]) >= 1
    assert '"source":"check"' in record["result"]
    assert len(ledger.writes(order)) == 1
    assert crash_client.redis.llen(keys.reply(handle.call_id)) == 0  # no second answer


def test_sigkill_of_one_of_two_workers_with_20_reads_in_flight_loses_none(
    crash_client: ToolClient,
    flaky: FlakyServer,
    settings: Settings,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Given 20 read-only calls of 2 s running on two workers with default lease and sweep,
    when one worker is SIGKILLed, then all 20 end ok, the slowest within 15 s: its calls
    are handed on by the lease sweeper, not after the broker's visibility timeout.
    """
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    for log in logs:  # default TOOLEXEC_IDEMPOTENCY_LEASE_S and _SWEEP_S
        workers.append(start_worker(worker_env, settings, log, queues="idem_crash", concurrency=16))
    paths = [flaky.unique_path("read") for _ in range(20)]
    urls = [flaky.script(path, Reply(body={"n": i}, delay=2.0)) for i, path in enumerate(paths)]
    start = time.time()
    handles = [crash_client.submit("crash_read", {"url": url}, timeout=DEADLINE_S) for url in urls]
    wait_until(lambda: all(flaky.hits(p) for p in paths), 20, "20 reads in flight")

    doomed = workers[0]
    doomed.kill()
    results = [h.result() for h in handles]

    assert "tools.crash_read[" in logs[0].read_text()  # the killed worker had calls
    assert [r.status for r in results] == ["ok"] * 20, [r.error for r in results]
    assert [r.data for r in results] == [{"n": i} for i in range(20)]
    slowest = max(r.elapsed_ms for r in results) / 1000
    print(
        f"\n20 reads, one of two workers SIGKILLed: slowest {slowest:.2f} s "
        f"({time.time() - start:.2f} s wall)"
    )
    assert slowest <= 15.0
