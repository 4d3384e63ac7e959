"""The Procfile really runs: honcho starts Valkey, two workers and Flower, and a call goes through.

Given the repository's Procfile and an environment that points it at free
loopback ports, when honcho starts it (two workers, as ``--scale`` would),
then both workers come up under distinct names, Flower answers behind basic
auth, a tool call succeeds through them, and stopping honcho stops them all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_support import REPO, free_port, wait_until

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

HONCHO = Path(sys.executable).with_name("honcho")
if not HONCHO.exists():
    pytest.skip("honcho is not installed: pip install -e '.[dev]'", allow_module_level=True)


def _flower_workers(api: str) -> list[str]:
    request = urllib.request.Request(api)
    request.add_header("Authorization", "Basic " + b64encode(b"ops:procfile-pw").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return list(json.loads(response.read()))


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Honcho:
    """``honcho start`` on the repository's Procfile, with its output kept."""

    def __init__(self, tmp: Path) -> None:
        self.valkey_port, self.flower_port = free_port(), free_port()
        self.prefix = "procfile"
        self.url = f"redis://127.0.0.1:{self.valkey_port}/0"
        self.log = tmp / "honcho.log"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")},
            "PATH": f"{HONCHO.parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
            "VALKEY_PORT": str(self.valkey_port),
            "VALKEY_DIR": str(tmp / "valkey"),
            "FLOWER_PORT": str(self.flower_port),
            "TOOLEXEC_TOOLS": "ops_tools",
            "TOOLEXEC_KEY_PREFIX": self.prefix,
            "TOOLEXEC_DATA_DIR": str(tmp / "data"),
            "TOOLEXEC_FLOWER_USER": "ops",
            "TOOLEXEC_FLOWER_PASSWORD": "procfile-pw",
        }
        shutil.copy(REPO / "Procfile", tmp / "Procfile")
        self.cwd = tmp
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(HONCHO), "start", "-f", "Procfile", "-c", "worker=2", "--no-prefix"],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def workers(self) -> list[str]:
        try:
            client = redis_client(self.url)
            try:
                names: list[str] = client.zrange(Keys(self.prefix).workers(), 0, -1)  # type: ignore[assignment]
            finally:
                client.close()
        except Exception:
            return []
        return names

    def stop(self) -> int:
        """SIGINT, as Ctrl-C would; honcho passes SIGTERM on and waits for its processes."""
        assert self.process is not None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def honcho(tmp_path: Path) -> Iterator[Honcho]:
    runner = Honcho(tmp_path)
    runner.start()
    try:
        yield runner
    finally:
        if runner.process is not None and runner.process.poll() is None:
            runner.stop()


def _instances(names: list[str]) -> set[str]:
    """The workers honcho started, however many processes each runs (``name.pN@host``)."""
    return {re.sub(r"\.p\d+(?=@)", "", name) for name in names}


def test_honcho_runs_the_procfile_and_a_call_goes_through(honcho: Honcho) -> None:
    # Given honcho running the Procfile with two workers
    try:
        names = wait_until(
            lambda: len(_instances(honcho.workers())) >= 2 and honcho.workers(), 60, "2 workers"
        )
    except AssertionError:
        pytest.fail(f"the workers did not come up; honcho's output:\n{honcho.tail()}")
    # Then each worker has its own name (and its processes theirs: name.p1@host, name.p2@host)
    assert len(_instances(names)) == 2, names
    # and Flower answers on its port, behind basic auth, and sees both workers
    wait_until(lambda: _listening(honcho.flower_port), 30, "Flower to listen")
    api = f"http://127.0.0.1:{honcho.flower_port}/api/workers?refresh=1"
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(api, timeout=10)
    seen = wait_until(lambda: set(names) <= set(_flower_workers(api)), 30, "Flower's workers")
    assert seen
    # When a tool is called through them
    settings = Settings(redis_url=honcho.url, key_prefix=honcho.prefix, data_dir=honcho.cwd)
    with ToolClient(settings) as client:
        result = client.call("greet", {"name": "procfile"}, timeout=20)
    # Then it succeeds
    assert result.ok and result.data == "hello procfile", result
    # When honcho is stopped, then every process it started has stopped
    honcho.stop()
    start = time.monotonic()
    wait_until(
        lambda: not _listening(honcho.valkey_port) and not _listening(honcho.flower_port),
        10,
        "Valkey and Flower to close their ports",
    )
    assert time.monotonic() - start < 10
    assert "procfile-pw" not in honcho.tail()
