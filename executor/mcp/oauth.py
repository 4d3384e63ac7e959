"""OAuth to a remote MCP server, with the SDK's client flows (``mcp.client.auth``).

``mcp_server(..., oauth=OAuth(...))`` puts an OAuth-protected server behind a
worker: on the first 401 the session discovers the protected-resource and
authorization-server metadata, registers (dynamically, or with a
pre-registered ``client_id``), and gets a token, with scopes from
``WWW-Authenticate`` or ``scopes_supported``, step-up on 403
``insufficient_scope``, refresh before expiry and the resource check the SDK
does (a resource-metadata mismatch is refused). Three grants:

- ``client_credentials``: no person involved, what a headless fleet uses. The
  client authenticates with a secret (``client_secret_basic`` or
  ``client_secret_post``) or with a JWT it signs with its private key
  (``private_key_jwt``, RFC 7523: ``private_key`` in PEM, ``signing_algorithm``),
  which keeps a shared secret off the wire and out of the authorization server.
- ``authorization_code`` with PKCE: someone must sign in. ``authorize`` is the
  user-agent step: given the authorization URL, it returns the redirect's
  code. A worker has no browser, so without ``authorize`` the flow stops with
  an error saying so; ``toolexec mcp login NAME`` (``toolexec.mcp.login``) lets an
  operator sign in once for the fleet.
- ``identity_assertion`` (cross-app access, SEP-990): the company's identity
  provider vouches for the user with an ID-JAG (:func:`token_exchange`), which the
  authorization server, named by ``issuer`` and never discovered, trades for a token.

With ``TOOLEXEC_MCP_TOKEN_KEY`` (a Fernet key) the tokens are the fleet's,
sealed in Redis and refreshed by one process at a time (``toolexec.mcp.tokens``);
without it each process keeps its own in memory (one sign-in per worker
process). Tokens are never logged (``OAuth``'s secret is kept out of its repr).
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import AnyUrl

from toolexec.connection import async_redis_client
from toolexec.errors import ConfigurationError
from toolexec.keys import Keys
from toolexec.mcp.tokens import FleetAuth, FleetTokens, cipher_from, store_ident
from toolexec.settings import Settings

__all__ = [
    "IdentityAssertion",
    "MemoryTokens",
    "OAuth",
    "auth_for",
    "fleet_store",
    "token_exchange",
]

Authorize = Callable[[str], Awaitable[AuthorizationCodeResult]]

#: (the authorization server's issuer, the MCP server's resource) -> an ID-JAG for them.
IdentityAssertion = Callable[[str, str], Awaitable[str]]

_TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


@dataclass(frozen=True)
class OAuth:
    """How a worker authenticates to one remote MCP server."""

    grant: Literal["authorization_code", "client_credentials", "identity_assertion"] = (
        "authorization_code"
    )
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    token_endpoint_auth_method: Literal[
        "client_secret_basic", "client_secret_post", "none", "private_key_jwt"
    ] = "client_secret_basic"
    #: ``private_key_jwt``: the PEM private key the client signs its assertions with.
    private_key: str | None = field(default=None, repr=False)
    #: ``private_key_jwt``: the JWS algorithm of the key (RS256, ES256, ...).
    signing_algorithm: str = "RS256"
    #: The authorization server's issuer the client is registered with; when given, a
    #: token is asked only of that one (a server pointing elsewhere is refused).
    issuer: str | None = None
    #: ``identity_assertion``: given the authorization server's issuer and the MCP server's
    #: resource, returns an ID-JAG for them (e.g. :func:`token_exchange`).
    identity_assertion: IdentityAssertion | None = field(default=None, repr=False, compare=False)
    scope: str | None = None
    redirect_uri: str = "http://127.0.0.1:33418/callback"
    client_name: str = "toolexec"
    #: The user-agent step of the authorization-code grant (see the module doc).
    authorize: Authorize | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.grant == "identity_assertion":
            if not (self.client_id and self.client_secret and self.issuer):
                raise ConfigurationError(
                    "OAuth identity_assertion needs client_id, client_secret and issuer (the "
                    "MCP authorization server's issuer: configuration, never discovery)"
                )
            if self.identity_assertion is None:
                raise ConfigurationError(
                    "OAuth identity_assertion needs identity_assertion=, e.g. token_exchange(...)"
                )
        jwt = self.token_endpoint_auth_method == "private_key_jwt"
        if jwt and (self.grant != "client_credentials" or not self.private_key):
            raise ConfigurationError(
                "OAuth private_key_jwt is for the client_credentials grant and needs private_key "
                "(PEM) and client_id"
            )
        credential = self.private_key if jwt else self.client_secret
        if self.grant == "client_credentials" and not (self.client_id and credential):
            raise ConfigurationError(
                "OAuth client_credentials needs client_id and client_secret (or private_key "
                "with token_endpoint_auth_method='private_key_jwt')"
            )


class MemoryTokens:
    """The SDK's token storage, in this process's memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    @property
    def preset(self) -> OAuthClientInformationFull | None:
        return self.client

    @preset.setter
    def preset(self, client: OAuthClientInformationFull | None) -> None:
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def fleet_store(
    name: str, url: str, oauth: OAuth, settings: Settings | None = None
) -> FleetTokens | None:
    """The fleet's sealed store for this server's tokens; None without a key or a Redis."""
    settings = settings or Settings()
    key = settings.mcp_token_key.get_secret_value() if settings.mcp_token_key else None
    cipher = cipher_from(key)
    if cipher is None or not settings.redis_url:
        return None
    client = async_redis_client(settings.redis_url)
    ident = store_ident(name, url, oauth.client_id)
    return FleetTokens(client, Keys(prefix=settings.key_prefix), ident, cipher)


