"""Each worker process's MCP sessions: one per remote server, on a loop of its own.

The tool bodies run on the worker's pool; a session lives across calls on the
hub's event loop, so calls from any pool thread share one session per server.
A session is opened on first use and again after a transport failure, and a
server's ``tools/list_changed`` starts a refresh of its tools
(``toolexec.mcp.remote``). What a call reports is classified by
``toolexec.mcp.classify``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from toolexec.caller import Answer, Asker
from toolexec.errors import (
    InvalidArgumentsError,
    ToolConnectionError,
    ToolException,
    ToolTimeoutError,
    UnknownToolError,
)
from toolexec.mcp.classify import (
    HttpStatus,
    classify_mcp_error,
    remote_answer,
    remote_tool_error,
)
from toolexec.mcp.servers import RemoteServer

__all__ = ["Hub"]

log = logging.getLogger("toolexec.mcp")

T = TypeVar("T")

#: The HTTP status of a call's last response, noted by the transport's response hook.
#: The SDK sends each request from a task started in the caller's context, so the
#: hook sees the caller's box.
_HTTP_STATUS: contextvars.ContextVar[HttpStatus | None] = contextvars.ContextVar(
    "toolexec_mcp_http_status", default=None
)

#: Who answers the server's questions during the call running in this context.
_ASKER: contextvars.ContextVar[Asker | None] = contextvars.ContextVar(
    "toolexec_mcp_asker", default=None
)


def elicit_result(answer: Answer) -> types.ElicitResult:
    """The remote server's answer from the caller's: toolexec's own outcomes in MCP terms.

    ``refused`` (no caller that can answer: an SDK call, a client without the
    capability) and ``timeout`` (the call's deadline came) are a cancel, MCP's
    action for a question dismissed without a choice: the remote tool gets a
    definite answer at once. An error instead would come back as a failed call,
    which toolexec would retry, asking again a caller that cannot answer.
    """
    if answer.action in ("refused", "timeout", "cancel"):
        return types.ElicitResult(action="cancel")
    if answer.action == "accept":
        return types.ElicitResult(action="accept", content=answer.content or {})
    return types.ElicitResult(action="decline")


class _Session:
    """One MCP session to one server, held open by a task on the hub's loop.

    It declares elicitation: a question the server asks during a call goes to
    that call's caller (``toolexec.caller``), through whatever the call's body
    handed to :meth:`Hub.call`.
    """

    def __init__(self, server: RemoteServer, on_list_changed: Callable[[], None]) -> None:
        self.server = server
        self.client: Client | None = None
        self.tools: dict[str, types.Tool] = {}
        self._on_list_changed = on_list_changed
        self._stop: anyio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._askers: dict[int, Asker | None] = {}
        self._auth: httpx2.Auth | None = None

    def _auth_once(self) -> httpx2.Auth | None:
        """The server's OAuth, made once: a session opened again after a failure keeps its
        tokens and discovered metadata (and the fleet store's Redis client) instead of
        signing in anew."""
        if self._auth is None:
            self._auth = _auth(self.server)
        return self._auth

    @contextlib.contextmanager
    def asking(self, ask: Asker | None) -> Iterator[None]:
        """A call is in flight with ``ask`` for its caller's answers."""
        token = object()
        self._askers[id(token)] = ask
        try:
            yield
        finally:
            self._askers.pop(id(token), None)

    def _asker(self) -> Asker | None:
        """The asking call's asker: from the context, or the only call in flight.

        The SDK may run a server's request outside the context of the call it
        belongs to; with one call in flight there is no doubt, with more there is,
        and the question is refused rather than put to the wrong caller.
        """
        found = _ASKER.get()
        if found is not None:
            return found
        in_flight = list(self._askers.values())
        return in_flight[0] if len(in_flight) == 1 else None

    async def _elicit(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        ask = self._asker()
        if isinstance(params, types.ElicitRequestURLParams):
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message="toolexec forwards form questions only, not URL elicitation",
            )
        if ask is None:
            log.info(
                "MCP server %s asked a question outside a call, or one that could not be "
                "told whose of several calls in flight: answered cancel",
                self.server.name,
            )
            return types.ElicitResult(action="cancel")
        answer = await asyncio.to_thread(ask, params.message, params.requested_schema)
        return elicit_result(answer)

    def _target(self, http: httpx2.AsyncClient | None) -> Any:
        if self.server.url is not None:
            return streamable_http_client(self.server.url, http_client=http)
        command = self.server.command
        # env=None: the SDK's short list of safe variables (PATH, HOME, ...), so the
        # worker's settings and secrets stay out of a third-party server's process
        return StdioServerParameters(command=command[0], args=list(command[1:]), env=None)

    async def _messages(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._on_list_changed()

    async def client_now(self) -> Client:
        """The open session, opened now if there is none (the first call, or after a failure)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.client is None:
                await self._open()
            assert self.client is not None
            return self.client

    async def _open(self) -> None:
        ready: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._stop = anyio.Event()
        asyncio.get_running_loop().create_task(self._hold(ready, self._stop))
        failure = await asyncio.wait_for(ready, timeout=self.server.timeout)
        if failure is not None:
            raise failure

    async def _hold(self, ready: asyncio.Future[BaseException | None], stop: anyio.Event) -> None:
        held: Client | None = None
        http = (
            httpx2.AsyncClient(
                headers=dict(self.server.headers),
                timeout=httpx2.Timeout(30.0, read=300.0),
                event_hooks={"response": [_note_status]},
                auth=self._auth_once(),
            )
            if self.server.url is not None
            else None
        )
        try:
            async with contextlib.AsyncExitStack() as stack:
                if http is not None:
                    await stack.enter_async_context(http)
                held = await stack.enter_async_context(
                    Client(
                        self._target(http),
                        read_timeout_seconds=self.server.timeout,
                        message_handler=self._messages,
                        elicitation_callback=self._elicit,
                        cache=None,
                        mode="legacy",
                    )
                )
                self.client = held
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_result(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
            log.info("MCP session to %s ended: %s", self.server.name, exc)
        finally:
            if self.client is held:  # a newer session may have replaced this one already
                self.client = None

    def close(self) -> None:
        """Drop the session; the next call opens a new one."""
        self.client = None
        if self._stop is not None:
            self._stop.set()

    async def list_tools(self) -> dict[str, types.Tool]:
        client = await self.client_now()
        found: dict[str, types.Tool] = {}
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            found.update({tool.name: tool for tool in page.tools})
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = found
        return found


def _auth(server: RemoteServer) -> httpx2.Auth | None:
    """The OAuth flow of a server declared with ``oauth=`` (``toolexec.mcp.oauth``)."""
    if server.oauth is None or server.url is None:
        return None
    from toolexec.mcp.oauth import auth_for, fleet_store

    return auth_for(server.url, server.oauth, fleet_store(server.name, server.url, server.oauth))


async def _note_status(response: httpx2.Response) -> None:
    box = _HTTP_STATUS.get()
    if box is not None:
        box.status = response.status_code
        box.headers = dict(response.headers)


class Hub:
    """This process's MCP sessions, on an event loop of their own.

    The tool bodies run on the worker's pool; a session lives across calls on
    this loop, so calls from any pool thread share one session per server.
    """

    _instance: Hub | None = None
    _instance_pid: int | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, _Session] = {}
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="toolexec-mcp", daemon=True
        )
        self.thread.start()

    @classmethod
    def get(cls) -> Hub:
        """The hub of this process (a forked pool child makes its own)."""
        with cls._guard:
            if cls._instance is None or cls._instance_pid != os.getpid():
                cls._instance = cls()
                cls._instance_pid = os.getpid()
            return cls._instance

    def session(self, server: RemoteServer) -> _Session:
        found = self.sessions.get(server.name)
        if found is None:
            found = _Session(server, lambda: self._list_changed(server))
            self.sessions[server.name] = found
        return found

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _list_changed(self, server: RemoteServer) -> None:
        # imported here: registering builds on the sessions
        from toolexec.mcp.remote import refresh

        threading.Thread(
            target=refresh, args=(server,), name="toolexec-mcp-refresh", daemon=True
        ).start()

    async def call(
        self,
        server: RemoteServer,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        ask: Asker | None = None,
    ) -> Any:
        """One call of ``tool``; ``ask`` answers the server's questions during it
        (``toolexec.caller.asker``; None: they are refused)."""
        session = self.session(server)
        http = HttpStatus()
        _HTTP_STATUS.set(http)
        _ASKER.set(ask)
        try:
            client = await session.client_now()
            with session.asking(ask):
                result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            raise await self._classified(session, tool, exc, http) from exc
        if result.is_error:
            raise remote_tool_error(result)
        return remote_answer(result)

    async def _classified(
        self, session: _Session, tool: str, exc: Exception, http: HttpStatus
    ) -> ToolException:
        failure = classify_mcp_error(
            exc, http, listed=True, url=session.server.url or "stdio", now=time.time()
        )
        if failure.error_type in (UnknownToolError.error_type, InvalidArgumentsError.error_type):
            with contextlib.suppress(Exception):
                listed = tool in await session.list_tools()
                failure = classify_mcp_error(
                    exc, http, listed=listed, url=session.server.url or "stdio", now=time.time()
                )
        elif isinstance(failure, ToolConnectionError | ToolTimeoutError):
            session.close()  # a broken session is opened anew by the next attempt
        return failure
