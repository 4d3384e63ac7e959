"""``toolexec mcp``: the tool catalog served to any MCP client, every call a toolexec call.

An MCP client (Claude, the OpenAI Agents SDK, pydantic-ai, an IDE) lists the
catalog the workers publish and calls tools; each ``tools/call`` goes through
:class:`~toolexec.client.ToolClient` like any other call, so validation,
breakers, retries, budgets, idempotent writes, fallbacks and offloaded results
all apply, and the answer is the same :class:`~toolexec.results.ToolResult`.
The translations are pure functions in ``toolexec.mcp.mapping``; this module
is the I/O around them: the SDK's low-level server, the run guard per session,
progress while a call waits, cancellation, and the transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
import redis
import redis.asyncio
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

from toolexec.client import ToolClient
from toolexec.client.prepare import PreparedCall
from toolexec.client.publish import publish
from toolexec.connection import async_redis_client, unavailable
from toolexec.errors import InfrastructureError, PayloadUnavailableError, UsageError
from toolexec.fairness import NO_LANE, Lane
from toolexec.guard import RoundPlan, RunGuard
from toolexec.keys import REPLY_TTL_S
from toolexec.layers.approvals import ApprovalStore, Decision
from toolexec.mcp.mapping import (
    READ_PAYLOAD,
    RESOURCE_NOT_FOUND,
    RUN_ID_HEADER,
    call_timeout,
    cancelled_result,
    catalog_fingerprint,
    checked_run_id,
    lane_for,
    payload_page_of,
    payload_template,
    read_payload_arguments,
    read_payload_tool,
    read_resource_result,
    resource_target,
    run_id_for,
    to_call_result,
    to_resource,
    to_template,
    to_tool,
)
from toolexec.mcp.relay import Relay, can_answer
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.replies import ReplyBox
from toolexec.stores.stats import running_attempt

__all__ = ["McpFront"]

log = logging.getLogger("toolexec.mcp")

Context = Any  # mcp.server.context.ServerRequestContext; generic over the lifespan state

#: Connections remembered for list_changed and their run ids; the oldest are forgotten.
_MAX_CONNECTIONS = 1024


class _FrontServer(Server[Any]):
    """The SDK's low-level server, announcing ``tools.listChanged`` on every transport.

    The streamable HTTP manager builds each session's options without arguments,
    so the capability has to be the default here rather than passed in.
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class McpFront:
    """Answers MCP requests with toolexec calls; one per ``toolexec mcp`` process."""

    def __init__(self, client: ToolClient, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or client.settings
        self._runs: dict[str, str] = {}
        self._sessions: OrderedDict[str, ServerSession] = OrderedDict()
        self._secret = uuid.uuid4().hex
        self._fingerprint: tuple[Any, ...] | None = None
        self._replies: redis.asyncio.Redis | None = None
        self._levels: dict[str, str] = {}
        self._subscriptions: dict[str, set[str]] = {}
        with warnings.catch_warnings():
            # logging/setLevel is deprecated for the 2026-07-28 protocol, still current before
            warnings.simplefilter("ignore")
            self.server = _FrontServer(
                "toolexec",
                version="0.1.0",
                instructions="Tools run by toolexec workers; results are typed ToolResults.",
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_list_resources=self._list_resources,
                on_list_resource_templates=self._list_templates,
                on_read_resource=self._read_resource,
                on_subscribe_resource=self._subscribe,
                on_unsubscribe_resource=self._unsubscribe,
                on_set_logging_level=self._set_level,
            )

    # -- sessions ------------------------------------------------------------

    def _run_of(self, ctx: Context) -> str:
        """The run id of the client connection: one agent conversation, guarded as one run.

        The SDK hands each request a session object of its own, so connections
        are told apart by their transport: the ``Mcp-Session-Id`` of streamable
        HTTP, or the single client of a stdio process. The run id is a hash of
        the session id, which authorises the session and must not reach logs.
        A stateless HTTP request has no connection, and its call is a run of its own.
        """
        request = ctx.request
        headers = getattr(request, "headers", None)
        session_id = headers.get("mcp-session-id") if headers is not None else None
        if request is not None and not session_id:
            return f"mcp-{uuid.uuid4().hex[:16]}"
        key = session_id or "stdio"
        run = self._runs.get(key)
        if run is None:
            digest = hashlib.sha256(f"{self._secret}:{key}".encode()).hexdigest()[:16]
            run = f"mcp-{digest}"
        # the latest session object of a connection: its notifications reach the connection
        self._runs[key] = run
        self._sessions[key] = ctx.session
        self._sessions.move_to_end(key)
        while len(self._sessions) > _MAX_CONNECTIONS:
            old, _ = self._sessions.popitem(last=False)
            self._runs.pop(old, None)
        return run

    def forget(self, session_id: str) -> None:
        """A session ended (idle, or closed by its client): no list_changed for it, no run id."""
        self._sessions.pop(session_id, None)
        self._runs.pop(session_id, None)
        self._levels.pop(session_id, None)
        self._subscriptions.pop(session_id, None)

    async def decide(self, call_id: str, decision: str, reason: str | None) -> None:
        """Record the client's answer to an approval question (``toolexec.layers.approvals``)."""
        store = ApprovalStore(self.client.redis, self.client.keys)
        verdict: Decision = "approved" if decision == "approved" else "denied"
        await asyncio.to_thread(store.decide, call_id, verdict, "mcp-client", reason)

    def level_of(self, ctx: Context) -> str | None:
        """The log level the client's session set (``logging/setLevel``), if it did."""
        return self._levels.get(_connection_key(ctx))

    async def watch_catalog(self) -> None:
        """Tell every session that listed tools when the catalog changes (``list_changed``).

        Sessions are known from their requests; a session of the 2026-07-28
        protocol receives change notifications only on a ``subscriptions/listen``
        stream, which this server does not serve, so only handshake-era sessions
        are told.
        """
        while True:
            await anyio.sleep(self.settings.mcp_catalog_poll_s)
            try:
                catalog = await asyncio.to_thread(self.client.catalog, True)
            except Exception as exc:  # the next poll tries again; serving goes on
                log.warning("could not read the catalog: %s", exc)
                continue
            fingerprint = catalog_fingerprint(catalog)
            if self._fingerprint is not None and fingerprint != self._fingerprint:
                await self._notify_changed()
            self._fingerprint = fingerprint

    async def watch_resources(self) -> None:
        """Send ``resources/updated`` to the sessions subscribed to a URI a tool said changed."""
        if self._replies is None:
            self._replies = async_redis_client(self.client.waiter.url)
        while True:
            try:
                async with self._replies.pubsub() as pubsub:
                    await pubsub.subscribe(self.client.keys.resource_updates())
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await self._resource_updated(_text_of(message.get("data")))
            except redis.RedisError as exc:  # listen again once Redis is back
                log.warning("resource updates unavailable: %s", exc)
                await anyio.sleep(self.settings.mcp_catalog_poll_s)

    async def _resource_updated(self, uri: str) -> None:
        for key, uris in list(self._subscriptions.items()):
            session = self._sessions.get(key)
            if uri not in uris or session is None:
                continue
            try:
                await session.send_resource_updated(uri)
            except Exception as exc:  # a closed connection: its subscriptions go with it
                log.debug("could not tell a session that %s changed: %s", uri, exc)
                self._subscriptions.pop(key, None)

    async def _notify_changed(self) -> None:
        for key, session in list(self._sessions.items()):
            try:
                await session.send_tool_list_changed()
            except Exception as exc:  # a closed connection: forget it
                log.debug("could not notify a session of the changed catalog: %s", exc)
                self._sessions.pop(key, None)
                self._runs.pop(key, None)

    # -- waiting for results ---------------------------------------------------

    async def reply_to(self, prepared: PreparedCall) -> ToolResult:
        """The call's result from its reply list, or the deadline's answer when none came.

        One asyncio Redis client serves every call of this front (a blocking pop
        takes a connection of its pool for the wait); a client per call would
        open a connection per call.
        """
        client = self.client
        if self._replies is None:
            self._replies = async_redis_client(client.waiter.url)
        box = ReplyBox(client.keys, prepared.ctx.reply_to, [prepared.ctx.call_id])
        wait = prepared.ctx.deadline + self.settings.reply_grace - client.clock.now()
        try:
            await box.acollect(self._replies, max(0.0, wait))
        except redis.RedisError as exc:
            raise unavailable(client.waiter.url, exc) from exc
        found = box.results.get(prepared.ctx.call_id)
        if found is not None:
            return found
        # nothing by the deadline: the client's own answer says whether workers are alive
        return (await asyncio.to_thread(client.waiter.collect, [prepared], 0.0))[0]

    # -- tools/list ------------------------------------------------------------

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._run_of(ctx)
        catalog = await asyncio.to_thread(self.client.catalog)
        if self._fingerprint is None:
            self._fingerprint = catalog_fingerprint(catalog)
        tools = [
            to_tool(name, entry)
            for name, entry in sorted(catalog.items())
            if "resource" not in entry
        ]
        tools = [t for t in tools if t.name != READ_PAYLOAD] + [read_payload_tool()]
        return types.ListToolsResult(tools=tools)

    # -- tools/call ------------------------------------------------------------

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == READ_PAYLOAD:
            return await self._read_payload(arguments)
        await self._known_tool(params.name)
        meta: Mapping[str, Any] | None = ctx.meta
        session_run = self._run_of(ctx)  # also remembers the session for list_changed
        run_id = run_id_for(meta, _header_run_id(ctx) or session_run)
        timeout = call_timeout(meta, self.settings.mcp_call_timeout)
        lane = lane_for(meta)
        if isinstance(lane, str):
            return _error_text(lane)
        guard = self.client.run_guard(run_id) if self.settings.mcp_guard else None
        call = _Call(self, ctx, params.name, arguments, run_id, timeout, guard)
        call.lane = lane
        return await call.run()

    async def _known_tool(self, name: str) -> None:
        """An unknown tool is a protocol error (JSON-RPC -32602), as MCP 2025-11-25 says.

        The catalog is read again before refusing: a worker may have just published it.
        """
        catalog = await asyncio.to_thread(self.client.catalog)
        if name not in catalog:
            catalog = await asyncio.to_thread(self.client.catalog, True)
        entry = catalog.get(name)
        if entry is None or "resource" in entry:
            known = ", ".join(sorted(n for n, e in catalog.items() if "resource" not in e))
            raise MCPError(
                types.INVALID_PARAMS,
                f"Unknown tool: {name}. The tools are: {known or 'none yet'}",
            )

    # -- resources and logging -------------------------------------------------

    async def _resource_entries(self) -> dict[str, Mapping[str, Any]]:
        catalog = await asyncio.to_thread(self.client.catalog)
        return {name: entry for name, entry in catalog.items() if "resource" in entry}

    async def _list_resources(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        entries = await self._resource_entries()
        found = [r for r in (to_resource(e) for e in entries.values()) if r is not None]
        return types.ListResourcesResult(resources=sorted(found, key=lambda r: r.uri))

    async def _list_templates(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        entries = await self._resource_entries()
        found = [t for t in (to_template(e) for e in entries.values()) if t is not None]
        return types.ListResourceTemplatesResult(
            resource_templates=[*sorted(found, key=lambda t: t.uri_template), payload_template()]
        )

    async def _read_resource(
        self, ctx: Context, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        """A resource read is a call of its reader on the workers, under the same defences."""
        uri = str(params.uri)
        page_of = payload_page_of(uri)
        if page_of is not None:
            return await self._read_payload_resource(uri, page_of)
        target = resource_target(await self._resource_entries(), uri)
        if target is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}")
        name, arguments, mime_type = target
        run_id = self._run_of(ctx)
        prepared = await asyncio.to_thread(
            self.client.preparer.prepare,
            name,
            arguments,
            run_id,
            self.settings.mcp_call_timeout,
            uuid.uuid4().hex,
            None,
        )
        if prepared.early is not None:
            result = prepared.early
        else:
            await asyncio.to_thread(publish, self.client.app, [prepared])
            result = await self.reply_to(prepared)
        if result.status != "ok":
            message = result.error.message if result.error else result.status
            raise MCPError(types.INTERNAL_ERROR, f"could not read {uri}: {message}")
        return read_resource_result(uri, mime_type, result.data)

    async def _read_payload_resource(
        self, uri: str, page_of: tuple[str, int, int] | str
    ) -> types.ReadResourceResult:
        """A page of a stored payload, as ``read_payload`` answers it (JSON)."""
        if isinstance(page_of, str):
            raise MCPError(types.INVALID_PARAMS, page_of)
        key, offset, limit = page_of
        try:
            page = await asyncio.to_thread(self.client.read_payload, key, offset, limit)
        except (PayloadUnavailableError, UsageError) as exc:
            raise MCPError(RESOURCE_NOT_FOUND, str(exc)) from exc
        text = json.dumps(page.to_json(), ensure_ascii=False, default=str)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
        )

    async def _subscribe(
        self, ctx: Context, params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        self._run_of(ctx)  # remembers the session: updates are sent on it
        self._subscriptions.setdefault(_connection_key(ctx), set()).add(str(params.uri))
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: Context, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        self._subscriptions.get(_connection_key(ctx), set()).discard(str(params.uri))
        return types.EmptyResult()

    async def _set_level(
        self, ctx: Context, params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        self._levels[_connection_key(ctx)] = params.level
        return types.EmptyResult()

    async def _read_payload(self, arguments: Mapping[str, Any]) -> types.CallToolResult:
        """A page of an offloaded result; the numbers come from a model, so they are checked."""
        page_of = read_payload_arguments(arguments)
        if isinstance(page_of, str):
            return _error_text(page_of)
        key, offset, limit = page_of
        try:
            page = await asyncio.to_thread(self.client.read_payload, key, offset, limit)
        except (PayloadUnavailableError, UsageError) as exc:
            return _error_text(str(exc))
        body = page.to_json()
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(body, ensure_ascii=False, default=str))],
            structured_content=body,
        )


class _Call:
    """One ``tools/call``: guard, submit, wait with progress, answer or cancel."""

    def __init__(
        self,
        front: McpFront,
        ctx: Context,
        tool: str,
        arguments: dict[str, Any],
        run_id: str,
        timeout: float,
        guard: RunGuard | None,
    ) -> None:
        self.front, self.ctx, self.tool, self.arguments = front, ctx, tool, arguments
        self.run_id, self.timeout, self.guard = run_id, timeout, guard
        self.call_id = uuid.uuid4().hex
        self.started = time.monotonic()
        self.lane = NO_LANE

    async def run(self) -> types.CallToolResult:
        plan = None
        if self.guard is not None:
            plan = await asyncio.to_thread(self._begin, self.guard)
            if 0 not in plan.to_run:
                return await self._finish(plan, None)
            if plan.timeout is not None:
                self.timeout = min(self.timeout, plan.timeout)
        try:
            result = await self._wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._cancelled(plan)
            raise
        except InfrastructureError as exc:
            # nothing ran: the round must not count against the model (as run_tool_calls does)
            if self.guard is not None and plan is not None:
                with contextlib.suppress(InfrastructureError):
                    await asyncio.to_thread(self.guard.abandon_round, plan)
            return _error_text(f"toolexec could not run the call: {exc}")
        return await self._finish(plan, result)

    def _begin(self, guard: RunGuard) -> RoundPlan:
        """The guard's ruling on this call, as a round of one (the catalog names alternatives).

        A call whose ``_meta`` names no fairness key takes the run's (the session's).
        """
        names = sorted(self.front.client.catalog())
        plan = guard.begin_round(
            [(self.tool, self.arguments)],
            alternatives=names,
            fairness_key=self.lane.fairness_key,
        )
        if self.lane.fairness_key is None and plan.fairness_key is not None:
            self.lane = Lane(plan.fairness_key, self.lane.priority)
        return plan

    async def _wait(self) -> ToolResult:
        prepared = await asyncio.to_thread(self._submit)
        if prepared.early is not None:  # refused before the queue: invalid, unknown, breaker
            return prepared.early
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._report_progress)
            tasks.start_soon(self._relay, prepared)
            result = await self.front.reply_to(prepared)
            tasks.cancel_scope.cancel()
        return result

    async def _relay(self, prepared: PreparedCall) -> None:
        """Forward what the running tool says or asks to the client (``toolexec.mcp.relay``)."""
        front = self.front
        if front._replies is None:
            front._replies = async_redis_client(front.client.waiter.url)
        relay = Relay(
            front._replies,
            front.client.keys,
            self.call_id,
            prepared.ctx.deadline - front.client.clock.now(),
            self.ctx.session,
            self.ctx.request_id,
            front.level_of(self.ctx),
            front.decide,
        )
        await relay.run()

    def _submit(self) -> PreparedCall:
        """Check and send the call, in one trip to a thread (all of it talks to Redis).

        What the client can answer is noted before the call is published, so the
        tool never finds the note missing while the client could answer.
        """
        client = self.front.client
        prepared = client.preparer.prepare(
            self.tool, self.arguments, self.run_id, self.timeout, self.call_id, None, lane=self.lane
        )
        if prepared.early is not None:
            return prepared
        can = can_answer(self.ctx.session.client_capabilities)
        if can is not None:
            ttl = max(1, int(prepared.ctx.deadline - client.clock.now()) + REPLY_TTL_S)
            client.redis.set(client.keys.caller(self.call_id), json.dumps(can), ex=ttl)
        publish(client.app, [prepared])
        return prepared

    async def _report_progress(self) -> None:
        """While the call is in flight: which attempt runs, or that it waits for the next one.

        Only when the client sent a progress token. The attempt comes from the
        workers' list of running attempts (``toolexec.stores.stats``), so the message can
        tell a running attempt from a backoff between two.
        """
        if not _progress_token(self.ctx.meta):
            return
        client = self.front.client
        every = self.front.settings.mcp_progress_s
        seen = 0
        while True:
            await anyio.sleep(every)
            elapsed = time.monotonic() - self.started
            try:
                running = await asyncio.to_thread(
                    running_attempt, client.redis, client.keys, self.call_id
                )
            except redis.RedisError:
                running = None
            seen = max(seen, running or 0)
            message = _progress_message(self.tool, running, seen, elapsed, self.timeout)
            await self.ctx.session.report_progress(
                min(elapsed, self.timeout), self.timeout, message
            )

    async def _cancelled(self, plan: RoundPlan | None) -> None:
        """The client cancelled: no further attempt starts, and the outcome is recorded."""
        client = self.front.client
        try:
            await asyncio.to_thread(client.app.control.revoke, self.call_id)
        except Exception as exc:
            log.warning("could not revoke cancelled call %s: %s", self.call_id, exc)
        entry = (await asyncio.to_thread(client.catalog)).get(self.tool)
        policy: Mapping[str, Any] = entry["policy"] if entry is not None else {}
        result = cancelled_result(
            tool=self.tool,
            call_id=self.call_id,
            run_id=self.run_id,
            side_effects=bool(policy.get("side_effects")),
            elapsed_s=time.monotonic() - self.started,
        )
        log.info(
            "call %s of %s cancelled by the MCP client: %s", self.call_id, self.tool, result.status
        )
        if self.guard is not None and plan is not None:
            await asyncio.to_thread(self.guard.end_round, plan, [result])

    async def _finish(
        self, plan: RoundPlan | None, result: ToolResult | None
    ) -> types.CallToolResult:
        if self.guard is None or plan is None:
            assert result is not None
            return to_call_result(result)
        outcome = (await asyncio.to_thread(self.guard.end_round, plan, [result]))[0]
        return to_call_result(outcome.result, outcome.note)


