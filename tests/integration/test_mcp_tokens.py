"""OAuth tokens of remote MCP servers, shared by the fleet and sealed in Redis.

Real Redis (the suite's embedded Valkey); each test uses a record of its own and
deletes it. The refresh test drives the SDK's own OAuth provider against an
authorization server and a resource server played by an in-process transport
(no network), which rotates refresh tokens: a second refresh with the old one fails.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
import redis
from cryptography.fernet import Fernet
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl, SecretStr

from toolexec.connection import async_redis_client
from toolexec.errors import ConfigurationError
from toolexec.keys import Keys
from toolexec.mcp.login import login, redirect_result
from toolexec.mcp.oauth import OAuth, auth_for, fleet_store
from toolexec.mcp.servers import RemoteServer
from toolexec.mcp.tokens import FleetAuth, FleetTokens, cipher_from, store_ident
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

KEY = Fernet.generate_key().decode()
URL = "http://mcp.test/mcp"


@pytest.fixture
def ident(settings: Settings) -> Iterator[str]:
    name = store_ident(f"t-{uuid.uuid4().hex[:8]}", URL, "fleet")
    yield name
    keys = Keys(prefix=settings.key_prefix)
    sync = redis.Redis.from_url(settings.redis_url or "")
    sync.delete(keys.oauth_tokens(name), keys.oauth_client(name), keys.oauth_refresh_lock(name))
    sync.close()


def _store(settings: Settings, ident: str, key: str = KEY) -> FleetTokens:
    client = async_redis_client(settings.redis_url or "")
    return FleetTokens(client, Keys(prefix=settings.key_prefix), ident, cipher_from(key))


def test_two_workers_share_a_token_that_redis_holds_sealed(settings: Settings, ident: str) -> None:
    async def main() -> tuple[OAuthToken | None, str, OAuthClientInformationFull | None]:
        one, two = _store(settings, ident), _store(settings, ident)
        token = OAuthToken(access_token="AT-secret-1", refresh_token="RT-secret-1", expires_in=600)
        await one.set_tokens(token)
        client = OAuthClientInformationFull(
            client_id="dyn", client_secret="CS-secret-1", redirect_uris=[AnyUrl("http://x/cb")]
        )
        await one.set_client_info(client)
        raw = str(await one.client.get(one.keys.oauth_tokens(ident)))
        raw += str(await one.client.get(one.keys.oauth_client(ident)))
        return await two.get_tokens(), raw, await two.get_client_info()

    shared, raw, client = asyncio.run(main())
    assert shared is not None and shared.access_token == "AT-secret-1"
    assert shared.refresh_token == "RT-secret-1"
    assert shared.expires_in is not None and 590 <= shared.expires_in <= 600
    assert client is not None and client.client_secret == "CS-secret-1"
    assert raw.startswith("gAAAA")  # a Fernet token
    for secret in ("AT-secret", "RT-secret", "CS-secret"):
        assert secret not in raw


def test_another_key_cannot_open_the_record_and_no_key_stores_nothing(
    settings: Settings, ident: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> OAuthToken | None:
        await _store(settings, ident).set_tokens(OAuthToken(access_token="AT-x", expires_in=60))
        return await _store(settings, ident, Fernet.generate_key().decode()).get_tokens()

    with caplog.at_level("DEBUG", logger="toolexec"):
        assert asyncio.run(main()) is None
    assert "cannot be opened" in caplog.text and "AT-x" not in caplog.text
    with pytest.raises(ConfigurationError, match="unencrypted"):
        FleetTokens(async_redis_client(settings.redis_url or ""), Keys(), ident, None)
    with pytest.raises(ConfigurationError, match="Fernet key"):
        cipher_from("not-a-key")


def test_a_token_due_for_refresh_is_refreshed_once_by_the_fleet(
    settings: Settings, ident: str
) -> None:
    refreshes: list[str] = []
    seen: list[str] = []

    async def server(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/token":
            form = dict(x.split("=", 1) for x in request.content.decode().split("&"))
            if form.get("refresh_token") != "RT-1":  # rotated: the old one is void
                return httpx2.Response(400, json={"error": "invalid_grant"})
            refreshes.append(form["refresh_token"])
            await asyncio.sleep(0.2)  # a slow authorization server: the others arrive meanwhile
            return httpx2.Response(
                200,
                json={
                    "access_token": "AT-2",
                    "token_type": "Bearer",
                    "expires_in": 3600,
                    "refresh_token": "RT-2",
                },
            )
        seen.append(request.headers.get("authorization", ""))
        ok = request.headers.get("authorization") == "Bearer AT-2"
        return httpx2.Response(200 if ok else 401, json={})

    oauth = OAuth(
        client_id="fleet", client_secret="s", token_endpoint_auth_method="client_secret_post"
    )

    async def worker() -> int:
        auth = auth_for(URL, oauth, _store(settings, ident))
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(server), auth=auth) as http:
            return (await http.get(URL)).status_code

    async def main() -> list[int]:
        # the token expires in 30 s: inside the refresh margin
        first = OAuthToken(access_token="AT-1", refresh_token="RT-1", expires_in=30)
        await _store(settings, ident).set_tokens(first)
        return list(await asyncio.gather(*(worker() for _ in range(5))))

    statuses = asyncio.run(main())
    assert refreshes == ["RT-1"]  # one refresh for five workers
    assert statuses == [200] * 5
    assert seen == ["Bearer AT-2"] * 5  # the others waited and reused what it stored


BASE = "http://mcp.test"


def _mcp(request: httpx2.Request) -> httpx2.Response:
    """The MCP endpoint: 401 with where its metadata is, until the signed-in token comes."""
    if request.headers.get("authorization") != "Bearer AT-login":
        challenge = f'Bearer resource_metadata="{BASE}/.well-known/oauth-protected-resource/mcp"'
        return httpx2.Response(401, headers={"www-authenticate": challenge})
    if request.method != "POST":
        return httpx2.Response(405 if request.method == "GET" else 200)
    message = json.loads(request.content)
    if "id" not in message:
        return httpx2.Response(202)
    result: dict[str, Any] = {"tools": []}
    if message["method"] == "initialize":
        result = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "signed", "version": "1"},
        }
    body = {"jsonrpc": "2.0", "id": message["id"], "result": result}
    return httpx2.Response(200, json=body, headers={"mcp-session-id": "s1"})


def _register(request: httpx2.Request) -> httpx2.Response:
    asked = json.loads(request.content)
    return httpx2.Response(201, json={**asked, "client_id": "dyn-1", "client_secret": "CS-1"})


def _signing_in_server(issued: list[str]) -> httpx2.MockTransport:
    """An MCP server behind OAuth and its authorization server, in process (no network)."""
    metadata = {
        "issuer": BASE,
        "authorization_endpoint": f"{BASE}/authorize",
        "token_endpoint": f"{BASE}/token",
        "registration_endpoint": f"{BASE}/register",
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
    }

    def token(request: httpx2.Request) -> httpx2.Response:
        form = parse_qs(request.content.decode())
        assert form["grant_type"] == ["authorization_code"] and form["code"] == ["C-1"]
        issued.append("AT-login")
        answer = {"access_token": "AT-login", "token_type": "Bearer", "expires_in": 3600}
        return httpx2.Response(200, json={**answer, "refresh_token": "RT-login"})

    routes = {
        "/mcp": _mcp,
        "/.well-known/oauth-protected-resource/mcp": lambda r: httpx2.Response(
            200, json={"resource": URL, "authorization_servers": [BASE]}
        ),
        "/.well-known/oauth-authorization-server": lambda r: httpx2.Response(200, json=metadata),
        "/register": _register,
        "/token": token,
    }
    return httpx2.MockTransport(lambda r: routes.get(r.url.path, lambda _: httpx2.Response(404))(r))


def test_one_sign_in_by_an_operator_serves_the_fleet(settings: Settings, ident: str) -> None:
    """``toolexec mcp login``: the operator pastes the redirect back; the tokens (and the
    client registered for them) land sealed in the fleet's store, where a worker finds them."""
    shown: list[str] = []
    issued: list[str] = []

    def operator(authorization_url: str) -> str:
        shown.append(authorization_url)
        state = parse_qs(urlsplit(authorization_url).query)["state"][0]
        return f"http://127.0.0.1:33418/callback?code=C-1&state={state}"

    name = ident.split(":")[0]
    server = RemoteServer(name=name, url=URL, oauth=OAuth(), timeout=10.0)
    fleet = settings.model_copy(update={"mcp_token_key": SecretStr(KEY)})
    http = httpx2.AsyncClient(transport=_signing_in_server(issued))

    async def main() -> tuple[OAuthToken | None, str]:
        await login(server, operator, fleet, http)
        worker = _store(settings, store_ident(name, URL, None))
        raw = str(await worker.client.get(worker.keys.oauth_tokens(worker.ident)))
        raw += str(await worker.client.get(worker.keys.oauth_client(worker.ident)))
        return await worker.get_tokens(), raw

    try:
        token, raw = asyncio.run(main())
    finally:
        keys = Keys(prefix=settings.key_prefix)
        sync = redis.Redis.from_url(settings.redis_url or "")
        other = store_ident(name, URL, None)
        sync.delete(keys.oauth_tokens(other), keys.oauth_client(other))
        sync.close()
    assert shown and shown[0].startswith("http://mcp.test/authorize?")
    assert issued == ["AT-login"]
    assert token is not None and token.access_token == "AT-login"
    assert "AT-login" not in raw and "RT-login" not in raw and "CS-1" not in raw


