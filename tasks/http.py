"""The built-in ``http_request`` tool: any HTTP call, classified like every tool.

Responses with error statuses become the typed failures of
:mod:`toolexec.pipeline.classify` (429 and 5xx retried with Retry-After honoured,
other 4xx returned to the model), so an agent can use a plain HTTP API
without a tool of its own. It refuses loopback, private, link-local and
cloud-metadata addresses unless ``TOOLEXEC_HTTP_ALLOW`` lists them
(:mod:`toolexec.egress`).

Whoever answers is not trusted either. The body is streamed and the download
stops at ``TOOLEXEC_HTTP_MAX_RESPONSE_BYTES`` (``result_too_large``), and the
``timeout`` argument bounds the whole request, connecting and every byte of the
body included, so a server that drips a kilobyte every few seconds cannot keep
it reading. The tool is ``async``: when its time is up the executor cancels it
on its event loop and the connection closes, where a thread could only be
abandoned and would go on downloading.
"""

from __future__ import annotations

import asyncio
import json
from functools import lru_cache
from typing import Annotated, Any, Literal

import httpx
from pydantic import Field

from toolexec.clock import SystemClock
from toolexec.egress import AsyncGuardedTransport, EgressPolicy
from toolexec.errors import ResultTooLargeError, ToolTimeoutError
from toolexec.pipeline.classify import classify_response
from toolexec.policies import RetryBudgetPolicy
from toolexec.registry import tool

__all__ = ["http_request", "read_capped"]

#: Response headers a model may need; the rest are noise in its context.
_KEPT_HEADERS = (
    "content-type",
    "content-length",
    "etag",
    "last-modified",
    "location",
    "retry-after",
    "x-ratelimit-remaining",
)


@lru_cache(maxsize=8)
def _egress(allowed: tuple[str, ...]) -> EgressPolicy:
    return EgressPolicy.parse(allowed)


def _limits() -> tuple[EgressPolicy, int]:
    """The worker's egress policy and response size limit, from its settings."""
    from toolexec.worker.app import app, settings_of

    settings = settings_of(app)
    return _egress(tuple(settings.http_allow)), settings.http_max_response_bytes


def _too_large(url: str, size: str, most: int) -> ResultTooLargeError:
    return ResultTooLargeError(
        f"the response from {url} is {size}, more than http_request reads "
        f"({most:,} bytes, TOOLEXEC_HTTP_MAX_RESPONSE_BYTES); the download was stopped",
        suggestion="Ask the API for less: a page, a filter, a range, or a smaller format.",
        details={"limit_bytes": most},
    )


async def read_capped(response: httpx.Response, most: int) -> bytes:
    """The (decoded) body, read chunk by chunk; stops as soon as it passes ``most`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > most:
        raise _too_large(str(response.url), f"{int(declared):,} bytes by its Content-Length", most)
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > most:
            raise _too_large(str(response.url), "larger than that", most)
        chunks.append(chunk)
    return b"".join(chunks)


async def _fetch(
    method: str,
    url: str,
    params: dict[str, str] | None,
    headers: dict[str, str] | None,
    body: Any,
    timeout: float,
) -> dict[str, Any]:
    policy, most = _limits()
    # trust_env=False: a proxy from the environment would connect past the guard.
    async with (
        httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=True,
            transport=AsyncGuardedTransport(policy),
            trust_env=False,
        ) as client,
        client.stream(method, url, params=params, headers=headers, json=body) as response,
    ):
        raw = await read_capped(response, most)
    text = raw.decode(response.encoding or "utf-8", errors="replace")
    failure = classify_response(
        response.status_code, response.headers, text, str(response.url), SystemClock().now()
    )
    if failure is not None:
        raise failure
    kept = {k: response.headers[k] for k in _KEPT_HEADERS if k in response.headers}
    out: dict[str, Any] = {"status": response.status_code, "headers": kept}
    if "json" in response.headers.get("content-type", ""):
        out["json"] = json.loads(text)
    else:
        out["text"] = text
    return out


# One breaker and one retry budget per host (http_request@api.example.com): a model that
# points the tool at a failing URL must not switch it, or its retries, off for every
# other agent and every other host.
@tool(
    timeout=30,
    max_attempts=3,
    breaker_key="url",
    retry_budget=RetryBudgetPolicy(key_argument="url"),
)
async def http_request(
    url: Annotated[str, Field(description="Absolute http(s) URL.", pattern=r"^https?://")],
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET",
    params: Annotated[dict[str, str] | None, Field(description="Query parameters.")] = None,
    headers: Annotated[dict[str, str] | None, Field(description="Request headers.")] = None,
    body: Annotated[Any, Field(description="JSON body, for POST/PUT/PATCH.")] = None,
    timeout: Annotated[
        float, Field(gt=0, le=120, description="Seconds for the whole request and response.")
    ] = 10.0,
) -> dict[str, Any]:
    """Make an HTTP request and return its status, main headers and JSON or text body."""
    try:
        async with asyncio.timeout(timeout):
            return await _fetch(method, url, params, headers, body, timeout)
    except TimeoutError:
        raise ToolTimeoutError(
            f"the request to {url} did not complete within {timeout:g} s "
            "(connecting, sending and reading the whole response)",
            suggestion="The service was too slow; try again later or ask for less at once.",
            details={"limit_s": timeout},
        ) from None
