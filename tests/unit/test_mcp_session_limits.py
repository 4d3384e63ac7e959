"""The MCP front's session table: its decisions, and the gate driven by a manual clock.

The gate wraps the SDK's endpoint; here a small ASGI app in its place opens a
session per handshake POST, so time and counts are exact. The same runs
against a real ``toolexec mcp`` in tests/security/test_mcp_sessions.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import pytest

from toolexec.clock import ManualClock
from toolexec.mcp.session_limits import TOO_MANY_SESSIONS, SessionGate, SessionTable


def test_the_table_is_full_at_its_limit_counting_sessions_being_opened() -> None:
    table = SessionTable(max_sessions=2, idle_s=60)
    table.opening()
    table.opened("a", now=0)
    table.opening()
    assert table.full()  # "b" is still being opened
    table.opened(None, now=1)  # ...and was refused by the SDK: no session
    assert not table.full()


def test_only_sessions_with_nothing_in_flight_go_idle_oldest_first() -> None:
    table = SessionTable(max_sessions=10, idle_s=60)
    for sid, at in (("old", 0), ("busy", 0), ("new", 50)):
        table.opening()
        table.opened(sid, now=at)
    assert table.began("busy") and not table.began("unknown")

    assert table.idle(now=59) == []
    assert table.idle(now=60) == ["old"]
    assert table.idle(now=200) == ["old", "new"]  # "busy" has a request in flight
    table.ended("busy", now=200)
    assert table.idle(now=259) == ["old", "new"] and "busy" in table.idle(now=260)


def test_retry_after_is_the_next_idle_end_and_at_least_a_second() -> None:
    table = SessionTable(max_sessions=2, idle_s=60)
    for sid, at in (("a", 0), ("b", 30)):
        table.opening()
        table.opened(sid, now=at)
    assert table.retry_after(now=10) == 50
    assert table.retry_after(now=59.9) == 1.0


class _Sessions:
    """Stands in for the SDK's endpoint: a handshake POST opens a session, DELETE ends one."""

    def __init__(self) -> None:
        self.open: set[str] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sid = dict(scope["headers"]).get(b"mcp-session-id", b"").decode()
        headers: list[tuple[bytes, bytes]] = []
        status = 200
        if not sid:
            sid = uuid.uuid4().hex
            self.open.add(sid)
            headers.append((b"mcp-session-id", sid.encode()))
        elif sid not in self.open:
            status = 404
        elif scope["method"] == "DELETE":
            self.open.discard(sid)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


async def _request(gate: SessionGate, method: str = "POST", sid: str | None = None) -> Any:
    headers = [(b"content-type", b"application/json")]
    if sid is not None:
        headers.append((b"mcp-session-id", sid.encode()))
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await gate(scope, receive, send)
    start = sent[0]
    found = dict(start["headers"]).get(b"mcp-session-id")
    return start["status"], dict(start["headers"]), sent[1]["body"], found and found.decode()


def test_the_gate_refuses_a_full_table_with_a_typed_error_and_ends_idle_sessions() -> None:
    clock = ManualClock(start=1000.0)
    inner = _Sessions()
    ended: list[str] = []

    async def end_session(sid: str) -> None:
        ended.append(sid)
        inner.open.discard(sid)

    gate = SessionGate(inner, SessionTable(2, idle_s=60), clock, end_session)

    async def scenario() -> None:
        first = await _request(gate)
        second = await _request(gate)
        status, headers, body, _ = await _request(gate)
        assert (first[0], second[0], status) == (200, 200, 503)
        assert headers[b"retry-after"] == b"60"
        assert json.loads(body)["error"]["data"]["type"] == TOO_MANY_SESSIONS

        clock.advance(30)
        assert (await _request(gate, sid=first[3]))[0] == 200  # the first is used again
        clock.advance(30)
        assert await gate.expire_idle() == [second[3]]
        assert (await _request(gate))[0] == 200  # room again
        assert (await _request(gate, method="DELETE", sid=first[3]))[0] == 200
        assert len(gate.table) == 1
        assert ended == [second[3]]

    anyio.run(scenario)


@pytest.mark.parametrize(
    ("method", "version"), [("GET", None), ("POST", "2026-07-28")], ids=["get", "sessionless"]
)
def test_requests_that_open_no_session_pass_a_full_table(method: str, version: str | None) -> None:
    gate = SessionGate(_Sessions(), SessionTable(1, idle_s=60), ManualClock(), _noop)

    async def scenario() -> int:
        await _request(gate)
        headers = [(b"mcp-protocol-version", version.encode())] if version else []
        scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers}
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await gate(scope, receive, send)
        return statuses[0]

    assert anyio.run(scenario) != 503


async def _noop(_: str) -> None:
    return None


def test_a_sessions_next_request_is_gated_while_its_opening_request_is_still_ending() -> None:
    """A client sends its next request once it has the initialize answer, which may be
    before the opening request's coroutine returns: that request is already the
    session's (counted, and primed by the negotiated version), not passed ungated."""
    answered, release = anyio.Event(), anyio.Event()
    seen: list[bytes | None] = []
    init = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25"}}

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        if b"mcp-session-id" not in headers:
            start = [(b"mcp-session-id", b"s1")]
            await send({"type": "http.response.start", "status": 200, "headers": start})
            await send({"type": "http.response.body", "body": json.dumps(init).encode()})
            answered.set()
            await release.wait()  # the SDK's coroutine has not returned yet
            return
        seen.append(headers.get(b"mcp-protocol-version"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = SessionGate(endpoint, SessionTable(4, idle_s=60), ManualClock(), _noop)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def ignore(message: dict[str, Any]) -> None:
        return None

    def scope(*extra: tuple[bytes, bytes]) -> dict[str, Any]:
        headers = [(b"content-type", b"application/json"), *extra]
        return {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}

    async def scenario() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(gate, scope(), receive, ignore)
            await answered.wait()
            later = scope((b"mcp-session-id", b"s1"), (b"mcp-protocol-version", b"2025-03-26"))
            await gate(later, receive, ignore)
            release.set()

    anyio.run(scenario)

    assert seen == [b"2025-11-25"]
    assert gate.table.version("s1") == "2025-11-25"
    assert len(gate.table) == 1
