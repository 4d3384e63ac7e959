"""A second Ctrl-C (or a SIGQUIT) on a threads-pool worker: one line, at once, no call lost.

Real workers on the ``idem_crash`` queue (lease 2 s, sweep 0.25 s), real signals
to the worker's process group as a terminal sends them: the first SIGINT starts
Celery's warm shutdown, the second stops the worker with calls still running.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from idempotency_support import LEASE_S, idem_env, order_arguments, run_id, wait_until

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.tasks.interrupt import ARMED_LINE
from toolexec.testing import FlakyServer, Ledger, Reply, WorkerProcess

pytestmark = pytest.mark.integration

DEADLINE_S = 40.0
STUCK = Reply(delay=30.0)


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for proc in started:
        proc.kill()


def _start(env: dict[str, str], settings: Settings, log: Path) -> WorkerProcess:
    proc = WorkerProcess(
        "idempotency_tools", env, queues="idem_crash", concurrency=4, log_path=log
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


def _exits_within(proc: WorkerProcess, seconds: float) -> int:
    assert proc.process is not None
    return proc.process.wait(seconds)


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGQUIT], ids=["ctrl-c", "sigquit"])
def test_a_second_interrupt_stops_at_once_and_hands_the_calls_on(
    second: signal.Signals,
    flaky: FlakyServer,
    settings: Settings,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Given a threads-pool worker running a read-only call and a side-effecting call
    without a check, when it gets Ctrl-C and then Ctrl-C (or SIGQUIT) again, then it exits
    within a few seconds, printing one line and no traceback; a worker started afterwards
    completes the read and answers the write ``unknown`` without writing it again.
    """
    env = idem_env(worker_env)
    log = tmp_path / "interrupted.log"
    doomed = _start(env, settings, log)
    workers.append(doomed)
    read_path = flaky.unique_path("read")
    read_url = flaky.script(read_path, STUCK, Reply(body={"stock": 7}))
    ledger = Ledger.open(flaky)
    order = ledger.entry("o1", STUCK, Reply())
    with ToolClient(settings) as client:
        read = client.submit("crash_read", {"url": read_url}, timeout=DEADLINE_S)
        write = client.submit(
            "crash_order_blind",
            order_arguments(ledger, order),
            run_id=run_id(),
            timeout=DEADLINE_S,
        )
        wait_until(
            lambda: bool(flaky.hits(read_path)) and bool(ledger.writes(order)),
            20,
            "both calls running on the worker",
        )
        assert doomed.process is not None
        os.killpg(doomed.process.pid, signal.SIGINT)
        wait_until(lambda: ARMED_LINE in log.read_text(), 10, "the second Ctrl-C armed")
        stopped_at = time.monotonic()
        os.killpg(doomed.process.pid, second)
        code = _exits_within(doomed, 10)
        took = time.monotonic() - stopped_at

        workers.append(_start(env, settings, tmp_path / "after.log"))
        read_result, write_result = read.result(), write.result()

    text = log.read_text()
    after_warm = text[text.index("Warm shutdown") :]
    ours = [line for line in after_warm.splitlines() if line.startswith("toolexec worker:")]
    assert code == 1 and took < 5.0, (code, took)
    assert "Traceback" not in text and "Unrecoverable" not in text and "kill_job" not in text
    assert len(ours) == 1 and "stopping now with 2 call(s) in flight" in ours[0], after_warm
    assert read_result.status == "ok" and read_result.data == {"stock": 7}, read_result
    assert write_result.status == "unknown", write_result
    assert write_result.error is not None and write_result.error.type is ErrorType.WORKER_LOST
    assert len(ledger.writes(order)) == 1  # never written a second time
    assert LEASE_S < DEADLINE_S
