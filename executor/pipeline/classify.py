"""Turn whatever a tool raised or returned into a classified failure.

Tools written against httpx need no error handling of their own: timeouts,
connection failures and error statuses are mapped here, with Retry-After read
from 429 and 503 responses. Anything unrecognised becomes ``tool_error``.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import sys
from collections.abc import Mapping

import pydantic

from toolexec.bounds import bounded_retry_after
from toolexec.errors import (
    ClientError,
    ForbiddenError,
    InvalidArgumentsError,
    NotFoundError,
    RateLimitedError,
    ToolConnectionError,
    ToolException,
    ToolTimeoutError,
    UnauthorizedError,
    UnavailableError,
)
from toolexec.validation import describe_validation_error

__all__ = ["classify_exception", "classify_response", "parse_retry_after"]

_MAX_BODY_IN_MESSAGE = 300

_PERMANENT_BY_STATUS: dict[int, type[ToolException]] = {
    400: InvalidArgumentsError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    422: InvalidArgumentsError,
    # 5xx that say the server will never do this, however often it is asked
    501: ClientError,  # Not Implemented: the method is not supported
    505: ClientError,  # HTTP Version Not Supported
}

_SUGGESTIONS: dict[type[ToolException], str] = {
    InvalidArgumentsError: "Check the arguments against the tool's schema and call again "
    "with corrected values.",
    UnauthorizedError: "The tool's credentials were rejected; do not retry. "
    "Tell the user access is not configured.",
    ForbiddenError: "The tool is not allowed to do this; do not retry. "
    "Choose another approach or ask the user.",
    NotFoundError: "The requested resource does not exist; "
    "check identifiers or search for the right one.",
    ClientError: "The service rejected the request; change the request rather than repeating it.",
    RateLimitedError: "The service is rate limiting; "
    "wait before calling again or reduce call volume.",
    UnavailableError: "The service is failing for now; try again later or use another source.",
}


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date.

    Within [0, a day] (:func:`toolexec.bounds.bounded_retry_after`): a header is
    written by whoever answers, and ``1e300`` must not reach a breaker's TTL.
    The deployment's own, lower cap is applied by the worker's layers.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return bounded_retry_after(seconds)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by name, whatever its case (a plain dict is not case-insensitive)."""
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def classify_response(
    status: int, headers: Mapping[str, str], body: str, url: str, now: float
) -> ToolException | None:
    """The failure an HTTP status means, or None for a success (< 400)."""
    if status < 400:
        return None
    snippet = body[:_MAX_BODY_IN_MESSAGE]
    message = f"HTTP {status} from {url}" + (f": {snippet}" if snippet else "")
    details = {"status_code": status}
    if status == 429 or (status >= 500 and status not in _PERMANENT_BY_STATUS):
        retry_after = parse_retry_after(_header(headers, "retry-after"), now)
        if status == 429:
            return RateLimitedError(
                message,
                retry_after=retry_after,
                suggestion=_SUGGESTIONS[RateLimitedError],
                details=details,
            )
        return UnavailableError(
            message,
            retry_after=retry_after,
            suggestion=_SUGGESTIONS[UnavailableError],
            details=details,
        )
    kind = _PERMANENT_BY_STATUS.get(status, ClientError)
    return kind(message, suggestion=_SUGGESTIONS[kind], details=details)


def _unfollowable(exc: BaseException) -> ToolException:
    """A URL or redirect the client will not follow: the same request fails the same way,
    so it is permanent, and it says nothing about the service's health (no breaker count)."""
    return ClientError(
        f"the request cannot be made: {type(exc).__name__}: {exc}",
        suggestion="The URL, or a redirect it answered with, is not a reachable http(s) "
        "URL; do not retry it. Use another URL.",
        details={"exception": type(exc).__name__},
    )


def _timed_out(exc: BaseException) -> ToolTimeoutError:
    return ToolTimeoutError(
        f"the tool timed out: {type(exc).__name__}: {exc}".rstrip(": "),
        suggestion="The service was too slow; try again later or narrow the request.",
    )


def _unreachable(exc: BaseException) -> ToolConnectionError:
    return ToolConnectionError(
        f"could not reach the service: {type(exc).__name__}: {exc}",
        suggestion="The service is unreachable; try again later or use another source.",
    )


def _classify_httpx(exc: BaseException, now: float) -> ToolException | None:
    """httpx's own exceptions, or None.

    httpx is looked up, not imported: a tool that raised one of its exceptions
    has imported it, and a process that only calls tools must not pay for it
    (importing httpx imports its command line's click and rich when installed).
    """
    httpx = sys.modules.get("httpx")
    if httpx is None:
        return None
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        return classify_response(
            response.status_code, response.headers, response.text, str(exc.request.url), now
        )
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.TooManyRedirects | httpx.InvalidURL):
        return _unfollowable(exc)
    if isinstance(exc, httpx.TimeoutException):
        return _timed_out(exc)
    if isinstance(exc, httpx.TransportError):
        return _unreachable(exc)
    return None


def classify_exception(exc: BaseException, now: float) -> ToolException:
    """The classified failure for an exception raised by a tool."""
    if isinstance(exc, ToolException):
        return exc
    found = _classify_httpx(exc, now)
    if found is not None:
        return found
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return _timed_out(exc)
    if isinstance(exc, ConnectionError):
        return _unreachable(exc)
    if isinstance(exc, pydantic.ValidationError):
        return InvalidArgumentsError(
            describe_validation_error(exc),
            suggestion=_SUGGESTIONS[InvalidArgumentsError],
        )
    return ToolException(
        f"the tool raised {type(exc).__name__}: {exc}",
        suggestion="This looks like a bug or an unexpected condition in the tool; "
        "do not repeat the same call unchanged.",
        details={"exception": type(exc).__name__},
    )
