"""Issue 22, item 8: the redaction rule, for the names it missed and the one it over-masked.

Before: an ``X-Session`` header, ``ssn``, ``card_number`` and ``cvv`` body keys
and a URL's ``session=`` parameter showed in the text Celery puts in its log
lines, its events and Flower (``kwargsrepr``) and in worker log lines; and a
query parameter named ``key`` was masked whatever it held, so a log line read
``/flaky?key=***`` for a lookup key. The rule now (docs/security.md): these
names are credentials by their words, and ``key``, ``code`` and ``s`` in a
URL are masked when their value has a token's shape. The same shapes go
through a real worker and Flower in test_secret_canary.py.
"""

from __future__ import annotations

import logging

import pytest

from toolexec.redaction import REDACTED, redact, scrub_text, shown_kwargs
from toolexec.worker.logs import Scrubbed

SECRET = "k7Qz9x2LmP4v"


def _log_line(message: str) -> str:
    """A log record as the worker's handlers write it."""
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, message, None, None)
    Scrubbed().filter(record)
    return record.getMessage()


def test_session_and_payment_fields_are_masked_where_celery_and_flower_show_arguments() -> None:
    arguments = {
        "url": f"https://shop.example/api?session={SECRET}&q=shoes",
        "headers": {"X-Session": SECRET, "Accept": "application/json"},
        "body": {"ssn": SECRET, "card_number": SECRET, "cvv": SECRET, "credit_card": SECRET,
                 "security_code": SECRET, "name": "Ada"},
    }  # fmt: skip
    shown = shown_kwargs({"arguments": arguments, "context": {}})
    assert SECRET not in shown
    assert "Ada" in shown and "shoes" in shown and "application/json" in shown


@pytest.mark.parametrize(
    "message",
    [
        f"HTTP Request: GET https://shop.example/cart?session={SECRET} 200",
        f"upstream said X-Session: {SECRET}",
        f"GET https://maps.example/api?key=AIza{SECRET}&q=x",
        f"OAuth redirect https://app.example/cb?code={SECRET}&state=1",
    ],
)
def test_a_credential_in_a_log_line_is_masked(message: str) -> None:
    line = _log_line(message)
    assert SECRET not in line and REDACTED in line


@pytest.mark.parametrize(
    "message",
    [
        "HTTP Request: GET http://127.0.0.1:8000/flaky?key=orders 503",
        "HTTP Request: GET http://127.0.0.1:8000/flaky?key=user-42 200",
        "GET https://blog.example/?s=weather+paris 200",
        "GET https://shop.example/checkout?code=SUMMER 200",
        "GET https://s3.example/bucket?key=reports/2024/q1.csv 200",
    ],
)
def test_a_lookup_key_code_or_search_is_shown_as_it_is(message: str) -> None:
    assert _log_line(message) == message


def test_names_about_a_credential_stay_shown() -> None:
    fields = {"session_timeout": 30, "card_type": "visa", "card": "board-7", "key": "orders"}
    assert redact(fields) == fields
    assert scrub_text("session_count=3") == "session_count=3"
