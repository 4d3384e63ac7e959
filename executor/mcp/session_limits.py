"""How many MCP sessions ``toolexec mcp --http`` keeps open, and for how long idle.

Every streamable-HTTP session holds a transport, its streams and a server task
(37.6 KB, bench/mcp_sessions.py), and a client that opens sessions without closing them
would grow the front's memory for as long as it runs. So the front keeps at
most ``TOOLEXEC_MCP_MAX_SESSIONS`` and ends a session that has had no request
in flight for ``TOOLEXEC_MCP_SESSION_IDLE_S`` (a request being served, or an
open GET stream, keeps it alive; its id then answers 404 and the client opens
a new one, as the protocol says). A client that would open one more while the
table is full gets a refusal it can read: HTTP 503 with ``Retry-After`` and a
JSON-RPC error whose ``data.type`` is ``too_many_sessions``.

:class:`SessionTable` decides (pure, time given by the caller); the ASGI
:class:`SessionGate` around the SDK's app does the I/O, reading time from an
injected :class:`~toolexec.clock.Clock`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolexec.clock import Clock
from toolexec.mcp.priming import NegotiatedVersion, with_version

__all__ = ["TOO_MANY_SESSIONS", "SessionGate", "SessionTable", "refusal_body"]

log = logging.getLogger("toolexec.mcp")

#: ``data.type`` of the refusal a client gets while the table is full.
TOO_MANY_SESSIONS = "too_many_sessions"

#: JSON-RPC's generic server error: the request was fine, the server cannot take it now.
_SERVER_ERROR = -32000

#: The longest wait between two looks for idle sessions, whatever the idle time.
_MAX_SWEEP_S = 30.0


@dataclass
class _Session:
    last_seen: float
    in_flight: int = 0
    #: the protocol version the session's initialize negotiated, when it was read
    version: str | None = None


class SessionTable:
    """The open sessions, the ones being opened, and which are idle; decisions only."""

    def __init__(self, max_sessions: int, idle_s: float) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._open: dict[str, _Session] = {}
        self._opening = 0

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._open

    def full(self) -> bool:
        """Whether one more session would be over the limit (counting those being opened)."""
        return len(self._open) + self._opening >= self.max_sessions

    def opening(self) -> None:
        """A request that may open a session was let through; it holds a place until it ends."""
        self._opening += 1

    def opened(self, session_id: str | None, now: float, version: str | None = None) -> None:
        """That request's answer began with ``session_id`` (the session it opened), or it
        ended without one (None); the version may follow (:meth:`negotiated`)."""
        self._opening = max(0, self._opening - 1)
        if session_id is not None:
            self._open[session_id] = _Session(last_seen=now, version=version)

    def negotiated(self, session_id: str, version: str) -> None:
        """``session_id``'s initialize answer named ``version`` (read as it streamed)."""
        found = self._open.get(session_id)
        if found is not None:
            found.version = version

    def version(self, session_id: str) -> str | None:
        """The protocol version ``session_id`` negotiated, if the table read it."""
        found = self._open.get(session_id)
        return found.version if found is not None else None

    def began(self, session_id: str) -> bool:
        """A request of a known session started; False for a session not in the table."""
        found = self._open.get(session_id)
        if found is not None:
            found.in_flight += 1
        return found is not None

    def ended(self, session_id: str, now: float) -> None:
        found = self._open.get(session_id)
        if found is not None:
            found.in_flight = max(0, found.in_flight - 1)
            found.last_seen = now

    def closed(self, session_id: str) -> None:
        self._open.pop(session_id, None)

    def idle(self, now: float) -> list[str]:
        """Sessions with nothing in flight for ``idle_s`` or longer, oldest first."""
        quiet = [(s.last_seen, sid) for sid, s in self._open.items() if s.in_flight == 0]
        return [sid for seen, sid in sorted(quiet) if now - seen >= self.idle_s]

    def retry_after(self, now: float) -> float:
        """Seconds until the table has room at the earliest: the next idle session's end."""
        ends = [s.last_seen + self.idle_s for s in self._open.values() if s.in_flight == 0]
        return max(1.0, min(ends, default=now + self.idle_s) - now)


def refusal_body(table: SessionTable, retry_after: float) -> dict[str, Any]:
    """The JSON-RPC error a client gets while the table is full, written for whoever reads it."""
    return {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": _SERVER_ERROR,
            "message": (
                f"toolexec mcp holds {len(table)} sessions, its limit "
                f"(TOOLEXEC_MCP_MAX_SESSIONS={table.max_sessions}): try again in "
                f"{math.ceil(retry_after)} s, or end sessions you no longer use "
                "(DELETE /mcp with their Mcp-Session-Id)"
            ),
            "data": {
                "type": TOO_MANY_SESSIONS,
                "max_sessions": table.max_sessions,
                "retry_after_s": math.ceil(retry_after),
            },
        },
    }


