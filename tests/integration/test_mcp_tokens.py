"""OAuth tokens of remote MCP servers, shared by the fleet and sealed in Redis.

Real Redis (the suite's embedded Valkey); each test uses a record of its own and
deletes it. The refresh test drives the SDK's own OAuth provider against an
authorization server and a resource server played by an in-process transport
(no network), which rotates refresh tokens: a second refresh with the old one fails.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx2
import pytest
import redis
from cryptography.fernet import Fernet
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

from toolexec.connection import async_redis_client
from toolexec.errors import ConfigurationError
from toolexec.keys import Keys
from toolexec.mcp.oauth import OAuth, auth_for
from toolexec.mcp.tokens import FleetTokens, cipher_from, store_ident
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

KEY = Fernet.generate_key().decode()
URL = "http://mcp.test/mcp"


@pytest.fixture
def ident(settings: Settings) -> AsyncIterator[str]:
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
    settings: Settings, ident: str
) -> None:
    async def main() -> OAuthToken | None:
        await _store(settings, ident).set_tokens(OAuthToken(access_token="AT-x", expires_in=60))
        return await _store(settings, ident, Fernet.generate_key().decode()).get_tokens()

    assert asyncio.run(main()) is None
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
