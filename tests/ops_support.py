"""Helpers of the operations tests: Celery's own CLI, a real Flower, free ports.

Fixtures stay in conftest files; these are plain functions and one class so
that the integration and end-to-end modules share them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FINAL_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def celery(
    env: dict[str, str], *args: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``celery -A toolexec.worker.app ARGS`` as an operator would type it."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "toolexec.worker.app", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail saying ``what`` never happened."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class FlowerProcess:
    """A real Flower (``toolexec flower`` by default) on a loopback port, behind basic auth."""

    def __init__(
        self,
        env: dict[str, str],
        user: str,
        password: str,
        log_path: Path,
        command: Iterable[str] = ("-m", "toolexec", "flower"),
        cwd: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.user, self.password = user, password
        self.env = {
            **os.environ,
            **env,
            "TOOLEXEC_FLOWER_USER": user,
            "TOOLEXEC_FLOWER_PASSWORD": password,
        }
        self.args = [sys.executable, *command, f"--port={self.port}"]
        self.log_path = log_path
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, worker_hostname: str | None, timeout: float = 30) -> FlowerProcess:
        """Start, then wait for /healthcheck and for the worker to be listed (if one is named)."""
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.cwd,
            )
        try:
            wait_until(lambda: self._status("/healthcheck") == 200, timeout, "Flower to answer")
            if worker_hostname is None:
                return self
            wait_until(
                lambda: worker_hostname in self.api("/api/workers?refresh=1"),
                timeout,
                f"Flower to list worker {worker_hostname}",
                every=0.5,
            )
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"{exc}; Flower's log:\n{self.log()[-3000:]}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _request(self, path: str, auth: bool = True) -> urllib.request.Request:
        request = urllib.request.Request(self.url + path)
        if auth:
            token = b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        return request

    def _status(self, path: str, auth: bool = True) -> int:
        try:
            with urllib.request.urlopen(self._request(path, auth), timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def status_without_auth(self, path: str) -> int:
        return self._status(path, auth=False)

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self._request(path), timeout=10) as response:
            return json.loads(response.read())

    def task(self, task_id: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.api(f"/api/task/info/{task_id}")
        except urllib.error.HTTPError:
            return {}
        return found

    def wait_final(self, task_id: str, timeout: float = 30) -> dict[str, Any]:
        """Poll Flower's API until the task reaches a final state (docs/background.md, Flower)."""
        found: dict[str, Any] = wait_until(
            lambda: (info := self.task(task_id)).get("state") in FINAL_STATES and info,
            timeout,
            f"Flower to show task {task_id} in a final state",
            every=0.2,
        )
        return found

    def stop(self, timeout: float = 10) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
