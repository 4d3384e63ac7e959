"""The built-in ``http_request`` tool: any HTTP call, classified like every tool.

Responses with error statuses become the typed failures of
:mod:`toolexec.classify` (429 and 5xx retried with Retry-After honoured,
other 4xx returned to the model), so an agent can use a plain HTTP API
without a tool of its own. It refuses loopback, private, link-local and
cloud-metadata addresses unless ``TOOLEXEC_HTTP_ALLOW`` lists them
(:mod:`toolexec.egress`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal

import httpx
from pydantic import Field

from toolexec.classify import classify_response
from toolexec.clock import SystemClock
from toolexec.egress import EgressPolicy, GuardedTransport
from toolexec.registry import tool

__all__ = ["http_request"]

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


def _guarded() -> GuardedTransport:
    """A transport that refuses internal addresses unless ``TOOLEXEC_HTTP_ALLOW`` lists them."""
    from toolexec.app import app, settings_of

    return GuardedTransport(_egress(tuple(settings_of(app).http_allow)))


# One breaker per host (http_request@api.example.com): a model that points the tool at
# a failing URL must not switch it off for every other agent and every other host.
@tool(timeout=30, max_attempts=3, breaker_key="url")
def http_request(
    url: Annotated[str, Field(description="Absolute http(s) URL.", pattern=r"^https?://")],
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET",
    params: Annotated[dict[str, str] | None, Field(description="Query parameters.")] = None,
    headers: Annotated[dict[str, str] | None, Field(description="Request headers.")] = None,
    body: Annotated[Any, Field(description="JSON body, for POST/PUT/PATCH.")] = None,
    timeout: Annotated[float, Field(gt=0, le=120, description="Seconds for the request.")] = 10.0,
) -> dict[str, Any]:
    """Make an HTTP request and return its status, main headers and JSON or text body."""
    # trust_env=False: a proxy from the environment would connect past the guard.
    with httpx.Client(
        timeout=timeout, follow_redirects=True, transport=_guarded(), trust_env=False
    ) as client:
        response = client.request(method, url, params=params, headers=headers, json=body)
    failure = classify_response(
        response.status_code,
        response.headers,
        response.text,
        str(response.url),
        SystemClock().now(),
    )
    if failure is not None:
        raise failure
    kept = {k: response.headers[k] for k in _KEPT_HEADERS if k in response.headers}
    out: dict[str, Any] = {"status": response.status_code, "headers": kept}
    if "json" in response.headers.get("content-type", ""):
        out["json"] = response.json()
    else:
        out["text"] = response.text
    return out
