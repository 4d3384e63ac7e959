"""Credentials recognised by their shape, not only by a list of names."""

from __future__ import annotations

import logging

import pydantic
import pytest

from toolexec.errors import ErrorType
from toolexec.redaction import REDACTED, is_credential_name, redact, scrub_text, shown_kwargs
from toolexec.registry import Registry, tool
from toolexec.results import ErrorInfo
from toolexec.validation import describe_validation_error, validate_against_schema
from toolexec.worker.logs import Scrubbed, oneline

CANARY = "cnry-7f3a9c1e"


@pytest.mark.parametrize(
    "name",
    ["X-Token", "X-Goog-Api-Key", "Private-Token", "pin", "pass", "accessToken", "api_key",
     "Authorization", "X-Amz-Signature", "client_secret", "sessionId", "X-Auth-Token", "PASSWORD"],
)  # fmt: skip
def test_credential_names_are_recognised_by_their_words(name: str) -> None:
    assert is_credential_name(name)


@pytest.mark.parametrize(
    "name",
    ["key", "cache_key", "author", "passport", "spin", "token_count", "max_tokens", "city",
     "password_policy", "compass", "keyword"],
)  # fmt: skip
def test_ordinary_names_are_shown(name: str) -> None:
    assert not is_credential_name(name)


@pytest.mark.parametrize(
    "text",
    [
        f"connection refused for https://ada:{CANARY}@api.example.com/v1",
        f"GET https://api.example.com/v1?city=Paris&token={CANARY}",
        f"GET https://maps.example.com/?key={CANARY}&q=x",
        f"GET https://blob.example.com/c?sv=1&sig={CANARY}",
        f"redirect to https://app.example.com/cb#access_token={CANARY}&x=1",
        f'HTTP Request: GET http://127.0.0.1:8/x?password={CANARY} "HTTP/1.1 503"',
        f"upstream said: Authorization: Bearer {CANARY}",
        f"login failed: password={CANARY}",
        f"https://{CANARY}@github.com/org/repo.git",
        f"upstream header Authorization: {CANARY}",
        f"the pin: {CANARY} was refused",
    ],
)
def test_scrub_text_masks_every_shape_of_credential_in_text(text: str) -> None:
    scrubbed = scrub_text(text)
    assert CANARY not in scrubbed
    assert REDACTED in scrubbed


def test_scrub_text_keeps_what_is_not_a_credential() -> None:
    text = "GET https://api.example.com/v1?city=Paris&units=metric took 3 ms; key: value"
    assert scrub_text(text) == text


def test_redact_masks_headers_body_keys_and_urls_inside_string_values() -> None:
    arguments = {
        "url": f"https://u:{CANARY}@h.example/?token={CANARY}",
        "headers": {"X-Token": CANARY, "X-Goog-Api-Key": CANARY, "Private-Token": CANARY},
        "json": {"pin": CANARY, "pass": CANARY, "city": "Paris"},
    }
    shown = shown_kwargs({"arguments": arguments, "context": {}})
    assert CANARY not in shown
    assert "Paris" in shown
    assert redact(arguments)["json"]["city"] == "Paris"


def test_error_messages_are_scrubbed_wherever_they_are_built() -> None:
    info = ErrorInfo(
        type=ErrorType.CONNECTION_ERROR,
        message=f"could not reach https://ada:{CANARY}@h.example/?api_key={CANARY}",
        details={"headers": {"Authorization": CANARY}},
    )
    assert CANARY not in info.model_dump_json()


def test_a_validation_failure_never_quotes_a_headers_object(registry: Registry) -> None:
    @tool(registry=registry)
    def fetch(url: str, headers: dict[str, int]) -> str:
        """Fetch."""
        return url

    spec = registry.get("fetch")
    assert spec is not None
    bad = {"url": "https://h.example", "headers": {"Authorization": f"Bearer {CANARY}", "X": "y"}}
    with pytest.raises(pydantic.ValidationError) as caught:
        spec.arguments.model_validate(bad)
    from_model = describe_validation_error(caught.value)
    schema = {
        "type": "object",
        "properties": {"headers": {"type": "object", "maxProperties": 1}},
    }
    from_schema = validate_against_schema(bad, schema)

    assert CANARY not in from_model
    assert from_schema is not None and CANARY not in from_schema
    assert "headers" in from_schema


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("httpx", logging.INFO, __file__, 1, msg, args, None)


def test_the_log_filter_scrubs_any_logger_and_keeps_one_line_per_record() -> None:
    record = _record('HTTP Request: %s %s "%s"', "GET", f"https://h/?token={CANARY}", "200 OK")
    forged = _record("call %s run=%s", "c1", "r1\nINFO call c2 status=ok")

    Scrubbed().filter(record)
    Scrubbed().filter(forged)

    assert CANARY not in record.getMessage()
    assert "\n" not in forged.getMessage()
    assert "r1\\nINFO call c2" in forged.getMessage()


def test_the_log_filter_scrubs_a_traceback() -> None:
    try:
        raise ConnectionError(f"https://u:{CANARY}@h.example/")
    except ConnectionError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    Scrubbed().filter(record)
    assert record.exc_text is not None
    assert CANARY not in record.exc_text
    assert "Traceback" in record.exc_text


def test_oneline_escapes_and_cuts() -> None:
    assert oneline("a\r\nb\x1b[2J") == "a\\r\\nb\\x1b[2J"
    assert len(oneline("x" * 500)) == 200
