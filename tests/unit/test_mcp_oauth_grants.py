"""OAuth grants for a fleet: private_key_jwt and cross-app access, and their secrets hidden."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from mcp.client.auth.extensions.client_credentials import PrivateKeyJWTOAuthProvider
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider

from toolexec.errors import ConfigurationError
from toolexec.mcp.oauth import OAuth, auth_for

PEM = (
    ec.generate_private_key(ec.SECP256R1())
    .private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    .decode()
)


def test_a_jwt_client_gets_the_sdks_private_key_jwt_provider_and_hides_its_key() -> None:
    oauth = OAuth(
        grant="client_credentials",
        client_id="fleet",
        token_endpoint_auth_method="private_key_jwt",
        private_key=PEM,
        signing_algorithm="ES256",
    )
    assert isinstance(auth_for("http://127.0.0.1:1/mcp", oauth), PrivateKeyJWTOAuthProvider)
    assert "PRIVATE KEY" not in repr(oauth)


@pytest.mark.parametrize(
    "options",
    [
        {
            "grant": "client_credentials",
            "client_id": "fleet",
            "token_endpoint_auth_method": "private_key_jwt",
        },
        {"client_id": "fleet", "token_endpoint_auth_method": "private_key_jwt", "private_key": PEM},
        {
            "grant": "client_credentials",
            "token_endpoint_auth_method": "private_key_jwt",
            "private_key": PEM,
        },
        {"grant": "client_credentials", "client_id": "fleet"},
    ],
)
def test_an_incomplete_client_is_refused_at_declaration(options: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        OAuth(**options)  # type: ignore[arg-type]


async def _id_jag(audience: str, resource: str) -> str:
    return f"jag-for-{audience}-{resource}"


def test_cross_app_access_gets_the_sdks_identity_assertion_provider() -> None:
    oauth = OAuth(
        grant="identity_assertion",
        client_id="fleet",
        client_secret="s",
        issuer="http://127.0.0.1:2",
        identity_assertion=_id_jag,
    )
    assert isinstance(auth_for("http://127.0.0.1:1/mcp", oauth), IdentityAssertionOAuthProvider)


@pytest.mark.parametrize("missing", ["client_secret", "issuer", "identity_assertion"])
def test_cross_app_access_without_its_configuration_is_refused(missing: str) -> None:
    options = {
        "grant": "identity_assertion",
        "client_id": "fleet",
        "client_secret": "s",
        "issuer": "http://127.0.0.1:2",
        "identity_assertion": _id_jag,
    }
    del options[missing]
    with pytest.raises(ConfigurationError):
        OAuth(**options)  # type: ignore[arg-type]


def test_mcp_login_names_what_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``toolexec mcp login``: an unknown server, and no fleet store, are said in words."""
    from click.testing import CliRunner

    from toolexec.mcp import servers
    from toolexec.ops.cli import cli

    module = tmp_path / "login_tools.py"
    module.write_text(
        "from toolexec.mcp import mcp_server\n"
        "from toolexec.mcp.oauth import OAuth\n"
        "mcp_server('crm', 'http://127.0.0.1:9/mcp', oauth=OAuth())\n"
    )
    monkeypatch.delenv("TOOLEXEC_MCP_TOKEN_KEY", raising=False)
    monkeypatch.setattr(servers, "_declared", [])  # the module's server stays in this test
    runner = CliRunner()
    unknown = runner.invoke(cli, ["mcp", "login", "nope", "--tools", str(module)])
    assert unknown.exit_code != 0 and "no MCP server 'nope' is declared" in unknown.output
    assert "crm" in unknown.output
    no_key = runner.invoke(cli, ["mcp", "login", "crm", "--tools", str(module)])
    assert no_key.exit_code != 0 and "TOOLEXEC_MCP_TOKEN_KEY" in no_key.output


def test_a_token_is_due_a_margin_before_it_expires_and_never_without_an_expiry() -> None:
    from toolexec.mcp.tokens import refresh_due

    assert not refresh_due(1000.0, 939.0, 60.0)
    assert refresh_due(1000.0, 940.0, 60.0)
    assert refresh_due(1000.0, 2000.0, 60.0)
    assert not refresh_due(None, 2000.0, 60.0)
