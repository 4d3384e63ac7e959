"""Real ``toolexec mcp`` processes for the MCP tests, and calls through the official client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on {port}:\n{log.read_text()[-3000:]}")


@contextmanager
def mcp_http_process(env: dict[str, str], log: Path, *extra: str) -> Iterator[str]:
    """``toolexec mcp --http 127.0.0.1:PORT`` in a child process; yields its /mcp URL."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "mcp", "--http", f"127.0.0.1:{port}", *extra],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for_port(port, proc, log)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def stdio_params(env: dict[str, str]) -> StdioServerParameters:
    """``toolexec mcp`` over stdio, started by the client itself."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "toolexec", "mcp"], env={**os.environ, **env}
    )


def with_client(
    server: str | StdioServerParameters, body: Callable[[Client], Awaitable[T]], **options: Any
) -> T:
    """Run ``body`` with an official MCP client connected to ``server``."""

    async def main() -> T:
        async with Client(server, **options) as client:
            return await body(client)

    return anyio.run(main)
