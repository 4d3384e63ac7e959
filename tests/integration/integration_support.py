"""Plain helpers the integration modules share (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from toolexec.keys import Keys
from toolexec.stores import liveness
from toolexec.testing import Hit, WorkerProcess

T = TypeVar("T")


def timed(func: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``func(*args, **kwargs)`` and the seconds it took, on the monotonic clock."""
    start = time.monotonic()
    value = func(*args, **kwargs)
    return value, time.monotonic() - start


def closed_port() -> int:
    """A local port that refuses connections (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def gaps(hits: list[Hit]) -> list[float]:
    """Seconds between consecutive hits at the service."""
    return [later.at - earlier.at for earlier, later in itertools.pairwise(hits)]


BENCH = Path(__file__).resolve().parents[2] / "bench"


#: A smoke-run bench takes 2 to 41 s alone here; at nice 19 beside ``make test-redis`` on a
#: slow day (2026-12-03) ``observability.py --quick`` ran past 110 s. The limit is a hang's
#: bound, not a figure: 240 s, and the test's own limit above it and the clean-up.
BENCH_TIMEOUT_S = 240.0
BENCH_CLEANUP_S = 30.0  # for the bench's own ``finally`` blocks to stop its workers and servers
#: The marks of a bench smoke module: the suite's 120 s per test would end it first.
BENCH_MARKS = [
    pytest.mark.integration,
    pytest.mark.timeout(BENCH_TIMEOUT_S + BENCH_CLEANUP_S + 30.0),
]


def run_bench(script: str, *args: str) -> str:
    """Run ``bench/<script>`` to the end and return its report; its figures stay unasserted.

    A bench that runs out of time is interrupted (SIGINT), not killed: its workers and
    servers run in sessions of their own, and only the bench's own clean-up stops them.
    Killed outright, it leaves them busy for the rest of the test run.
    """
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=BENCH_CLEANUP_S)
        finally:
            proc.kill()
        raise AssertionError(
            f"bench/{script} did not finish within {BENCH_TIMEOUT_S:.0f} s:\n{stderr[-3000:]}"
        ) from None
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


def stall_queue(client: redis.Redis, keys: Keys, queue: str) -> None:
    """Count a live worker on ``queue`` that never takes a message, as a stalled one would.

    A client answers ``no_worker`` at once for a queue nobody serves; tests that
    need messages to wait in a queue (depths, raw message sizes) beat for a
    worker that is not there. The beat lasts the alive window (a few seconds).
    """
    liveness.beat(client, keys, "stalled@tests", [queue], time.time())


@contextlib.contextmanager
def fleet_of(
    tools: str,
    env: dict[str, str],
    queue: str,
    concurrency: int,
    logs: Path,
    redis_url: str,
    key_prefix: str,
    count: int = 2,
) -> Iterator[list[WorkerProcess]]:
    """``count`` workers of ``tools`` (a module beside these tests) on ``queue``, stopped after."""
    here = str(Path(__file__).parent)
    env = {**env, "PYTHONPATH": os.pathsep.join([here, env.get("PYTHONPATH", "")])}
    procs = [
        WorkerProcess(
            tools, env, queues=queue, concurrency=concurrency, log_path=logs / f"w{i}.log"
        )
        for i in range(count)
    ]
    try:
        for proc in procs:
            proc.start(redis_url, key_prefix)
        yield procs
    finally:
        for proc in procs:
            proc.stop()
