"""Every failure a tool can meet maps to one ErrorType and a retryable flag."""

from __future__ import annotations

import email.utils
from collections.abc import Callable

import httpx
import pydantic
import pytest

from toolexec.errors import (
    ErrorType,
    NotFoundError,
    RateLimitedError,
    ToolException,
    TransientError,
    UnavailableError,
)
from toolexec.pipeline.classify import classify_exception, classify_response, parse_retry_after

NOW = 1_700_000_000.0
URL = "http://svc.test/items"


def _response(status: int, headers: dict[str, str] | None = None, body: str = "") -> ToolException:
    found = classify_response(status, httpx.Headers(headers or {}), body, URL, NOW)
    assert found is not None, f"HTTP {status} was not classified as a failure"
    return found


def _raised_by_client(handler: Callable[[httpx.Request], httpx.Response]) -> Exception:
    """The exception a real httpx call raises when its transport behaves as ``handler``."""
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        try:
            client.get(URL).raise_for_status()
        except Exception as exc:
            return exc
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize(
    ("status", "error_type", "retryable"),
    [
        (400, ErrorType.INVALID_ARGUMENTS, False),
        (401, ErrorType.UNAUTHORIZED, False),
        (403, ErrorType.FORBIDDEN, False),
        (404, ErrorType.NOT_FOUND, False),
        (409, ErrorType.CLIENT_ERROR, False),
        (410, ErrorType.CLIENT_ERROR, False),
        (422, ErrorType.INVALID_ARGUMENTS, False),
        (429, ErrorType.RATE_LIMITED, True),
        (500, ErrorType.UNAVAILABLE, True),
        (502, ErrorType.UNAVAILABLE, True),
        (503, ErrorType.UNAVAILABLE, True),
        (504, ErrorType.UNAVAILABLE, True),
    ],
)
def test_error_statuses_map_to_their_error_type(
    status: int, error_type: ErrorType, retryable: bool
) -> None:
    failure = _response(status, body="nope")
    assert failure.error_type is error_type
    assert failure.retryable is retryable
    assert failure.details == {"status_code": status}
    assert f"HTTP {status} from {URL}: nope" == failure.message
    assert failure.suggestion, "every classified failure tells the model what to do next"


@pytest.mark.parametrize("status", [200, 201, 204, 301, 302, 304, 399])
def test_success_and_redirect_statuses_are_not_failures(status: int) -> None:
    assert classify_response(status, httpx.Headers(), "", URL, NOW) is None


def test_a_long_body_is_cut_in_the_message() -> None:
    failure = _response(500, body="x" * 5000)
    assert len(failure.message) < 400
    assert failure.message.endswith("x" * 300)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_in_seconds_is_read_from_429_and_503(status: int) -> None:
    failure = _response(status, {"Retry-After": "7"})
    assert isinstance(failure, TransientError)
    assert failure.retry_after == 7.0


def test_retry_after_is_ignored_on_permanent_statuses() -> None:
    failure = _response(404, {"Retry-After": "7"})
    assert isinstance(failure, NotFoundError)
    assert not hasattr(failure, "retry_after")


def test_a_429_without_retry_after_has_none() -> None:
    failure = _response(429)
    assert isinstance(failure, RateLimitedError) and failure.retry_after is None


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("120", 120.0), (" 3 ", 3.0), ("0", 0.0), ("1.5", 1.5), ("-5", 0.0)],
)
def test_retry_after_in_seconds(header: str, seconds: float) -> None:
    assert parse_retry_after(header, NOW) == seconds


def test_retry_after_as_an_http_date_counts_from_now() -> None:
    header = email.utils.formatdate(NOW + 90, usegmt=True)
    assert parse_retry_after(header, NOW) == pytest.approx(90.0)
    assert parse_retry_after(header, NOW + 30) == pytest.approx(60.0)


def test_retry_after_as_a_past_http_date_is_zero() -> None:
    assert parse_retry_after(email.utils.formatdate(NOW - 600, usegmt=True), NOW) == 0.0


def test_an_http_date_retry_after_reaches_the_classified_failure() -> None:
    failure = _response(503, {"Retry-After": email.utils.formatdate(NOW + 42, usegmt=True)})
    assert isinstance(failure, UnavailableError)
    assert failure.retry_after == pytest.approx(42.0)


