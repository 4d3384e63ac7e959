"""The two transports of ``toolexec mcp``: stdio, and streamable HTTP at ``/mcp``.

Over HTTP the front is reachable by anything that can reach the port, and a
browser page can reach a loopback port too (DNS rebinding), so: the SDK's
transport security checks ``Host`` and ``Origin`` (loopback origins, plus
``TOOLEXEC_MCP_ALLOWED_ORIGINS``) and caps the request body; a bearer token
from ``TOOLEXEC_MCP_TOKEN`` is checked by the SDK's bearer middleware; and a
bind beyond loopback is refused without one, as ``toolexec flower`` refuses
one without credentials.
"""

from __future__ import annotations

import hmac
import ipaddress
from functools import partial
from urllib.parse import urlsplit

import anyio
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Route

from toolexec.clock import Clock, SystemClock
from toolexec.errors import ConfigurationError
from toolexec.mcp.events import MemoryEventStore
from toolexec.mcp.server import McpFront
from toolexec.mcp.session_limits import SessionGate, SessionTable
from toolexec.settings import Settings

__all__ = [
    "MCP_PATH",
    "StaticTokenVerifier",
    "bearer_token",
    "check_bind",
    "http_app",
    "is_loopback",
    "parse_listen",
    "serve_http",
    "serve_stdio",
]

MCP_PATH = "/mcp"

#: Milliseconds a client waits before reconnecting a dropped SSE stream (SSE ``retry:``).
SSE_RETRY_MS = 1000

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a literal address or ``localhost``) is loopback; names are not resolved."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(
            f"--http takes HOST:PORT, e.g. 127.0.0.1:8765 or [::1]:8765, not {value!r}"
        )
    return host.strip("[]"), int(port)


def bearer_token(settings: Settings) -> str | None:
    """``TOOLEXEC_MCP_TOKEN``, or None: one answer for the bind check and the app alike.

    Settings read an empty or blank token as unset, so the two cannot disagree
    about ``TOOLEXEC_MCP_TOKEN=`` (the bind check once saw a token that the app
    then served without).
    """
    return settings.mcp_token.get_secret_value() if settings.mcp_token is not None else None


def check_bind(host: str, settings: Settings) -> None:
    """Refuse to serve beyond loopback without a bearer token."""
    if is_loopback(host) or bearer_token(settings):
        return
    raise ConfigurationError(
        f"refusing to serve MCP on {host}, beyond loopback, without a bearer token: every "
        "client could run every tool. TOOLEXEC_MCP_TOKEN is unset or blank: set it to a "
        "long random token, or listen on 127.0.0.1"
    )


class StaticTokenVerifier:
    """The one token of ``TOOLEXEC_MCP_TOKEN``, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="***", client_id="toolexec-mcp", scopes=[])
        return None


def _security(host: str, port: int, settings: Settings) -> TransportSecuritySettings:
    origins = [f"http://{h}:*" for h in _LOOPBACK_HOSTS] + list(settings.mcp_allowed_origins)
    hosts = [f"{h}:*" for h in _LOOPBACK_HOSTS]
    hosts += [f"{host}:{port}", f"[{host}]:{port}"]
    hosts += [urlsplit(origin).netloc for origin in settings.mcp_allowed_origins]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def http_app(
    front: McpFront, host: str, port: int, clock: Clock | None = None
) -> tuple[Starlette, SessionGate]:
    """The ASGI app serving ``/mcp`` and its session gate; ConfigurationError for an unsafe bind.

    The SDK's own session limits stay on as a backstop (the same count; twice
    the idle time), while toolexec's gate ends idle sessions on its clock and
    answers a full table with a refusal the client can read.
    """
    settings = front.settings
    check_bind(host, settings)
    token = bearer_token(settings)
    auth = (
        AuthSettings(issuer_url=f"http://{host}:{port}", resource_server_url=None)  # type: ignore[arg-type]
        if token
        else None
    )
    app = front.server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=_security(host, port, settings),
        max_request_body_size=settings.mcp_max_request_bytes,
        # SSE events carry ids and a retry interval: a client that lost its stream
        # reconnects with Last-Event-ID and gets what it missed (toolexec.mcp.events)
        event_store=MemoryEventStore(),
        retry_interval=SSE_RETRY_MS,
        session_idle_timeout=2 * settings.mcp_session_idle_s,
        max_sessions=settings.mcp_max_sessions,
        host=host,
        auth=auth,
        token_verifier=StaticTokenVerifier(token) if token else None,
    )
    table = SessionTable(settings.mcp_max_sessions, settings.mcp_session_idle_s)
    manager = front.server.session_manager
    route = next(r for r in app.routes if isinstance(r, Route) and r.path == MCP_PATH)
    gate = SessionGate(
        route.app, table, clock or SystemClock(), partial(_end_session, manager), front.forget
    )
    route.app = gate  # inside the auth middleware, around the SDK's endpoint
    return app, gate


async def _end_session(manager: StreamableHTTPSessionManager, session_id: str) -> None:
    """End one session in the SDK: forgotten at once (404 from then on), its task wound down.

    The SDK has no public call for this; its idle timeout does the same through
    these two private names, and the session tests fail if they go away.
    """
    transport = manager._server_instances.get(session_id)
    if transport is not None:
        await manager._discard_session(session_id, transport)


async def serve_http(front: McpFront, host: str, port: int) -> None:
    """Serve until cancelled (Ctrl-C, SIGTERM), with the catalog watcher beside it."""
    import uvicorn

    app, gate = http_app(front, host, port)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(front.watch_catalog)
        tasks.start_soon(front.watch_resources)
        tasks.start_soon(gate.watch_idle)
        await server.serve()
        tasks.cancel_scope.cancel()


async def serve_stdio(front: McpFront) -> None:
    """Serve one client over stdin and stdout until it closes them."""
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(front.watch_catalog)
        tasks.start_soon(front.watch_resources)
        async with stdio_server() as (read_stream, write_stream):
            await front.server.run(
                read_stream, write_stream, front.server.create_initialization_options()
            )
        tasks.cancel_scope.cancel()