def test_login_refuses_without_a_fleet_store_and_for_grants_without_sign_in(
    settings: Settings,
) -> None:
    plain = settings.model_copy(update={"mcp_token_key": None})
    server = RemoteServer(name="crm", url=URL, oauth=OAuth(), timeout=10.0)
    with pytest.raises(ConfigurationError, match="TOOLEXEC_MCP_TOKEN_KEY"):
        asyncio.run(login(server, lambda url: "", plain))
    machine = OAuth(grant="client_credentials", client_id="c", client_secret="s")
    with pytest.raises(ConfigurationError, match="needs no sign-in"):
        asyncio.run(login(RemoteServer(name="m", url=URL, oauth=machine), lambda url: "", plain))
    with pytest.raises(ConfigurationError, match="refused the sign-in: nope"):
        redirect_result("http://127.0.0.1/cb?error=access_denied&error_description=nope")


def test_a_worker_uses_the_fleet_store_only_with_a_key(settings: Settings) -> None:
    """What a worker's session gets (``toolexec.mcp.sessions._auth``): the fleet's sealed
    store with ``TOOLEXEC_MCP_TOKEN_KEY``, its own memory without."""
    oauth = OAuth(
        grant="client_credentials", client_id="fleet", client_secret="s", issuer="http://mcp.test"
    )
    keyed = settings.model_copy(update={"mcp_token_key": SecretStr(KEY)})
    store = fleet_store("crm", URL, oauth, keyed)
    assert isinstance(store, FleetTokens)
    assert isinstance(auth_for(URL, oauth, store), FleetAuth)
    plain = settings.model_copy(update={"mcp_token_key": None})
    assert fleet_store("crm", URL, oauth, plain) is None