@pytest.mark.parametrize("header", [None, "", "soon", "nan", "inf", "-inf", "Tomorrow, 3pm"])
def test_garbage_retry_after_is_none(header: str | None) -> None:
    assert parse_retry_after(header, NOW) is None


def _connect_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectTimeout("connect timed out", request=request)


def _read_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("read timed out", request=request)


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _hung_up(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("server disconnected", request=request)


@pytest.mark.parametrize(
    ("handler", "error_type"),
    [
        (_connect_timeout, ErrorType.TIMEOUT),
        (_read_timeout, ErrorType.TIMEOUT),
        (_refused, ErrorType.CONNECTION_ERROR),
        (_hung_up, ErrorType.CONNECTION_ERROR),
    ],
)
def test_httpx_transport_failures_are_transient(
    handler: Callable[[httpx.Request], httpx.Response], error_type: ErrorType
) -> None:
    raised = _raised_by_client(handler)
    failure = classify_exception(raised, NOW)
    assert failure.error_type is error_type
    assert failure.retryable
    assert type(raised).__name__ in failure.message


def test_raise_for_status_on_a_503_is_unavailable_with_retry_after() -> None:
    raised = _raised_by_client(
        lambda request: httpx.Response(503, headers={"Retry-After": "4"}, text="overloaded")
    )
    assert isinstance(raised, httpx.HTTPStatusError)
    failure = classify_exception(raised, NOW)
    assert isinstance(failure, UnavailableError)
    assert failure.retry_after == 4.0
    assert URL in failure.message and "overloaded" in failure.message


def test_raise_for_status_on_a_404_is_not_found() -> None:
    raised = _raised_by_client(lambda request: httpx.Response(404))
    failure = classify_exception(raised, NOW)
    assert failure.error_type is ErrorType.NOT_FOUND and not failure.retryable


def test_an_http_status_error_built_by_hand_is_classified_by_its_response() -> None:
    request = httpx.Request("POST", URL)
    response = httpx.Response(429, headers={"Retry-After": "2"}, request=request)
    exc = httpx.HTTPStatusError("too many", request=request, response=response)
    failure = classify_exception(exc, NOW)
    assert isinstance(failure, RateLimitedError) and failure.retry_after == 2.0


@pytest.mark.parametrize(
    ("exc", "error_type"),
    [
        (TimeoutError("slow"), ErrorType.TIMEOUT),
        (ConnectionError("reset"), ErrorType.CONNECTION_ERROR),
        (ConnectionRefusedError("refused"), ErrorType.CONNECTION_ERROR),
    ],
)
def test_builtin_timeouts_and_connection_errors_are_transient(
    exc: Exception, error_type: ErrorType
) -> None:
    failure = classify_exception(exc, NOW)
    assert failure.error_type is error_type and failure.retryable


class _Point(pydantic.BaseModel):
    x: int


def test_a_pydantic_validation_error_is_invalid_arguments_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        _Point.model_validate({"x": "many"})
    failure = classify_exception(caught.value, NOW)
    assert failure.error_type is ErrorType.INVALID_ARGUMENTS
    assert not failure.retryable
    assert "x:" in failure.message and '"many"' in failure.message


def test_an_unknown_exception_is_a_tool_error_not_worth_retrying() -> None:
    failure = classify_exception(RuntimeError("division went wrong"), NOW)
    assert type(failure) is ToolException
    assert failure.error_type is ErrorType.TOOL_ERROR
    assert not failure.retryable
    assert "RuntimeError" in failure.message and "division went wrong" in failure.message
    assert failure.details == {"exception": "RuntimeError"}


def test_a_tool_exception_passes_through_unchanged() -> None:
    original = RateLimitedError("slow down", retry_after=9.0, details={"bucket": "search"})
    assert classify_exception(original, NOW) is original


def test_retry_after_is_found_in_a_plain_dict_whatever_its_case() -> None:
    """Tools may pass plain dicts; header names are case-insensitive all the same."""
    failure = classify_response(503, {"Retry-After": "7"}, "", URL, NOW)
    assert failure is not None
    assert failure.retry_after == 7.0  # type: ignore[attr-defined]