def auth_for(url: str, oauth: OAuth, store: FleetTokens | None = None) -> httpx2.Auth:
    """The httpx auth of a session to ``url``: the SDK's provider for the chosen grant,
    with its tokens in the fleet's ``store`` when there is one."""
    provider = _provider(url, oauth, store or MemoryTokens())
    if store is None or not isinstance(provider, OAuthClientProvider):
        return provider  # identity assertion: its own flow, the store as plain storage
    return FleetAuth(provider, store)


def _jwt_provider(
    url: str, oauth: OAuth, storage: MemoryTokens | FleetTokens
) -> OAuthClientProvider:
    """Client credentials, the client authenticated by a JWT it signs (RFC 7523 2.2):
    issued by and about the client, for the authorization server, short-lived."""
    client_id = oauth.client_id or ""
    signed = SignedJWTParameters(
        issuer=client_id,
        subject=client_id,
        signing_key=oauth.private_key or "",
        signing_algorithm=oauth.signing_algorithm,
    )
    with warnings.catch_warnings():
        # without issuer= the SDK warns that it will be required; whichever server
        # discovery finds is used until then, as for a client secret
        warnings.simplefilter("ignore")
        return PrivateKeyJWTOAuthProvider(
            url,
            storage,
            client_id=client_id,
            assertion_provider=signed.create_assertion_provider(),
            scope=oauth.scope,
            issuer=oauth.issuer,
        )


def _provider(
    url: str, oauth: OAuth, storage: MemoryTokens | FleetTokens
) -> OAuthClientProvider | IdentityAssertionOAuthProvider:
    if oauth.grant == "identity_assertion":
        return IdentityAssertionOAuthProvider(
            url,
            storage,
            client_id=oauth.client_id or "",
            client_secret=oauth.client_secret or "",
            issuer=oauth.issuer or "",
            assertion_provider=oauth.identity_assertion,  # type: ignore[arg-type]
            scope=oauth.scope,
            token_endpoint_auth_method="client_secret_post"
            if oauth.token_endpoint_auth_method == "client_secret_post"
            else "client_secret_basic",
        )
    if oauth.token_endpoint_auth_method == "private_key_jwt":
        return _jwt_provider(url, oauth, storage)
    if oauth.grant == "client_credentials":
        method = oauth.token_endpoint_auth_method
        return ClientCredentialsOAuthProvider(
            url,
            storage,
            client_id=oauth.client_id or "",
            client_secret=oauth.client_secret or "",
            token_endpoint_auth_method="client_secret_post"
            if method == "client_secret_post"
            else "client_secret_basic",
            scope=oauth.scope,
            issuer=oauth.issuer,
        )
    redirect = AnyUrl(oauth.redirect_uri)
    metadata = OAuthClientMetadata(
        redirect_uris=[redirect],
        client_name=oauth.client_name,
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method=oauth.token_endpoint_auth_method,
        scope=oauth.scope,
    )
    if oauth.client_id:  # pre-registered: no dynamic registration
        storage.preset = OAuthClientInformationFull(
            client_id=oauth.client_id,
            client_secret=oauth.client_secret,
            redirect_uris=[redirect],
            token_endpoint_auth_method=oauth.token_endpoint_auth_method,
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        )
    pending: list[str] = []

    async def redirect_to(authorization_url: str) -> None:
        pending.append(authorization_url)

    async def come_back() -> AuthorizationCodeResult:
        if oauth.authorize is None:
            raise ConfigurationError(
                f"{url} needs someone to sign in (OAuth authorization code), and a worker has "
                "no browser: use a client_credentials client, or give OAuth(authorize=...)"
            )
        return await oauth.authorize(pending.pop())

    return OAuthClientProvider(url, metadata, storage, redirect_to, come_back)


def token_exchange(
    idp_token_endpoint: str,
    id_token: str | Callable[[], Awaitable[str]],
    client_id: str | None = None,
    client_secret: str | None = None,
) -> IdentityAssertion:
    """Leg one of cross-app access (SEP-990): the user's ID token from the enterprise
    identity provider, exchanged there for an ID-JAG for one authorization server and
    resource (RFC 8693 token exchange).

    ``id_token`` is the token, or a coroutine that returns a current one (signing in
    to the IdP is the deployment's business). The IdP decides who may reach which
    MCP server; the authorization server then trades the ID-JAG for an access token.
    """

    async def assertion(audience: str, resource: str) -> str:
        subject = id_token if isinstance(id_token, str) else await id_token()
        form = {
            "grant_type": _TOKEN_EXCHANGE,
            "subject_token": subject,
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
            "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
            "audience": audience,
            "resource": resource,
        }
        if client_id and not client_secret:
            form["client_id"] = client_id
        auth = httpx2.BasicAuth(client_id, client_secret) if client_id and client_secret else None
        async with httpx2.AsyncClient(timeout=30.0, auth=auth) as http:
            answer = await http.post(idp_token_endpoint, data=form)
        if answer.status_code != 200:
            raise ConfigurationError(
                f"the identity provider refused the token exchange (HTTP {answer.status_code}); "
                "check the ID token and that this client may reach the MCP server"
            )
        issued = answer.json().get("access_token")
        if not isinstance(issued, str):
            raise ConfigurationError("the identity provider's token exchange answered no ID-JAG")
        return issued

    return assertion