def _text_of(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


def _connection_key(ctx: Context) -> str:
    """The client connection a request came on: its ``Mcp-Session-Id``, or stdio's one client."""
    headers = getattr(ctx.request, "headers", None)
    session_id = headers.get("mcp-session-id") if headers is not None else None
    return str(session_id) if session_id else "stdio"


def _header_run_id(ctx: Context) -> str | None:
    """The run id a client set once on its HTTP connection (``Toolexec-Run-Id``), if usable.

    A client of the 2026 stateless transport has no session to tell its calls apart,
    and few frameworks let a caller add ``_meta`` to each call; nearly all let one set
    headers on the connection.
    """
    headers = getattr(ctx.request, "headers", None)
    given = headers.get(RUN_ID_HEADER) if headers is not None else None
    return checked_run_id(given)


def _progress_token(meta: Mapping[str, Any] | None) -> bool:
    return bool(meta) and any(k in meta for k in ("progress_token", "progressToken"))  # type: ignore[operator]


def _progress_message(
    tool: str, running: int | None, seen: int, elapsed: float, timeout: float
) -> str:
    when = f"{elapsed:.0f} s of {timeout:.0f} s"
    if running is not None:
        return f"{tool}: attempt {running} running ({when})"
    if seen:
        return f"{tool}: attempt {seen} failed, waiting to try again ({when})"
    return f"{tool}: not running yet: queued, or between attempts ({when})"


def _error_text(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)
