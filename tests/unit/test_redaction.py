"""Secrets never reach the text logs, events and Flower show (``kwargsrepr``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr

from toolexec.redaction import REDACTED, Secret, redact, secret_names, shown_kwargs
from toolexec.redaction import shown_kwargs as _shown
from toolexec.registry import Registry, tool
from toolexec.tasks.http import http_request


def _login_schema() -> dict[str, object]:
    registry = Registry()

    @tool(registry=registry)
    def login(
        user: str,
        token: Annotated[str, Field(description="API token."), Secret],
        password: SecretStr | None = None,
    ) -> str:
        """Log in."""
        return user

    spec = registry.get("login")
    assert spec is not None
    return spec.json_schema()


def test_secret_marker_shows_in_the_catalog_schema_so_clients_need_no_tool_code() -> None:
    """Annotated[str, Secret] keeps the description and adds writeOnly/password/x-secret."""
    token = _login_schema()["properties"]["token"]  # type: ignore[index]
    assert token["writeOnly"] is True and token["format"] == "password" and token["x-secret"]
    assert token["description"] == "API token."


def test_secret_names_come_from_the_marker_and_from_secretstr_even_when_optional() -> None:
    assert secret_names(_login_schema()) == {"token", "password"}


def test_secret_names_are_found_in_nested_models() -> None:
    schema = {
        "properties": {"auth": {"$ref": "#/$defs/Auth"}},
        "$defs": {"Auth": {"properties": {"key": {"type": "string", "writeOnly": True}}}},
    }
    assert secret_names(schema) == {"key"}


def test_marked_arguments_are_redacted_and_the_rest_is_shown() -> None:
    kwargs = {"arguments": {"user": "ada", "token": "tok-123"}, "context": {"call_id": "c1"}}
    shown = _shown(kwargs, secret_names(_login_schema()))
    assert "tok-123" not in shown
    assert shown == repr(
        {"arguments": {"user": "ada", "token": REDACTED}, "context": {"call_id": "c1"}}
    )


def test_credential_headers_of_http_request_are_redacted_whatever_their_case() -> None:
    """Authorization, Cookie and X-Api-Key are secrets without any schema marking."""
    headers = {
        "Authorization": "Bearer s3cret",
        "cookie": "session=s3cret",
        "X-API-Key": "s3cret",
        "Proxy-Authorization": "Basic s3cret",
        "Accept": "application/json",
    }
    arguments = {"url": "https://x.example/", "headers": headers, "params": {"api_key": "s3cret"}}
    schema = http_request.__toolexec__.json_schema()  # type: ignore[attr-defined]
    shown = shown_kwargs({"arguments": arguments}, secret_names(schema))
    assert "s3cret" not in shown
    assert "application/json" in shown and "https://x.example/" in shown


def test_redaction_does_not_change_the_arguments_the_tool_receives() -> None:
    arguments = {"headers": {"Authorization": "Bearer s3cret"}, "items": [{"password": "p"}]}
    assert redact(arguments) == {
        "headers": {"Authorization": REDACTED},
        "items": [{"password": REDACTED}],
    }
    assert arguments["headers"]["Authorization"] == "Bearer s3cret"


def test_ordinary_keys_that_merely_contain_a_credential_word_are_shown() -> None:
    """'token_count' or 'max_tokens' are not secrets; only exact credential names are."""
    shown = shown_kwargs({"arguments": {"max_tokens": 5, "token_count": 7, "passwords_seen": 1}})
    assert REDACTED not in shown


def test_arguments_without_secrets_are_shown_without_copying_them() -> None:
    """The common case stays cheap: nothing to hide, nothing copied."""
    arguments = {"url": "https://x.example/", "headers": {"Accept": "text/plain"}, "ids": [1, 2]}
    assert redact(arguments) is arguments


def test_secret_names_follow_a_changed_schema() -> None:
    """Cached per schema object, yet a new catalog entry with a new secret is seen."""
    first = {"properties": {"a": {"type": "string"}}}
    second = {"properties": {"a": {"type": "string", "writeOnly": True}}}
    assert secret_names(first) == frozenset() and secret_names(first) == frozenset()
    assert secret_names(second) == {"a"}
