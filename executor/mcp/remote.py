"""Remote MCP servers' tools as toolexec tools, behind the same defences.

A worker declares a server (``toolexec worker --mcp-server NAME=URL`` or
``NAME=stdio:COMMAND``, or :func:`mcp_server` in a tools module beside
``@tool``), lists its tools and registers each as tool ``NAME.tool`` (Celery
task ``tools.NAME.tool``). From there on a remote tool is an ordinary tool: a
per-server policy (timeout, attempts, backoff, queue), one breaker shared by
the server's tools, ``side_effects`` from the remote annotations unless
overridden (an idempotency record per call), fallbacks, offloaded results.

Each worker process keeps one MCP session per server on a thread of its own
(:class:`_Hub`), opened on first use and again after a failure, and re-lists a
server's tools when it sends ``notifications/tools/list_changed``. The tool
body turns what the session reports into toolexec's failure classes
(:func:`classify_mcp_error`): an ``isError`` result is ``tool_error``; transport
failures, HTTP 429/5xx and timeouts are transient; a protocol error on the
arguments is ``invalid_arguments``, or ``unknown_tool`` when the server no
longer lists the tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import logging
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import httpx2
import jsonschema
import mcp_types as types
import pydantic
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from toolexec.breaker import BreakerPolicy
from toolexec.classify import classify_response
from toolexec.errors import (
    TRANSIENT_TYPES,
    ClientError,
    ConfigurationError,
    InvalidArgumentsError,
    ToolConnectionError,
    ToolException,
    ToolTimeoutError,
    UnavailableError,
    UnknownToolError,
)
from toolexec.registry import Registry, ToolPolicy, ToolSpec, default_registry
from toolexec.retry import Jitter, RetryPolicy

if TYPE_CHECKING:  # fallback builds on the registry
    from toolexec.fallback.steps import FallbackStep

__all__ = [
    "HttpStatus",
    "RemoteServer",
    "arguments_model",
    "classify_mcp_error",
    "declared_servers",
    "mcp_server",
    "register_servers",
    "remote_side_effects",
]

log = logging.getLogger("toolexec.mcp")

T = TypeVar("T")

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_REMOTE_TOOL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

_INVALID_PARAMS = -32602
_METHOD_NOT_FOUND = -32601
_INTERNAL_ERROR = -32603
_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001


@dataclass(frozen=True)
class RemoteServer:
    """A remote MCP server and the policy its tools run under on this worker."""

    name: str
    url: str | None = None
    command: tuple[str, ...] = ()
    timeout: float = 30.0
    max_attempts: int = 3
    backoff_base: float = 0.5
    backoff_cap: float = 10.0
    queue: str | None = None
    #: Per remote tool (its own name), overriding what the annotations say.
    side_effects: Mapping[str, bool] = field(default_factory=dict)
    breaker: BreakerPolicy | None = None
    #: Per remote tool (its own name): a fallback chain (toolexec.fallback.steps).
    fallbacks: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    #: HTTP headers of every request, e.g. the server's Authorization; never shown in a repr.
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not _SERVER_NAME.match(self.name):
            raise ConfigurationError(
                f"an MCP server's name must be 1-32 letters, digits, '_' or '-', not {self.name!r}"
            )
        if (self.url is None) == (not self.command):
            raise ConfigurationError(
                f"MCP server {self.name!r}: give exactly one of url= (streamable HTTP) "
                "or command= (stdio)"
            )
        if not self.timeout > 0 or self.max_attempts < 1:
            raise ConfigurationError(
                f"MCP server {self.name!r}: timeout must be positive and max_attempts at least 1"
            )

    @classmethod
    def parse(cls, spec: str) -> RemoteServer:
        """``NAME=URL`` (streamable HTTP) or ``NAME=stdio:COMMAND`` (a command line)."""
        name, sep, target = spec.partition("=")
        if not sep or not target:
            raise ConfigurationError(
                f"--mcp-server takes NAME=URL or NAME=stdio:COMMAND, not {spec!r}"
            )
        if target.startswith("stdio:"):
            return cls(name=name.strip(), command=tuple(shlex.split(target[len("stdio:") :])))
        if not target.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"MCP server {name!r}: {target!r} is neither an http(s) URL nor stdio:COMMAND"
            )
        return cls(name=name.strip(), url=target)

    def configured(self, overrides: Mapping[str, Any]) -> RemoteServer:
        """This server with the operator's settings on top (``TOOLEXEC_MCP_SERVERS``)."""
        allowed = {"timeout", "max_attempts", "backoff_base", "backoff_cap", "queue", "headers"}
        changes: dict[str, Any] = {k: v for k, v in overrides.items() if k in allowed}
        unknown = set(overrides) - allowed - {"side_effects"}
        if unknown:
            raise ConfigurationError(
                f"TOOLEXEC_MCP_SERVERS[{self.name!r}]: unknown keys {sorted(unknown)}; "
                f"use {sorted(allowed | {'side_effects'})}"
            )
        if "side_effects" in overrides:
            changes["side_effects"] = {**self.side_effects, **dict(overrides["side_effects"])}
        return replace(self, **changes)

    def tool_name(self, remote: str) -> str:
        return f"{self.name}.{remote}"

    def policy(self, side_effects: bool) -> ToolPolicy:
        """The policy of each of this server's tools: one breaker for the whole server."""
        return ToolPolicy(
            timeout=self.timeout,
            retry=RetryPolicy(
                max_attempts=self.max_attempts,
                base=self.backoff_base,
                cap=self.backoff_cap,
                jitter=Jitter.FULL,
                retry_on=TRANSIENT_TYPES,
            ),
            queue=self.queue,
            side_effects=side_effects,
            breaker=self.breaker or BreakerPolicy(probe_lease_s=max(60.0, self.timeout + 10.0)),
            breaker_key=f"@mcp:{self.name}",
        )


