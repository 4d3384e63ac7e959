"""What the MCP front adds to a call: ``toolexec mcp`` vs a direct ``ToolClient.call``.

One worker runs ``bench_noop`` (a no-op, so a call's whole round trip is
overhead). The same call is made directly with ``ToolClient.call`` (the
baseline) and through real ``toolexec mcp`` processes with the official MCP
client: streamable HTTP with the run guard (the default), streamable HTTP
without it (``TOOLEXEC_MCP_GUARD=false``) and stdio with it. The contenders
alternate call by call, the order reversed every other round, so machine noise
hits all of them; the report gives p50 and p95 and the p50 each front adds.

Usage: ``python bench/mcp_front.py [--calls N] [--quick] [--redis-url URL]``. It
exits 0 whatever the figures, and non-zero when a call fails. (Not ``bench/mcp.py``:
with bench/ first on ``sys.path``, that name would shadow the MCP SDK itself.)
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
from _common import (
    Row,
    forget,
    machine_info,
    percentile,
    print_report,
    progress,
    redis_server,
    require,
    run_settings,
    worker,
)
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from toolexec.client import ToolClient
from toolexec.settings import Settings

CALL_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _front_env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
        **extra,
    }


@contextmanager
def front_process(
    settings: Settings, log: Path, timeout: float = 30, **extra: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``toolexec mcp --http`` process on loopback; yields its URL and process once it listens."""
    port = _free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "mcp", "--http", f"127.0.0.1:{port}"],
            env=_front_env(settings, **extra),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            require(proc.poll() is None, f"toolexec mcp exited: {log.read_text()[-2000:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def http_front(settings: Settings, log: Path, **extra: str) -> Iterator[str]:
    """A ``toolexec mcp --http`` process on loopback; yields its URL once it listens."""
    with front_process(settings, log, **extra) as (url, _):
        yield url


Contender = Callable[[], Awaitable[float]]


def _direct(client: ToolClient) -> Contender:
    async def call() -> float:
        start = time.perf_counter()
        result = client.call("bench_noop", {}, timeout=CALL_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        require(result.ok, f"direct call failed: {result.content()}")
        return elapsed

    return call


def _through(mcp: Client) -> Contender:
    """Calls through a front; each call is a run of its own, since the guard would (rightly)
    disable a tool called with the same arguments over and over in one run."""

    async def call() -> float:
        meta: Any = {"toolexec/run_id": f"bench-{uuid.uuid4().hex}"}
        start = time.perf_counter()
        result = await mcp.call_tool("bench_noop", {}, meta=meta)
        elapsed = time.perf_counter() - start
        require(not result.is_error, f"MCP call failed: {result.content}")
        return elapsed

    return call


async def _measure(contenders: dict[str, Contender], calls: int) -> dict[str, list[float]]:
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(calls):
        for name in names if index % 2 == 0 else reversed(names):
            samples[name].append(await contenders[name]())
        if index and index % 50 == 0:
            progress(f"  {index}/{calls} rounds")
    return samples


async def _run(settings: Settings, urls: dict[str, str], calls: int) -> dict[str, list[float]]:
    stdio = StdioServerParameters(
        command=sys.executable, args=["-m", "toolexec", "mcp"], env=_front_env(settings)
    )
    with ToolClient(settings) as direct:
        async with AsyncExitStack() as stack:
            contenders: dict[str, Contender] = {"direct ToolClient.call": _direct(direct)}
            for name, url in urls.items():
                contenders[name] = _through(await stack.enter_async_context(Client(url)))
            legacy = Client(urls["MCP HTTP, no guard"], mode="legacy")
            contenders["MCP HTTP, no guard, 2025 handshake"] = _through(
                await stack.enter_async_context(legacy)
            )
            contenders["MCP stdio, run guard"] = _through(
                await stack.enter_async_context(Client(stdio))
            )
            progress("warming up")
            await _measure(contenders, 10)
            progress(f"measuring {calls} interleaved rounds")
            return await _measure(contenders, calls)


def _rows(samples: dict[str, list[float]]) -> tuple[list[Row], list[str]]:
    base_name = "direct ToolClient.call"
    base = samples[base_name]
    rows: list[Row] = []
    notes = []
    for name, values in samples.items():
        if name == base_name:
            continue
        for q in (50, 95):
            b, t = percentile(base, q) * 1000, percentile(values, q) * 1000
            rows.append(Row(name, f"p{q} ms", f"{b:.2f}", f"{t:.2f}", t / b, "-", None))
        added = (percentile(values, 50) - percentile(base, 50)) * 1000
        notes.append(f"{name}: adds {added:.2f} ms at p50 over a direct ToolClient.call")
    return rows, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="rounds (one call per contender)")
    parser.add_argument("--quick", action="store_true", help="30 rounds: a smoke run")
    parser.add_argument("--redis-url", default=None, help="an existing Redis (default: embedded)")
    args = parser.parse_args()
    calls = 30 if args.quick else args.calls
    with redis_server(args.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        settings = run_settings(server.url, data_dir)
        try:
            with (
                worker(
                    settings,
                    "bench_tools",
                    concurrency=4,
                    pool="threads",
                    log_path=data_dir / "worker.log",
                ),
                http_front(settings, data_dir / "guarded.log") as guarded,
                http_front(settings, data_dir / "bare.log", TOOLEXEC_MCP_GUARD="false") as bare,
            ):
                urls = {"MCP HTTP, run guard": guarded, "MCP HTTP, no guard": bare}
                samples = anyio.run(_run, settings, urls, calls)
        finally:
            forget(server.url, settings)
        rows, notes = _rows(samples)
        notes.append(
            "baseline column: the direct call's figure from the same run; each front is a "
            "separate `toolexec mcp` process driven by the official `mcp` client"
        )
        print_report(
            f"MCP front overhead ({calls} interleaved rounds, no-op tool)",
            rows,
            machine_info(server.url),
            notes,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