def _unauthenticated(scope: Scope) -> bool:
    """Whether the bearer-auth middleware ran and found no valid token (no ``user``: no auth)."""
    user = scope.get("user")
    return user is not None and not getattr(user, "is_authenticated", False)


def _may_open_a_session(scope: Scope) -> bool:
    """A POST of the handshake era: the SDK's own routing (an ``Mcp-Protocol-Version`` of
    a sessionless protocol goes elsewhere), so requests that hold nothing are never refused.
    """
    version = _header(scope, MCP_PROTOCOL_VERSION_HEADER.encode("ascii"))
    return scope.get("method") == "POST" and (
        version is None or version in HANDSHAKE_PROTOCOL_VERSIONS
    )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class SessionGate:
    """ASGI app around the SDK's ``/mcp`` endpoint that applies the table.

    It sits inside the bearer-auth middleware, so only an authenticated request
    counts or is refused as one too many (an unauthenticated one gets its 401).

    ``end_session`` ends one session in the SDK (its id answers 404 from then
    on) and ``forget`` tells the front a session is gone.
    """

    def __init__(
        self,
        app: ASGIApp,
        table: SessionTable,
        clock: Clock,
        end_session: Callable[[str], Awaitable[None]],
        forget: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.app, self.table, self.clock = app, table, clock
        self.end_session, self.forget = end_session, forget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _unauthenticated(scope):
            await self.app(scope, receive, send)  # the SDK's auth answers 401, before any count
            return
        session_id = _header(scope, b"mcp-session-id")
        if session_id is None and _may_open_a_session(scope):
            await self._without_session(scope, receive, send)
        elif session_id is None:
            await self.app(scope, receive, send)
        elif self.table.began(session_id):
            await self._in_session(session_id, scope, receive, send)
        else:
            await self.app(scope, receive, send)  # unknown to the table: the SDK answers 404

    async def _without_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request that may open a session (an initialize): refused while the table is full."""
        if self.table.full():
            await self.expire_idle()
        if self.table.full():
            await self._refuse(send)
            return
        opened: list[str] = []
        answer = NegotiatedVersion()

        # The session and its version go into the table before the client can read them:
        # a client sends its next request as soon as it has the answer, which may be
        # before this request's own coroutine ends (a loaded CI run: the next request
        # met no session in the table and passed ungated and unprimed).
        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                found = _header({"headers": message.get("headers", ())}, b"mcp-session-id")
                if found is not None and not opened:
                    opened.append(found)
                    self.table.opened(found, self.clock.now())
            elif message["type"] == "http.response.body" and opened:
                answer.feed(message.get("body", b""))
                if answer.version is not None:
                    self.table.negotiated(opened[0], answer.version)
            await send(message)

        self.table.opening()
        try:
            await self.app(scope, receive, watch)
        finally:
            if not opened:  # no session came of it: it is no longer being opened either
                self.table.opened(None, self.clock.now())

    async def _in_session(
        self, session_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        status: list[int] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        scope = with_version(scope, self.table.version(session_id))
        try:
            await self.app(scope, receive, watch)
        finally:
            self.table.ended(session_id, self.clock.now())
        gone = status and (status[0] == 404 or (scope["method"] == "DELETE" and status[0] < 300))
        if gone:
            self.table.closed(session_id)
            self.forget(session_id)

    async def _refuse(self, send: Send) -> None:
        wait = self.table.retry_after(self.clock.now())
        body = json.dumps(refusal_body(self.table, wait)).encode()
        log.warning(
            "refusing a new MCP session: %d open, the limit (TOOLEXEC_MCP_MAX_SESSIONS)",
            len(self.table),
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(math.ceil(wait)).encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def expire_idle(self) -> list[str]:
        """End every session idle for too long; the ids ended."""
        expired = self.table.idle(self.clock.now())
        for session_id in expired:
            self.table.closed(session_id)
            self.forget(session_id)
            await self.end_session(session_id)
        if expired:
            log.info("ended %d idle MCP sessions (TOOLEXEC_MCP_SESSION_IDLE_S)", len(expired))
        return expired

    async def watch_idle(self) -> None:
        """Look for idle sessions for as long as the server runs."""
        every = min(self.table.idle_s / 4, _MAX_SWEEP_S)
        while True:
            await anyio.sleep(every)
            await self.expire_idle()
