"""``toolexec mcp login NAME``: someone signs in once, and the whole fleet uses the tokens.

The authorization-code grant needs a person and a browser, which a worker has
not. So an operator runs the flow from a terminal: the command prints the
authorization URL, the operator opens it, signs in, and pastes back the URL the
browser was redirected to (the redirect URI need not be served: its address bar
holds the code). The tokens go to the fleet's sealed store
(``toolexec.mcp.tokens``), from which every worker takes them and refreshes
them; without ``TOOLEXEC_MCP_TOKEN_KEY`` there is no such store and the command
refuses, since tokens in its own memory would serve no one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult

from toolexec.errors import ConfigurationError
from toolexec.mcp.oauth import OAuth, auth_for, fleet_store
from toolexec.mcp.servers import RemoteServer
from toolexec.settings import Settings

__all__ = ["login", "redirect_result"]


def redirect_result(pasted: str) -> AuthorizationCodeResult:
    """The code (and state, issuer) in the redirect URL an operator pasted back."""
    query = {key: values[0] for key, values in parse_qs(urlsplit(pasted.strip()).query).items()}
    if "error" in query:
        said = query.get("error_description") or query["error"]
        raise ConfigurationError(f"the authorization server refused the sign-in: {said}")
    if "code" not in query:
        raise ConfigurationError(
            "the pasted URL has no code= parameter: paste the whole address the browser was "
            "sent to after signing in"
        )
    return AuthorizationCodeResult(
        code=query["code"], state=query.get("state"), iss=query.get("iss")
    )


def _oauth_of(server: RemoteServer) -> OAuth:
    oauth = server.oauth
    if server.url is None or not isinstance(oauth, OAuth):
        raise ConfigurationError(
            f"MCP server {server.name} is not declared with oauth=OAuth(...) over HTTP: "
            "nothing to sign in to"
        )
    if oauth.grant != "authorization_code":
        raise ConfigurationError(
            f"MCP server {server.name} uses the {oauth.grant} grant, which needs no sign-in: "
            "the workers get their tokens themselves"
        )
    return oauth


async def login(
    server: RemoteServer,
    ask: Callable[[str], str],
    settings: Settings | None = None,
    http: httpx2.AsyncClient | None = None,
) -> None:
    """Sign in to ``server`` and store its tokens for the fleet.

    ``ask`` shows the authorization URL and returns the redirect URL pasted back
    (blocking: it runs in a thread). ``http`` is the client to send with (its
    auth is replaced); by default one of its own.
    """
    oauth = _oauth_of(server)
    assert server.url is not None
    store = fleet_store(server.name, server.url, oauth, settings)
    if store is None:
        raise ConfigurationError(
            "toolexec mcp login stores the tokens for the whole fleet, in Redis, sealed: set "
            "TOOLEXEC_MCP_TOKEN_KEY (a Fernet key, the workers' too) and TOOLEXEC_REDIS_URL"
        )

    async def authorize(authorization_url: str) -> AuthorizationCodeResult:
        return redirect_result(await anyio.to_thread.run_sync(ask, authorization_url))

    auth = auth_for(server.url, dataclasses.replace(oauth, authorize=authorize), store)
    client = http or httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0))
    client.auth = auth
    async with client:
        target = streamable_http_client(server.url, http_client=client)
        async with Client(target, mode="legacy") as session:
            await session.list_tools()  # signed in: the tokens are stored
