"""What the hostile-input security tests share: a worker of their own, isolated.

It has its own key prefix and queue, so a setting it runs with (a low
Retry-After cap, a small result limit) cannot change what the suite's shared
worker does, and no call of the shared client lands on it.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

#: The hostile server's send buffer (the kernel doubles it for its bookkeeping).
SEND_BUFFER = 16_384


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``check()`` once it is truthy, or its last value after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not (found := check()) and time.monotonic() < end:
        time.sleep(0.05)
    return found


@contextmanager
def isolated_worker(
    settings: Settings,
    worker_env: dict[str, str],
    log_dir: Path,
    tools: str = "hostile_input_tools",
    **extra_env: str,
) -> Iterator[tuple[WorkerProcess, ToolClient]]:
    """A worker with ``extra_env`` (``TOOLEXEC_*`` names) and a client that reaches only it."""
    prefix = f"sec-{uuid.uuid4().hex[:8]}"
    queue = f"q-{prefix}"
    env = {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": prefix,
        "TOOLEXEC_DEFAULT_QUEUE": queue,
        **extra_env,
    }
    proc = WorkerProcess(tools, env, queues=queue, concurrency=8, log_path=log_dir / "worker.log")
    proc.start(settings.redis_url or "", prefix)
    own = settings.model_copy(update={"key_prefix": prefix, "default_queue": queue})
    try:
        with ToolClient(own) as client:
            yield proc, client
    finally:
        proc.stop()


class HostileHTTPServer:
    """A loopback HTTP server that answers slowly or endlessly, and counts what it sees.

    ``/drip``: a chunked body, 1 KB every ``drip_s`` seconds, for ever.
    ``/huge``: a chunked body as fast as the socket takes it, up to 1 GB.
    ``/declared``: ``Content-Length: 1 GB``, then the same body.
    ``open`` counts connections still being written to; ``sent`` the bytes of bodies.
    A connection ends when a write fails, i.e. once the client has closed it.
    """

    def __init__(self, drip_s: float = 0.5) -> None:
        import socketserver
        import threading

        self.drip_s = drip_s
        self.lock = threading.Lock()
        self.open = 0
        self.served = 0
        self.sent: dict[str, int] = {}
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                outer._serve(self)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HostileHTTPServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _serve(self, handler: Any) -> None:
        request_line = handler.rfile.readline().decode("latin-1")
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        path = request_line.split(" ")[1] if " " in request_line else "/"
        name = path.split("?")[0]
        with self.lock:
            self.open += 1
            self.served += 1
        try:
            # a small send buffer: what ``sent`` counts past the client's reads is then
            # what the client's receive buffer holds, not megabytes queued in this socket
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._body(handler.wfile, name, path)
        except OSError:
            pass  # the client went away: what the tests wait for
        finally:
            with self.lock:
                self.open -= 1

    def _body(self, out: Any, name: str, path: str) -> None:
        gigabyte = 1 << 30
        length = f"Content-Length: {gigabyte}\r\n" if name == "/declared" else ""
        framing = "" if length else "Transfer-Encoding: chunked\r\n"
        out.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{length}{framing}\r\n".encode())
        out.flush()
        chunk = b"z" * (1024 if name == "/drip" else 65_536)
        sent = 0
        deadline = time.monotonic() + 120
        while sent < gigabyte and time.monotonic() < deadline:
            out.write(chunk if length else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            out.flush()
            sent += len(chunk)
            with self.lock:
                self.sent[path] = sent
            if name == "/drip":
                time.sleep(self.drip_s)
