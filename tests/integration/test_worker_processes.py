"""``toolexec worker`` with ``TOOLEXEC_WORKER_PROCESSES=2``: two worker processes share the
queue, are listed, and one that is killed is started again while the other goes on serving.

The setting, not ``--processes``, asks for the two here: each process is itself started
with ``--processes 1``, so the flag's path (and that it wins over the setting) runs too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rigs.chaos import wait_until

from toolexec.client import ToolClient
from toolexec.keys import Keys
from toolexec.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOOLS = '''
import os
import time

from toolexec import tool

@tool(queue="proctools")
def whose(pause: float) -> int:
    """The pid of the worker process that ran the call, after a pause."""
    time.sleep(pause)
    return os.getpid()
'''


@pytest.fixture
def two_processes(
    tmp_path: Path, settings: Settings, worker_env: dict[str, str]
) -> Iterator[tuple[list[str], Path]]:
    (tmp_path / "proctools.py").write_text(textwrap.dedent(TOOLS))
    name = f"procs-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "w.log"
    args = ["--tools", "proctools", "-P", "threads", "-c", "2"]
    args += ["-Q", "proctools", "-n", f"{name}@localhost"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "worker", *args],
            env={**os.environ, **worker_env, "TOOLEXEC_WORKER_PROCESSES": "2"},
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    names = [f"{name}.p1@localhost", f"{name}.p2@localhost"]
    state = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        ready = wait_until(
            lambda: all(state.zscore(Keys(settings.key_prefix).workers(), n) for n in names), 60
        )
        assert ready, log.read_text()[-3000:]
        yield names, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        state.close()


def _pids(client: ToolClient, calls: int) -> set[int]:
    results = client.call_many([("whose", {"pause": 0.3})] * calls, timeout=30)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return {int(r.data) for r in results}


def test_two_processes_serve_calls_are_listed_and_a_killed_one_comes_back(
    two_processes: tuple[list[str], Path], settings: Settings, worker_env: dict[str, str]
) -> None:
    names, log = two_processes
    assert "2 worker process(es), as configured" in log.read_text()

    with ToolClient(settings) as client:
        # 8 calls of 0.3 s on 2 + 2 slots: both processes take some
        first = _pids(client, 8)
        assert len(first) == 2, first

        status = subprocess.run(
            [sys.executable, "-m", "toolexec", "status", "--json"],
            env={**os.environ, **worker_env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        workers = {w["name"]: w.get("process") for w in json.loads(status.stdout)["workers"]}
        assert {workers.get(n) for n in names} == {"1/2", "2/2"}, workers

        killed = min(first)
        os.kill(killed, signal.SIGKILL)
        assert wait_until(lambda: "starting it again" in log.read_text(), 30), log.read_text()

        # the survivor serves meanwhile, and the process started again joins it
        seen: set[int] = set()
        assert wait_until(lambda: len(seen.__ior__(_pids(client, 8)) - first) >= 1, 60), seen
        assert killed not in seen
