"""Issue 22, item 12: the MCP front's session table is bounded in number and idle time.

Before: every session of ``toolexec mcp --http`` (about 37 KB: transport,
streams, server task) stayed until its client ended it, and the front took
sessions up to the SDK's default of 10 000, for half an hour each, answering
the next with an untyped 503. Now ``TOOLEXEC_MCP_MAX_SESSIONS`` caps them, a
client past the cap gets a refusal it can read (503, ``Retry-After``,
``data.type == "too_many_sessions"``), and a session idle for
``TOOLEXEC_MCP_SESSION_IDLE_S`` is ended (its id answers 404), which makes room.
The official MCP SDK client, in the handshake mode that opens sessions (the
sessionless protocol holds nothing between requests), talks to a real front on
loopback.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from ops_support import free_port, wait_until

from toolexec.mcp.session_limits import TOO_MANY_SESSIONS

pytestmark = pytest.mark.integration

MAX_SESSIONS = 2
IDLE_S = 2.0

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "session-test", "version": "1"},
    },
}


@pytest.fixture(scope="module")
def front(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """``toolexec mcp --http`` on loopback with a table of two sessions and a short idle time."""
    port = free_port()
    log = tmp_path_factory.mktemp("mcp-sessions") / "mcp.log"
    env = {
        **os.environ,
        **worker_env,
        "TOOLEXEC_MCP_MAX_SESSIONS": str(MAX_SESSIONS),
        "TOOLEXEC_MCP_SESSION_IDLE_S": str(IDLE_S),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "mcp", "--http", f"127.0.0.1:{port}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: proc.poll() is not None or _answers(port), 60, "the MCP front")
        assert proc.poll() is None, log.read_text()[-3000:]
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code > 0
    except httpx.HTTPError:
        return False


def _open_raw(url: str) -> httpx.Response:
    """An ``initialize`` that leaves its session open and idle (no GET stream, no DELETE)."""
    return httpx.post(url, json=INITIALIZE, headers=HEADERS, timeout=10)


def _ended(url: str, session_id: str) -> bool:
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"}
    return httpx.post(url, json=ping, headers=headers, timeout=10).status_code == 404


def _first_mcp_error(group: BaseExceptionGroup[Any]) -> MCPError:
    for exc in group.exceptions:
        if isinstance(exc, MCPError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            return _first_mcp_error(exc)
    raise AssertionError(f"no MCPError in {group!r}")


def test_a_full_table_refuses_the_next_client_in_a_way_it_can_read(front: tuple[str, Path]) -> None:
    """Given two SDK clients holding the two sessions, then a third SDK client's connect
    fails with MCPError data.type too_many_sessions (and plain HTTP sees 503 with
    Retry-After), and once one client leaves, a new one gets in."""

    async def scenario() -> tuple[Any, list[str]]:
        async with contextlib.AsyncExitStack() as held:
            first = await held.enter_async_context(Client(url, mode="legacy"))
            async with Client(url, mode="legacy") as second:
                await second.list_tools()
                refusal: Any = None
                try:
                    async with Client(url, mode="legacy"):
                        pass
                except* MCPError as group:  # raised from the client's task groups
                    refusal = _first_mcp_error(group).error
                raw = await anyio.to_thread.run_sync(_open_raw, url)
            async with Client(url, mode="legacy") as after:  # the second left: room for one
                names = [tool.name for tool in (await after.list_tools()).tools]
            await first.list_tools()
        return (refusal, raw), names

    url = front[0]
    (refusal, raw), names = anyio.run(scenario)

    assert refusal is not None, "the third client was let in"
    assert refusal.data["type"] == TOO_MANY_SESSIONS, refusal
    assert "TOOLEXEC_MCP_MAX_SESSIONS" in refusal.message
    assert raw.status_code == 503 and int(raw.headers["retry-after"]) >= 1
    assert raw.json()["error"]["data"]["max_sessions"] == MAX_SESSIONS
    assert names  # the client let in afterwards is served


def test_an_idle_session_is_ended_and_makes_room(front: tuple[str, Path]) -> None:
    """Given sessions opened and left alone (no request touches them: a request would
    keep them alive), then the front ends them once idle for TOOLEXEC_MCP_SESSION_IDLE_S,
    their ids answer 404, and new sessions are let in again."""
    url, log = front
    opened = [_open_raw(url) for _ in range(MAX_SESSIONS)]
    ids = [response.headers.get("mcp-session-id") for response in opened]
    assert all(r.status_code == 200 for r in opened) and all(ids), [r.text for r in opened]
    assert _open_raw(url).status_code == 503  # full while they are fresh

    def swept() -> bool:
        text = log.read_text()
        return "idle MCP session" in text and all(f"session: {sid}" in text for sid in ids)

    wait_until(swept, 10 * IDLE_S, "the sweep to end both sessions")

    assert all(_ended(url, sid) for sid in ids)
    assert _open_raw(url).status_code == 200
