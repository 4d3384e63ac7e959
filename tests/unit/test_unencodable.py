"""Text that is not valid Unicode in a call's arguments, and the errors that could quote it.

A lone UTF-16 surrogate (``"\\ud800"`` in a model's JSON) is refused as
``invalid_arguments`` naming the field, never hashed into an error; and an
unexpected exception's text is masked of the call's arguments before Celery
shows it (tests/security/test_secret_canary.py runs the same through a worker).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest

from toolexec.bounds import text_problem
from toolexec.client.prepare import parse_arguments
from toolexec.normalize import arguments_hash, canonical_json
from toolexec.tasks.tool_task import InternalFailure, internal_message

SECRET = "s3cr3t-k3y-0123456789"


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ({"q": "\ud800"}, "q holds"),
        ({"params": {"api_key": SECRET, "q": "x\udfffy"}}, "params.q holds"),
        ({"items": ["ok", {"deep": ["\udbff"]}]}, "items.1.deep.0 holds"),
        ({"h": {"X-\ud800": "v"}}, "h.X-\\ud800 (the key itself) holds"),
        ({"pair": "\ud83d\ude00"}, "pair holds"),  # a pair in a Python str is still two halves
    ],
)
def test_a_lone_surrogate_is_found_and_its_field_named(arguments: Any, where: str) -> None:
    problem = text_problem(arguments)
    assert problem is not None and where in problem
    assert SECRET not in problem
    problem.encode()  # the message itself is valid text


@pytest.mark.parametrize("arguments", [{}, {"q": "Grüße 😀 東京"}, {"n": [1, 2.5, None, True]}])
def test_valid_text_passes(arguments: Any) -> None:
    assert text_problem(arguments) is None


def test_a_models_json_escape_is_refused_and_a_real_pair_is_not() -> None:
    lone, problem = parse_arguments('{"q": "\\ud800", "api_key": "' + SECRET + '"}', 10**6)
    pair, fine = parse_arguments('{"q": "\\ud83d\\ude00"}', 10**6)
    assert lone is None and problem is not None and "q holds" in problem
    assert SECRET not in problem
    assert pair == {"q": "😀"} and fine is None


def test_the_arguments_digest_never_raises_and_valid_text_keeps_its_digest() -> None:
    text = {"city": "Zürich", "emoji": "😀"}
    expected = hashlib.sha256(f"t\0{canonical_json(text)}".encode()).hexdigest()
    assert arguments_hash("t", text) == expected
    assert arguments_hash("t", {"q": "\ud800"}) != arguments_hash("t", {"q": "\udc00"})


def test_an_unexpected_exceptions_text_is_masked_of_the_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ``UnicodeEncodeError``'s repr quotes the whole text; what Celery sees does not."""
    arguments = {"params": {"api_key": SECRET, "q": "\ud800"}, "headers": {"X": f"Bearer {SECRET}"}}
    text = canonical_json(arguments)
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        assert SECRET in repr(exc)  # what used to reach the log, the event and Flower
        with caplog.at_level(logging.ERROR, logger="toolexec.worker"):
            message = internal_message(exc, arguments, "running t")
        raised = InternalFailure(message)
    assert "UnicodeEncodeError" in message and "surrogates not allowed" in message
    assert SECRET not in message and SECRET not in repr(raised)
    assert SECRET not in caplog.text and "Traceback (values withheld)" in caplog.text


@pytest.mark.parametrize(
    "exc",
    [
        KeyError(SECRET),
        ValueError(f"cannot send {{'api_key': '{SECRET}', 'q': 'x'}}"),
        RuntimeError(f'bad JSON: {{"token":"{SECRET}"}}'),
    ],
    ids=["key-error", "repr-of-dict", "json-of-dict"],
)
def test_an_exception_quoting_an_argument_value_is_masked(exc: Exception) -> None:
    message = internal_message(exc, {"params": {"api_key": SECRET, "q": "x"}}, "running t")
    assert SECRET not in message
    assert type(exc).__name__ in message


def test_a_run_id_with_a_lone_surrogate_is_a_usage_error() -> None:
    """An id becomes part of Redis keys, which are encoded as UTF-8."""
    from toolexec.bounds import checked_id
    from toolexec.errors import UsageError

    with pytest.raises(UsageError):
        checked_id("run-\ud800", "run_id")
