"""Issue 18, item 4: unbounded sizes and downloads that never end.

Before: a 300 MB tool result was stored; http_request read whole bodies (200 MB
became a Redis payload kept for an hour); a server sending 1 KB every 5 s never
tripped the per-read timeout; and timed-out attempts left threads and sockets
downloading (4 calls left 8 of each open 60 s later). Each test runs a real
worker against a loopback server that misbehaves on purpose and counts what it
sent and which connections are still open.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostile_input_support import SEND_BUFFER, HostileHTTPServer, eventually, isolated_worker

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

RESULT_LIMIT = 2_000_000
RESPONSE_LIMIT = 1_000_000


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileHTTPServer]:
    with HostileHTTPServer(drip_s=0.5) as server:
        yield server


@pytest.fixture(scope="module")
def limited(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, ToolClient]]:
    with isolated_worker(
        settings,
        worker_env,
        tmp_path_factory.mktemp("sizes"),
        TOOLEXEC_PAYLOAD_MAX_BYTES=str(RESULT_LIMIT),
        TOOLEXEC_HTTP_MAX_RESPONSE_BYTES=str(RESPONSE_LIMIT),
    ) as pair:
        yield pair


def _payload_keys(client: ToolClient) -> set[str]:
    return set(client.redis.scan_iter(f"{client.keys.prefix}:payload:*"))


def _error(result: object) -> str | None:
    error = getattr(result, "error", None)
    return None if error is None else str(error.type)


def test_a_result_past_the_settings_limit_is_refused_and_not_stored(
    limited: tuple[WorkerProcess, ToolClient],
) -> None:
    _, client = limited
    before = _payload_keys(client)

    result = client.call("hi_big", {"megabytes": 3}, timeout=30)

    assert _error(result) == ErrorType.RESULT_TOO_LARGE
    assert result.error is not None and f"{RESULT_LIMIT:,}" in result.error.message
    assert _payload_keys(client) == before


def test_a_result_past_the_tools_own_limit_is_refused(
    limited: tuple[WorkerProcess, ToolClient],
) -> None:
    _, client = limited

    small = client.call("hi_capped", {"kilobytes": 100}, timeout=30)
    large = client.call("hi_capped", {"kilobytes": 300}, timeout=30)

    assert small.status == "ok" and small.payload is not None  # stored, under its limit
    assert _error(large) == ErrorType.RESULT_TOO_LARGE


@pytest.mark.parametrize("path", ["/huge", "/declared"])
def test_http_request_stops_downloading_at_the_response_limit(
    limited: tuple[WorkerProcess, ToolClient], hostile: HostileHTTPServer, path: str
) -> None:
    """Before: a 200 MB body was read whole and stored for an hour."""
    _, client = limited
    unique = f"{path}?{uuid.uuid4().hex}"
    before = _payload_keys(client)

    result = client.call("http_request", {"url": hostile.url + unique}, timeout=30)

    assert _error(result) == ErrorType.RESULT_TOO_LARGE
    assert result.attempts == 1  # permanent: asking again gets the same body
    assert _payload_keys(client) == before
    assert eventually(lambda: hostile.open == 0)
    # The server could write at most the limit plus what the socket buffers hold: its own
    # (SEND_BUFFER, doubled by the kernel) and the client's receive buffer (the kernel's
    # default, which autotuning may grow while the body is read: twice that allowed).
    # Measured: /huge 1.18 MB, /declared 0.26 MB (its body is never read).
    buffers = 2 * SEND_BUFFER + 2 * 2 * _receive_buffer_default()
    assert hostile.sent.get(unique, 0) <= RESPONSE_LIMIT + buffers, (hostile.sent, buffers)


def _receive_buffer_default() -> int:
    """A TCP socket's receive buffer before autotuning (Linux: tcp_rmem's middle value)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 131_072  # Linux's default


def test_a_dripping_server_cannot_outlast_the_total_time_limit(
    limited: tuple[WorkerProcess, ToolClient], hostile: HostileHTTPServer
) -> None:
    """Before: 1 KB every 5 s never tripped the per-read timeout; the download went on."""
    _, client = limited
    url = f"{hostile.url}/drip?{uuid.uuid4().hex}"
    start = time.monotonic()

    result = client.call("http_request", {"url": url, "timeout": 1.5}, timeout=60)

    elapsed = time.monotonic() - start
    assert _error(result) == ErrorType.TIMEOUT, (result, elapsed)
    assert result.attempts == 3
    assert elapsed < 3 * 1.5 + 8  # three bounded attempts and their backoff, not for ever
    assert eventually(lambda: hostile.open == 0, timeout=5)


def _threads(proc: WorkerProcess) -> int:
    assert proc.process is not None
    return len(os.listdir(f"/proc/{proc.process.pid}/task"))


def _eight_at_once(client: ToolClient, flaky: FlakyServer) -> None:
    """Eight calls whose answers wait until all eight requests are in: eight bodies at once.

    So the worker holds eight body threads at the same time, however the machine schedules
    the calls: enough for any four drip calls after it, if their bodies came back.
    """
    together = threading.Barrier(8, timeout=30)

    def answer() -> dict[str, bool]:
        together.wait()
        return {"ok": True}

    url = flaky.script(flaky.unique_path("eight"), Reply(200, answer))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: client.call("http_request", {"url": url}), range(8)))
    assert {r.status for r in results} == {"ok"}, results


def test_timed_out_attempts_leave_no_thread_or_socket_downloading(
    limited: tuple[WorkerProcess, ToolClient], hostile: HostileHTTPServer, flaky: FlakyServer
) -> None:
    """Before: 4 calls past their deadline left 8 threads and 8 sockets open 60 s later.

    Body threads are kept for reuse (pipeline/runner.py), so the count is taken after eight
    bodies ran at once, and checked after eight more: a drip body still downloading would
    hold a thread, and the second eight would need a new one. (A first eight that merely
    overlapped, without the barrier, left the baseline short of four: CI saw 13 against 11.)
    """
    proc, client = limited
    _eight_at_once(client, flaky)  # every body and resolver thread exists from here on
    baseline = _threads(proc)
    urls = [f"{hostile.url}/drip?{uuid.uuid4().hex}" for _ in range(4)]

    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda u: client.call("http_request", {"url": u, "timeout": 60}, timeout=1.5),
                urls,
            )
        )

    assert {_error(r) for r in results} == {ErrorType.DEADLINE_EXCEEDED}
    assert eventually(lambda: hostile.open == 0, timeout=5), f"{hostile.open} still open"
    assert eventually(lambda: _threads(proc) <= baseline, timeout=5), (
        f"{_threads(proc)} threads, {baseline} before"
    )
    _eight_at_once(client, flaky)
    assert _threads(proc) <= baseline, f"{_threads(proc)} threads, {baseline} before"
