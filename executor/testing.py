"""Test helpers shipped with toolexec: a misbehaving HTTP service and real workers.

The demo, the test suite and the benchmarks drive the executor with the same
two pieces: :class:`FlakyServer`, a local HTTP service that answers each path
from a script (503 twice then 200, a 429 with Retry-After, a slow reply) and
records every hit; and :class:`WorkerProcess`, a real ``toolexec worker``
process that is ready once it has published its catalog.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from toolexec.connection import redis_client
from toolexec.keys import Keys

__all__ = ["FlakyServer", "Hit", "Ledger", "LocalStack", "Reply", "WorkerProcess", "local_stack"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a status, headers, a JSON body and a delay before it.

    ``body`` may be a function of nothing, called when the request arrives:
    an answer that depends on what the service has seen so far (a check of
    whether an earlier write landed).
    """

    status: int = 200
    body: Any = field(default_factory=lambda: {"ok": True})
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Hit:
    """One request the service received."""

    method: str
    path: str
    query: str
    at: float
    body: bytes
    #: Request headers, names lower-cased (``traceparent`` tells which trace called).
    headers: dict[str, str] = field(default_factory=dict)


class FlakyServer:
    """A local HTTP service that misbehaves on command.

    ``script(path, replies)`` queues answers for ``path``; once the queue is
    down to one reply, that reply repeats. Unscripted paths answer 200 with
    the path echoed back.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._scripts: dict[str, deque[Reply]] = {}
        self._hits: dict[str, list[Hit]] = defaultdict(list)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FlakyServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FlakyServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def script(self, path: str, *replies: Reply) -> str:
        """Answer ``path`` with ``replies`` in order; returns its full URL."""
        with self._lock:
            self._scripts[path] = deque(replies)
            self._hits.pop(path, None)
        return self.url + path

    def unique_path(self, name: str) -> str:
        """A fresh path, so tests sharing one server never see each other's hits."""
        return f"/{name}/{uuid.uuid4().hex[:12]}"

    def hits(self, path: str) -> list[Hit]:
        with self._lock:
            return list(self._hits.get(path, []))

    def _next(self, path: str) -> Reply:
        with self._lock:
            queue = self._scripts.get(path)
            if not queue:
                return Reply(body={"path": path})
            return queue.popleft() if len(queue) > 1 else queue[0]

    def _record(self, hit: Hit) -> None:
        with self._lock:
            self._hits[hit.path].append(hit)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                path, _, query = self.path.partition("?")
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                server._record(Hit(self.command, path, query, time.time(), body, headers))
                reply = server._next(path)
                if reply.delay:
                    time.sleep(reply.delay)
                body = reply.body() if callable(reply.body) else reply.body
                payload = json.dumps(body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                # The client may have given up (its own timeout): nothing to answer then.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


@dataclass(frozen=True)
class Ledger:
    """A path on a FlakyServer that counts writes per key and answers checks of them.

    A write is a POST to ``<url>/<key>``, recorded when it arrives (before any
    scripted delay), so the effect exists even if the writer never hears back;
    ``<url>/<key>/exists`` answers ``{"exists": ...}`` from the writes seen so
    far. Side-effecting tools and their checks are tested and measured on it.
    """

    server: FlakyServer
    path: str

    @classmethod
    def open(cls, server: FlakyServer) -> Ledger:
        return cls(server, server.unique_path("ledger"))

    @property
    def url(self) -> str:
        return self.server.url + self.path

    def entry(self, key: str, *writes: Reply) -> str:
        """Script how writes of ``key`` are answered (default: 200 at once); returns ``key``."""
        write_path = f"{self.path}/{key}"
        self.server.script(write_path, *(writes or (Reply(),)))
        self.server.script(
            f"{write_path}/exists", Reply(body=lambda: {"exists": bool(self.writes(key))})
        )
        return key

    def writes(self, key: str) -> list[Hit]:
        return [h for h in self.server.hits(f"{self.path}/{key}") if h.method == "POST"]

    def checks(self, key: str) -> list[Hit]:
        return self.server.hits(f"{self.path}/{key}/exists")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class WorkerProcess:
    """A real ``toolexec worker`` in a child process, ready when it has published."""

    def __init__(
        self,
        tools: str,
        env: dict[str, str],
        *,
        queues: str | None = None,
        concurrency: int = 8,
        pool: str = "threads",
        name: str | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name or f"w-{uuid.uuid4().hex[:8]}"
        self.hostname = f"{self.name}@localhost"
        self.env = {**os.environ, **env}
        self.args = [
            sys.executable,
            "-m",
            "toolexec",
            "worker",
            "--tools",
            tools,
            "-c",
            str(concurrency),
            "-P",
            pool,
            "-n",
            self.hostname,
            "--loglevel",
            "INFO",
        ]
        if queues:
            self.args += ["-Q", queues]
        self.log_path = log_path
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, redis_url: str, key_prefix: str = "toolexec", timeout: float = 30.0) -> None:
        out = self.log_path.open("wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            start_new_session=True,
            # Ctrl-C as a terminal's worker gets it, even under a runner that ignores SIGINT
            # (a shell's background job does, and children inherit that).
            preexec_fn=_default_sigint,
        )
        client = redis_client(redis_url)
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                if client.zscore(Keys(key_prefix).workers(), self.hostname) is not None:
                    return
                if self.process.poll() is not None:
                    break
                time.sleep(0.05)
        except BaseException:  # interrupted while waiting: the child is in a session of its own
            self.stop()
            raise
        finally:
            client.close()
        self.stop()
        log = self.log_path.read_text()[-3000:] if self.log_path else "(no log kept)"
        raise RuntimeError(f"worker {self.hostname} did not become ready:\n{log}")

    def kill(self) -> None:
        """SIGKILL, as an OOM killer or a crashed host would."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if not self.process or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass(frozen=True)
class LocalStack:
    """What :func:`local_stack` started: settings for a client, and the weather service."""

    settings: Any  # toolexec.settings.Settings; imported lazily with the rest
    service: FlakyServer


#: The demo's weather service, as :func:`local_stack` scripts it: Oslo fails once (a 503
#: the worker retries), then answers; any other city answers at once.
_WEATHER = {"temp_c": 4.0, "conditions": "light rain"}

#: Where the demo tools find their service (``toolexec.tasks.demo_tools.SERVICE_URL_ENV``;
#: not imported: that would import the worker's side into the caller).
_DEMO_SERVICE_URL_ENV = "TOOLEXEC_DEMO_SERVICE_URL"


@contextlib.contextmanager
def local_stack(tools: str = "toolexec.tasks.demo_tools") -> Iterator[LocalStack]:
    """Redis, a local weather service and a worker, for examples that run on a bare machine.

    Redis is ``TOOLEXEC_REDIS_URL`` or the embedded Valkey; everything runs under a
    key prefix and queue of its own, and is stopped on the way out. The service
    serves the demo tools (``get_weather``, ``query_order``): ``/weather/Oslo``
    answers 503 once, then 200, so a call shows a retry.
    """
    import shutil
    import tempfile

    from toolexec.embedded import ensure_embedded, stop_embedded
    from toolexec.settings import Settings

    base = Settings.from_env()
    data_dir = Path(tempfile.mkdtemp(prefix="toolexec-local-"))
    embedded = None if base.redis_url else ensure_embedded(data_dir)
    url = base.redis_url or (embedded.url if embedded else "")
    prefix = f"local-{uuid.uuid4().hex[:8]}"
    service = FlakyServer().start()
    service.script("/weather/Oslo", Reply(503), Reply(200, _WEATHER))
    env = {
        "TOOLEXEC_REDIS_URL": url,
        "TOOLEXEC_KEY_PREFIX": prefix,
        "TOOLEXEC_DEFAULT_QUEUE": prefix,
        "TOOLEXEC_TASK_EVENTS": "false",
        "TOOLEXEC_DATA_DIR": str(data_dir),
        "TOOLEXEC_HTTP_ALLOW": "127.0.0.1",
        _DEMO_SERVICE_URL_ENV: service.url,
    }
    worker = WorkerProcess(tools, env, concurrency=4, cwd=data_dir)
    settings = Settings.from_env(
        redis_url=url, key_prefix=prefix, default_queue=prefix, data_dir=data_dir, task_events=False
    )
    try:
        worker.start(url, prefix)
        yield LocalStack(settings, service)
    finally:
        worker.stop()
        service.stop()
        if embedded is not None and embedded.started_here:
            stop_embedded(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)  # the worker's and Valkey's files
