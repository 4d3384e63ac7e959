"""OAuth tokens to remote MCP servers, kept for the whole fleet and encrypted at rest.

Without a store every worker process signs in on its own and holds its token in
memory; a fleet of forty processes then asks the authorization server forty
times, and a refresh token that rotates (each use returns a new one and voids
the old) is spent by whichever process refreshes first, leaving the others to
fail. So with ``TOOLEXEC_MCP_TOKEN_KEY`` set, the tokens (and a dynamically
registered client, whose secret is a credential too) live in Redis, one record
per server and client, sealed with Fernet (AES-128-CBC with an HMAC-SHA256, from
``cryptography``): Redis, its snapshots and anyone who can read its keys see
ciphertext only. Without a key nothing is written to Redis (tokens stay in each
process's memory): tokens are never stored readable.

Refreshing happens before expiry (``margin_s`` ahead), by one process at a
time: the one that takes the refresh lock lets the SDK's provider refresh (or,
for ``client_credentials``, get a new token) in its next request and stores the
result; the others wait for the record to change, or the lock to go, and reuse
what it stored. A holder that dies lets go when the lock's TTL ends.

Tokens are never logged: the records are opaque, a record that cannot be
opened (another key, tampering) is logged by its server's name alone, and
:class:`FleetAuth` logs nothing of what it carries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import redis.asyncio
from cryptography.fernet import Fernet, InvalidToken
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from toolexec.clock import Clock, SystemClock
from toolexec.errors import ConfigurationError
from toolexec.keys import OAUTH_CLIENT_TTL_S, OAUTH_LOCK_TTL_S, OAUTH_REFRESH_TTL_S, Keys

__all__ = ["FleetAuth", "FleetTokens", "Stored", "cipher_from", "refresh_due", "store_ident"]

log = logging.getLogger("toolexec.mcp")

#: Seconds ahead of expiry a token is refreshed, so no request carries one that expires on the way.
REFRESH_MARGIN_S = 60.0

#: Seconds between two looks at the record while another process refreshes.
_POLL_S = 0.05

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def cipher_from(key: str | None) -> Fernet | None:
    """The Fernet of ``TOOLEXEC_MCP_TOKEN_KEY``; None without a key (tokens stay in memory)."""
    if not key:
        return None
    try:
        return Fernet(key.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise ConfigurationError(
            "TOOLEXEC_MCP_TOKEN_KEY is not a Fernet key (32 bytes, url-safe base64): make one "
            "with python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())'"
        ) from None


def store_ident(server: str, url: str, client_id: str | None) -> str:
    """The record's name: the server, and a digest of where and as whom (a new URL or client
    gets a record of its own rather than another's token)."""
    digest = hashlib.sha256(f"{url}\n{client_id or ''}".encode()).hexdigest()[:16]
    return f"{server}:{digest}"


def refresh_due(expires_at: float | None, now: float, margin_s: float) -> bool:
    """Whether a token expiring at ``expires_at`` (None: never said) is due for a refresh."""
    return expires_at is not None and now >= expires_at - margin_s


@dataclass(frozen=True)
class Stored:
    """One server's tokens as the fleet holds them: absolute expiry, a version per write."""

    token: OAuthToken
    expires_at: float | None
    version: str