_declared: list[RemoteServer] = []
_declared_lock = threading.Lock()


def mcp_server(
    name: str,
    url: str | None = None,
    *,
    command: Sequence[str] = (),
    timeout: float = 30.0,
    max_attempts: int = 3,
    backoff_base: float = 0.5,
    backoff_cap: float = 10.0,
    queue: str | None = None,
    side_effects: Mapping[str, bool] | None = None,
    breaker: BreakerPolicy | None = None,
    fallbacks: Mapping[str, Sequence[FallbackStep]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> RemoteServer:
    """Declare a remote MCP server in a tools module, beside ``@tool``.

    The worker that imports the module lists the server's tools when it starts
    and registers each as ``name.tool``. ``side_effects`` overrides, per remote
    tool, what its annotations say; ``fallbacks`` gives a remote tool a chain;
    ``headers`` go with every HTTP request (read a token from the environment here,
    or put it in ``TOOLEXEC_MCP_SERVERS``, rather than in code).
    """
    server = RemoteServer(
        name=name,
        url=url,
        command=tuple(command),
        timeout=timeout,
        max_attempts=max_attempts,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        queue=queue,
        side_effects=dict(side_effects or {}),
        breaker=breaker,
        fallbacks=dict(fallbacks or {}),
        headers=dict(headers or {}),
    )
    with _declared_lock:
        _declared[:] = [s for s in _declared if s.name != name] + [server]
    return server


def declared_servers() -> list[RemoteServer]:
    with _declared_lock:
        return list(_declared)


# -- deciding -------------------------------------------------------------------


def remote_side_effects(annotations: types.ToolAnnotations | None, override: bool | None) -> bool:
    """Whether calls of a remote tool must run at most once per idempotency key.

    A read-only tool has none; an idempotent tool that does not destroy may run
    twice harmlessly; anything else may write, and MCP's own defaults for absent
    hints (not read-only, destructive, not idempotent) say so too.
    """
    if override is not None:
        return override
    if annotations is None:
        return True
    if annotations.read_only_hint:
        return False
    return not (annotations.idempotent_hint and annotations.destructive_hint is False)


@dataclass
class HttpStatus:
    """The last HTTP response of a call, seen by the transport's response hook.

    The SDK reports any error status as a JSON-RPC internal error; the status
    and Retry-After decide whether the failure is transient, so the hook keeps them.
    """

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


_HTTP_STATUS: contextvars.ContextVar[HttpStatus | None] = contextvars.ContextVar(
    "toolexec_mcp_http_status", default=None
)


def classify_mcp_error(
    exc: BaseException, http: HttpStatus, *, listed: bool, url: str, now: float
) -> ToolException:
    """What a failed remote call means for retries, breakers and the model.

    ``listed`` is whether the server still lists the tool, which tells an
    unknown tool from bad arguments (MCP reports both as invalid params).
    """
    if isinstance(exc, MCPError):
        return _classify_protocol(exc, http, listed=listed, url=url, now=now)
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return ToolTimeoutError(
            f"the MCP server did not answer in time ({type(exc).__name__})",
            suggestion="The service was too slow; try again later or narrow the request.",
        )
    if isinstance(
        exc,
        httpx2.TransportError
        | OSError
        | anyio.ClosedResourceError
        | anyio.BrokenResourceError
        | anyio.EndOfStream,
    ):
        return _connection_error(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return classify_mcp_error(exc.exceptions[0], http, listed=listed, url=url, now=now)
    return _connection_error(f"the MCP session failed: {type(exc).__name__}: {exc}")


def _connection_error(message: str) -> ToolConnectionError:
    return ToolConnectionError(
        f"could not reach the MCP server: {message}",
        suggestion="The service is unreachable; try again later or use another source.",
    )


def _classify_protocol(
    exc: MCPError, http: HttpStatus, *, listed: bool, url: str, now: float
) -> ToolException:
    code = exc.code
    if code == _INVALID_PARAMS:
        if not listed:
            return UnknownToolError(
                f"the MCP server has no such tool any more: {exc.message}",
                suggestion="Choose another tool from the current list.",
            )
        return InvalidArgumentsError(
            f"the MCP server refused the arguments: {exc.message}",
            suggestion="Fix the arguments named above and call the tool again.",
            details={"data": exc.data} if exc.data is not None else None,
        )
    if code == _METHOD_NOT_FOUND:
        return ClientError(f"the MCP server does not serve tools/call: {exc.message}")
    if code == _REQUEST_TIMEOUT:
        return ToolTimeoutError(f"the MCP request timed out: {exc.message}")
    if code == _CONNECTION_CLOSED:
        return _connection_error(exc.message)
    if http.status == 404:
        # streamable HTTP's answer to a session id the server no longer knows (it restarted)
        return _connection_error(f"the MCP session is gone ({exc.message}); opening a new one")
    if http.status is not None and http.status >= 400:
        found = classify_response(http.status, http.headers, exc.message, url, now)
        if found is not None:
            return found
    return UnavailableError(
        f"the MCP server failed to answer: {exc.message} (JSON-RPC error {code})",
        suggestion="The service is failing for now; try again later or use another source.",
    )


def _tool_error(result: types.CallToolResult) -> ToolException:
    text = " ".join(
        block.text for block in result.content if isinstance(block, types.TextContent)
    ).strip()
    return ToolException(
        text or "the remote tool reported an error without a message",
        suggestion="The tool itself reported this failure; change the request rather than "
        "repeating it.",
        details={"remote": True},
    )


def _answer(result: types.CallToolResult) -> Any:
    """What the model sees of a remote success: the structured result, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if len(texts) == len(result.content):
        return "\n".join(texts)
    return [block.model_dump(mode="json", by_alias=True) for block in result.content]


# -- the sessions -------------------------------------------------------------------


class _Session:
    """One MCP session to one server, held open by a task on the hub's loop."""

    def __init__(self, server: RemoteServer, on_list_changed: Callable[[], None]) -> None:
        self.server = server
        self.client: Client | None = None
        self.tools: dict[str, types.Tool] = {}
        self._on_list_changed = on_list_changed
        self._stop: anyio.Event | None = None
        self._lock: asyncio.Lock | None = None

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


async def _note_status(response: httpx2.Response) -> None:
    box = _HTTP_STATUS.get()
    if box is not None:
        box.status = response.status_code
        box.headers = dict(response.headers)


class _Hub:
    """This process's MCP sessions, on an event loop of their own.

    The tool bodies run on the worker's pool; a session lives across calls on
    this loop, so calls from any pool thread share one session per server.
    """

    _instance: _Hub | None = None
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
    def get(cls) -> _Hub:
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
        threading.Thread(
            target=_refresh, args=(server,), name="toolexec-mcp-refresh", daemon=True
        ).start()

    async def call(
        self, server: RemoteServer, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Any:
        session = self.session(server)
        http = HttpStatus()
        _HTTP_STATUS.set(http)
        try:
            client = await session.client_now()
            result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            raise await self._classified(session, tool, exc, http) from exc
        if result.is_error:
            raise _tool_error(result)
        return _answer(result)

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


# -- registering -----------------------------------------------------------------


def _value_checker(schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    validator = jsonschema.Draft202012Validator(dict(schema))

    def check(value: Any) -> Any:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            raise ValueError(errors[0].message)
        return value

    return check


def arguments_model(
    qualified: str, schema: Mapping[str, Any]
) -> tuple[type[pydantic.BaseModel], dict[str, str]]:
    """A pydantic model that checks arguments against a remote tool's JSON Schema.

    The worker validates with pydantic (the authority); each property becomes a
    field checked against its own subschema, so a failure names the field.
    Fields get safe Python names, aliased to the remote names, and the model
    reports the remote schema itself, which the catalog publishes.
    """
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    for index, (remote, subschema) in enumerate(properties.items()):
        python = f"arg{index}"
        names[python] = remote
        checker = pydantic.AfterValidator(_value_checker(subschema or {}))
        default = ... if remote in required else None
        fields[python] = (Annotated[Any, checker], pydantic.Field(default=default, alias=remote))
    published = copy.deepcopy(dict(schema))
    published.pop("title", None)

    class _Remote(pydantic.BaseModel):
        # dumped under the remote names: idempotency records and retries carry those
        model_config = pydantic.ConfigDict(extra="forbid", serialize_by_alias=True)

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(published)

    model = pydantic.create_model(f"{qualified}_arguments", __base__=_Remote, **fields)
    return model, names


def _body(server: RemoteServer, remote: str, names: Mapping[str, str]) -> Callable[..., Any]:
    """The tool body: one call through this process's session to ``server``."""

    async def call_remote(**kwargs: Any) -> Any:
        arguments = {names[k]: v for k, v in kwargs.items() if v is not None}
        hub = _Hub.get()
        future = asyncio.run_coroutine_threadsafe(
            hub.call(server, remote, arguments, server.timeout), hub.loop
        )
        return await asyncio.wrap_future(future)

    call_remote.__name__ = f"mcp_{server.name}_{remote}".replace(".", "_").replace("-", "_")
    call_remote.__qualname__ = call_remote.__name__
    call_remote.__module__ = __name__
    return call_remote


def _spec(server: RemoteServer, tool: types.Tool) -> ToolSpec:
    qualified = server.tool_name(tool.name)
    writes = remote_side_effects(tool.annotations, server.side_effects.get(tool.name))
    model, names = arguments_model(qualified, tool.input_schema)
    return ToolSpec(
        name=qualified,
        description=tool.description or tool.title or qualified,
        func=_body(server, tool.name, names),
        arguments=model,
        policy=server.policy(writes),
        returns=dict(tool.output_schema) if tool.output_schema else None,
    )


def _register_tools(
    server: RemoteServer, tools: Mapping[str, types.Tool], registry: Registry
) -> list[str]:
    done = []
    for name, tool in sorted(tools.items()):
        if not _REMOTE_TOOL.match(name):
            log.warning(
                "MCP server %s: skipping tool %r (not a usable tool name)", server.name, name
            )
            continue
        spec = _spec(server, tool)
        registry.register(spec)
        steps = server.fallbacks.get(name)
        if steps:
            registry.set_fallbacks(spec.name, steps)
        done.append(spec.name)
    return done


def _list(server: RemoteServer) -> dict[str, types.Tool]:
    hub = _Hub.get()
    return hub.run(hub.session(server).list_tools(), server.timeout + 5.0)


def _refresh(server: RemoteServer, registry: Registry | None = None) -> None:
    """Re-list a server's tools (it said they changed) and publish the new catalog."""
    try:
        names = _register_tools(server, _list(server), registry or default_registry)
    except Exception as exc:
        log.warning("could not re-list the tools of MCP server %s: %s", server.name, exc)
        return
    log.info("MCP server %s now has %d tools: %s", server.name, len(names), ", ".join(names))
    _publish_now()


def _publish_now() -> None:
    """Let the worker run the new tools, then publish the catalog that routes calls to them.

    Celery's consumer maps task names to handlers once, at start; a task added
    later must be added there too, or its messages are dropped as unregistered.
    """
    consumer = _worker.get("consumer")
    if consumer is None:
        return
    from toolexec.tasks.catalog_publisher import publish_catalog

    try:
        consumer.update_strategies()
        publish_catalog(consumer.app, consumer.hostname)
    except Exception as exc:  # the heartbeat publishes it soon anyway
        log.warning("could not publish the catalog: %s", exc)


_worker: dict[str, Any] = {}


def _on_worker_ready(sender: Any, **_: Any) -> None:
    _worker["consumer"] = sender


def register_servers(
    servers: Sequence[RemoteServer],
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    registry: Registry | None = None,
) -> dict[str, str | None]:
    """List each server's tools and register them; called by the worker before it consumes.

    A server that cannot be listed now is not fatal: the worker starts with the
    others, and keeps trying that one in the background. Returns each server's
    queue (None: the default queue), which the worker consumes either way.
    """
    from celery import signals

    signals.worker_ready.connect(_on_worker_ready, weak=False)
    queues: dict[str, str | None] = {}
    for declared in servers:
        server = declared.configured((overrides or {}).get(declared.name, {}))
        queues[server.name] = server.queue
        try:
            tools = _list(server)
        except Exception as exc:
            log.warning(
                "MCP server %s cannot be listed now (%s: %s); retrying in the background",
                server.name,
                type(exc).__name__,
                exc,
            )
            threading.Thread(
                target=_keep_trying, args=(server,), name="toolexec-mcp-list", daemon=True
            ).start()
            continue
        _register_tools(server, tools, registry or default_registry)
    return queues


def _keep_trying(server: RemoteServer, every: float = 5.0) -> None:
    while True:
        time.sleep(every)
        try:
            tools = _list(server)
        except Exception:
            _Hub.get().session(server).close()
            continue
        _register_tools(server, tools, default_registry)
        _publish_now()
        return
