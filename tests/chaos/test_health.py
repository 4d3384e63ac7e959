"""``toolexec health`` against real workers: a frozen consumer fails it, a Redis outage does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from rigs.chaos import Rig, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(120)]


def _health(built: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolexec", "health", *args],
        env={**os.environ, **built.env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_health_fails_for_a_stalled_worker_and_only_for_it(
    make_rig: Callable[..., AbstractContextManager[Rig]],
) -> None:
    with make_rig(workers=1) as built:
        assert _health(built).returncode == 0
        worker = built.workers[0]
        assert worker.process is not None
        os.killpg(worker.process.pid, signal.SIGSTOP)  # alive, but its loop polls no more
        try:
            assert wait_until(lambda: _health(built, "--stall", "2").returncode == 1, 30)
            assert "has not polled" in _health(built, "--stall", "2").stdout
        finally:
            os.killpg(worker.process.pid, signal.SIGCONT)
        assert wait_until(lambda: _health(built, "--stall", "2").returncode == 0, 30)

        built.servers[0].kill()  # the broker is down: waiting is right, a restart would not help
        try:
            assert _health(built, "--stall", "2").returncode == 0
        finally:
            built.servers[0].start()

        worker.stop()
        result = _health(built)
        assert result.returncode == 1
        assert "no running worker" in result.stdout
