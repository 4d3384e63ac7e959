"""toolexec as the client of the MCP conformance suite's client scenarios.

The suite starts a test server and runs ``python tests/mcp_conformance_client.py URL``
(the scenario's name in ``MCP_CONFORMANCE_SCENARIO``, its credentials in
``MCP_CONFORMANCE_CONTEXT``). This script talks to the server with the session a
worker uses for ``--mcp-server`` (``toolexec.mcp.sessions.Hub``), OAuth included
(``toolexec.mcp.oauth``): it lists the tools and calls each, as a worker proxying
that server would. The suite's authorization servers approve at once, so the
user-agent step of the authorization-code grant is played here by following the
authorization URL's redirect without a browser, and the caller a remote server's
question is forwarded to accepts the defaults it offers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.shared.auth import AuthorizationCodeResult

from toolexec.caller import Answer
from toolexec.mcp.oauth import OAuth, token_exchange
from toolexec.mcp.servers import RemoteServer
from toolexec.mcp.sessions import Hub

#: Arguments for the tools the suite's test servers list.
ARGUMENTS = {"add_numbers": {"a": 5, "b": 3}}


async def follow(authorization_url: str) -> AuthorizationCodeResult:
    """The user agent: the authorization server redirects back with the code at once."""
    async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as http:
        answer = await http.get(authorization_url)
    query = parse_qs(urlsplit(answer.headers["location"]).query)
    first = {key: values[0] for key, values in query.items()}
    return AuthorizationCodeResult(
        code=first["code"], state=first.get("state"), iss=first.get("iss")
    )


def accept_defaults(message: str, schema: Mapping[str, Any]) -> Answer:
    """The caller of the elicitation scenario: a user who accepts every default offered
    (the server's question reached it through the session's elicitation forwarding)."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    content = {name: field["default"] for name, field in properties.items() if "default" in field}
    return Answer(action="accept", content=content)


def issuer_of(url: str) -> str:
    """The authorization server the MCP server names (its protected-resource metadata).

    A deployment configures the issuer of a cross-app-access client; the suite makes
    a new one per run, so the script looks it up.
    """
    parts = urlsplit(url)
    metadata = f"{parts.scheme}://{parts.netloc}/.well-known/oauth-protected-resource{parts.path}"
    found = httpx2.get(metadata, timeout=10).json()
    return str(found["authorization_servers"][0])


def oauth_for(scenario: str, context: dict[str, str], url: str) -> OAuth:
    if scenario == "auth/cross-app-access-complete-flow":
        return OAuth(
            grant="identity_assertion",
            client_id=context.get("client_id"),
            client_secret=context.get("client_secret"),
            issuer=issuer_of(url),
            identity_assertion=token_exchange(
                context["idp_token_endpoint"],
                context["idp_id_token"],
                client_id=context.get("idp_client_id"),
            ),
        )
    if scenario == "auth/client-credentials-jwt":
        return OAuth(
            grant="client_credentials",
            client_id=context.get("client_id"),
            token_endpoint_auth_method="private_key_jwt",
            private_key=context.get("private_key_pem"),
            signing_algorithm=context.get("signing_algorithm") or "RS256",
        )
    if scenario.startswith("auth/client-credentials"):
        return OAuth(
            grant="client_credentials",
            client_id=context.get("client_id"),
            client_secret=context.get("client_secret"),
        )
    method = "client_secret_post" if scenario.endswith("auth-post") else "client_secret_basic"
    if scenario.endswith("auth-none"):
        method = "none"
    return OAuth(
        client_id=context.get("client_id"),
        client_secret=context.get("client_secret"),
        token_endpoint_auth_method=method,  # type: ignore[arg-type]
        authorize=follow,
    )


def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    oauth = oauth_for(scenario, context, url) if scenario.startswith("auth/") else None
    server = RemoteServer(name="conformance", url=url, timeout=20.0, oauth=oauth)
    hub = Hub.get()
    tools = hub.run(hub.session(server).list_tools(), 30.0)
    for name in sorted(tools):
        try:
            answer = hub.run(
                hub.call(server, name, ARGUMENTS.get(name, {}), 20.0, ask=accept_defaults), 30.0
            )
            print(f"{scenario}: {name} -> {answer!r}"[:300])
        except Exception as exc:  # the scenario's checks say what was wrong
            print(f"{scenario}: {name} failed: {exc}"[:300])
    hub.session(server).close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