class FleetTokens:
    """The SDK's token storage (``TokenStorage``) in Redis, sealed; shared by every process.

    ``held`` is the version this process last read or wrote, by which
    :class:`FleetAuth` tells a record another process wrote.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        ident: str,
        cipher: Fernet | None,
        clock: Clock | None = None,
    ) -> None:
        if cipher is None:
            raise ConfigurationError(
                "refusing to keep OAuth tokens in Redis unencrypted: set TOOLEXEC_MCP_TOKEN_KEY "
                "(a Fernet key), or leave tokens in each process's memory"
            )
        self.client, self.keys, self.ident = client, keys, ident
        self.cipher = cipher
        self.clock = clock or SystemClock()
        self.held: str | None = None
        #: a pre-registered client: configured, so never stored
        self.preset: OAuthClientInformationFull | None = None

    def _seal(self, value: dict[str, Any]) -> bytes:
        return self.cipher.encrypt(json.dumps(value).encode())

    def _open(self, raw: bytes | str | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        try:
            found = json.loads(self.cipher.decrypt(raw))
        except (InvalidToken, ValueError):
            log.warning(
                "the stored OAuth record of MCP server %s cannot be opened with "
                "TOOLEXEC_MCP_TOKEN_KEY (another key, or altered): signing in again",
                self.ident.split(":")[0],
            )
            return None
        return found if isinstance(found, dict) else None

    async def load(self) -> Stored | None:
        """The fleet's current tokens, or None."""
        found = self._open(await self.client.get(self.keys.oauth_tokens(self.ident)))
        if found is None:
            return None
        expires_at = found.get("expires_at")
        return Stored(
            OAuthToken.model_validate(found["token"]),
            float(expires_at) if expires_at is not None else None,
            str(found["version"]),
        )

    async def get_tokens(self) -> OAuthToken | None:
        stored = await self.load()
        if stored is None:
            return None
        self.held = stored.version
        return _with_remaining(stored, self.clock.now())

    async def set_tokens(self, tokens: OAuthToken) -> None:
        now = self.clock.now()
        expires_at = now + tokens.expires_in if tokens.expires_in is not None else None
        version = uuid.uuid4().hex
        record = {
            "token": tokens.model_dump(mode="json"),
            "expires_at": expires_at,
            "version": version,
        }
        ttl = _record_ttl(tokens)
        await self.client.set(self.keys.oauth_tokens(self.ident), self._seal(record), ex=ttl)
        self.held = version

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self.preset is not None:
            return self.preset
        found = self._open(await self.client.get(self.keys.oauth_client(self.ident)))
        return OAuthClientInformationFull.model_validate(found) if found else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.preset is not None:
            return
        sealed = self._seal(client_info.model_dump(mode="json"))
        await self.client.set(self.keys.oauth_client(self.ident), sealed, ex=OAUTH_CLIENT_TTL_S)

    async def lock(self) -> str | None:
        """Take the refresh lock; its token, or None while another process holds it."""
        token = uuid.uuid4().hex
        taken = await self.client.set(
            self.keys.oauth_refresh_lock(self.ident), token, nx=True, ex=OAUTH_LOCK_TTL_S
        )
        return token if taken else None

    async def unlock(self, token: str) -> None:
        await self.client.eval(_UNLOCK, 1, self.keys.oauth_refresh_lock(self.ident), token)

    async def wait_for_other(self, version: str | None) -> Stored | None:
        """While another process refreshes: the record it writes, or what is there when its
        lock goes (at most the lock's TTL)."""
        lock_key = self.keys.oauth_refresh_lock(self.ident)
        with anyio.move_on_after(OAUTH_LOCK_TTL_S):
            while True:
                stored = await self.load()
                if stored is not None and stored.version != version:
                    return stored
                if not await self.client.exists(lock_key):
                    return stored
                await anyio.sleep(_POLL_S)
        return await self.load()


def _with_remaining(stored: Stored, now: float) -> OAuthToken:
    """The token with ``expires_in`` counted from now, as the SDK reads it."""
    if stored.expires_at is None:
        return stored.token
    return stored.token.model_copy(update={"expires_in": max(0, int(stored.expires_at - now))})


def _record_ttl(tokens: OAuthToken) -> int:
    """A record with a refresh token lasts as long as one may (OAUTH_REFRESH_TTL_S); one
    without, as long as its access token (and a minute)."""
    if tokens.refresh_token or tokens.expires_in is None:
        return OAUTH_REFRESH_TTL_S
    return max(60, int(tokens.expires_in) + 60)


class FleetAuth(httpx2.Auth):
    """The SDK's OAuth provider, with its tokens from the fleet's store, refreshed once.

    Before each request: adopt a record another process wrote; when the token
    is due, take the refresh lock and let the provider refresh in this request
    (it stores the result through :class:`FleetTokens`), or, if another process
    holds the lock, wait for what it stores.
    """

    requires_response_body = True

    def __init__(
        self,
        provider: OAuthClientProvider,
        store: FleetTokens,
        clock: Clock | None = None,
        margin_s: float = REFRESH_MARGIN_S,
    ) -> None:
        self.provider, self.store = provider, store
        self.clock = clock or store.clock
        self.margin_s = margin_s

    def _adopt(self, stored: Stored | None) -> None:
        if stored is None or stored.version == self.store.held:
            return
        context = self.provider.context
        context.current_tokens = stored.token
        context.token_expiry_time = stored.expires_at
        self.store.held = stored.version

    def _due(self) -> bool:
        context = self.provider.context
        held = context.current_tokens is not None
        return held and refresh_due(context.token_expiry_time, self.clock.now(), self.margin_s)

    async def _before(self) -> str | None:
        """Bring the token up to date; the lock's token when this request refreshes."""
        self._adopt(await self.store.load())
        if not self._due():
            return None
        lock = await self.store.lock()
        if lock is None:
            self._adopt(await self.store.wait_for_other(self.store.held))
            return None
        self._adopt(await self.store.load())  # a refresh may have ended just before
        if not self._due():
            await self.store.unlock(lock)
            return None
        # an expiry long past (0 would read as "never"): the provider refreshes in this request
        self.provider.context.token_expiry_time = 1.0
        return lock

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        lock = await self._before()
        flow = self.provider.async_auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()
            if lock is not None:
                await self.store.unlock(lock)
