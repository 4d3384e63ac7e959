"""Classified retries end to end: what is retried, how often, how far apart, and until when."""

from __future__ import annotations

import pytest
from integration_support import gaps, timed

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply

pytestmark = pytest.mark.integration


def test_503_twice_then_200_ends_ok_after_three_attempts(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a service failing twice with 503, the third attempt succeeds."""
    path = flaky.unique_path("flaky")
    url = flaky.script(path, Reply(503), Reply(503), Reply(200, {"temp": 21}))

    result = client.call("fetch", {"url": url}, timeout=20)

    assert result.status == "ok", result
    assert result.data == {"temp": 21}
    assert result.attempts == 3
    assert len(flaky.hits(path)) == 3


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ErrorType.INVALID_ARGUMENTS),
        (401, ErrorType.UNAUTHORIZED),
        (403, ErrorType.FORBIDDEN),
        (404, ErrorType.NOT_FOUND),
    ],
)
def test_permanent_http_status_ends_after_one_attempt(
    client: ToolClient, flaky: FlakyServer, status: int, kind: ErrorType
) -> None:
    """Given a service answering a 4xx that no retry can fix, the call ends after one hit."""
    path = flaky.unique_path(f"status-{status}")
    url = flaky.script(path, Reply(status, {"error": "no"}), Reply(200))

    result = client.call("fetch", {"url": url}, timeout=20)

    assert result.status == "error"
    assert result.error is not None
    assert result.error.type == kind
    assert result.error.retryable is False
    assert result.error.details == {"status_code": status}
    assert result.attempts == 1
    assert len(flaky.hits(path)) == 1


def test_429_with_retry_after_waits_at_least_that_long_before_the_next_hit(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a 429 with ``Retry-After: 1``, the retry reaches the service no sooner than 1 s.

    ``fetch``'s own backoff is at most 0.2 s, so only the header explains the wait.
    """
    path = flaky.unique_path("rate-limited")
    url = flaky.script(path, Reply(429, headers={"Retry-After": "1"}), Reply(200, {"n": 1}))

    result = client.call("fetch", {"url": url}, timeout=20)

    assert result.status == "ok", result
    assert result.attempts == 2
    [gap] = gaps(flaky.hits(path))
    assert 1.0 <= gap < 4.0, result


def test_transient_error_raised_by_a_tool_is_retried_up_to_max_attempts(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a tool that always raises TransientError, it runs max_attempts (3) times."""
    path = flaky.unique_path("transient")

    result = client.call("raise_transient", {"url": flaky.url + path}, timeout=20)

    assert result.error is not None
    assert result.error.type == ErrorType.UNAVAILABLE
    assert result.error.retryable is True
    assert "warming up" in result.error.message
    assert result.attempts == 3
    assert len(flaky.hits(path)) == 3


def test_transient_error_with_retry_after_spaces_the_attempts(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a tool asking for 0.5 s between tries (backoff 0.01 s), attempts are >= 0.5 s apart."""
    path = flaky.unique_path("transient-spaced")

    result = client.call(
        "raise_transient", {"url": flaky.url + path, "retry_after": 0.5}, timeout=20
    )

    assert result.attempts == 3
    assert result.error is not None
    assert result.error.retry_after == 0.5
    spacing = gaps(flaky.hits(path))
    assert len(spacing) == 2
    assert all(0.5 <= gap < 3.0 for gap in spacing), spacing
    assert result.timings.backoff_ms >= 1000, result


def test_unexpected_exception_is_tool_error_after_one_attempt(client: ToolClient) -> None:
    """Given a tool raising RuntimeError, the model gets tool_error at once, not retries."""
    result = client.call("crash", {"message": "disk on fire"}, timeout=20)

    assert result.error is not None
    assert result.error.type == ErrorType.TOOL_ERROR
    assert result.error.retryable is False
    assert "RuntimeError" in result.error.message
    assert "disk on fire" in result.error.message
    assert result.attempts == 1


def test_deadline_stops_retries_and_reports_the_last_error(
    client: ToolClient, flaky: FlakyServer, settings: Settings
) -> None:
    """Given an always-503 service and a tool allowed 10 attempts, a 1 s deadline ends it early.

    Backoff without jitter is 0.2, 0.4, 0.5 ... s, so attempts start at about
    0, 0.2 and 0.6 s (0.7 s with queueing) and a fourth would start at 1.1 s
    or later: past the deadline, so none is scheduled. The deadline sits
    about 0.25 s from either start, so a slow machine does not change the
    outcome; at 1.5 s the fourth start lands near the deadline and is
    sometimes cut short, ending with ``timeout`` as the last error. The
    worker's own verdict, carrying the last error, arrives before the client
    would give up at deadline + reply_grace.
    """
    path = flaky.unique_path("always-503")
    url = flaky.script(path, Reply(503, {"error": "down"}))

    result, took = timed(client.call, "fetch_patiently", {"url": url}, timeout=1.0)

    assert result.error is not None
    assert result.error.type == ErrorType.DEADLINE_EXCEEDED
    last = result.error.details["last_error"]
    if last["type"] != ErrorType.TIMEOUT:
        assert last["type"] == ErrorType.UNAVAILABLE
        assert "HTTP 503" in last["message"]
    # else a loaded machine started the last attempt just before the deadline, which cut
    # it short (the docstring's 1.5 s case, seen at 1 s in a clean-clone .ci/run, 2026-12-03)
    hits = len(flaky.hits(path))
    assert 2 <= hits < 10
    assert result.attempts == hits, result
    assert took < 1.0 + settings.reply_grace
