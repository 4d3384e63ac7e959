"""The tools of ``toolexec demo``, written the way an agent builder writes tools.

They call a plain HTTP service with httpx and do no error handling of their
own: ``raise_for_status`` and httpx's timeouts are enough, because the
executor classifies what they raise (503 and 429 retried, Retry-After
honoured, 404 handed back to the model) and enforces each tool's time limit.

The service's address is read from :data:`SERVICE_URL_ENV` at call time, not
at import: the worker is another process, and its environment is the only
channel the demo has to it.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal
from urllib.parse import quote

import httpx
from pydantic import Field

from toolexec.breaker import BreakerPolicy
from toolexec.errors import ToolException
from toolexec.registry import tool

__all__ = ["SERVICE_URL_ENV", "get_weather", "query_order"]

#: Where the demo tells its worker the local service listens.
SERVICE_URL_ENV = "TOOLEXEC_DEMO_SERVICE_URL"

#: httpx's own limit: longer than the tools' executor limits, so the executor's
#: limit is the one the demo shows, but short enough that an abandoned request
#: does not linger.
_HTTP_TIMEOUT_S = 2.0


def _service_url(path: str) -> str:
    base = os.environ.get(SERVICE_URL_ENV)
    if not base:
        raise ToolException(
            f"{SERVICE_URL_ENV} is not set; these tools only work under `toolexec demo`",
            suggestion="Do not call this tool again; it is not configured here.",
        )
    return base.rstrip("/") + path


def _get_json(path: str) -> Any:
    with httpx.Client(timeout=_HTTP_TIMEOUT_S) as http:
        response = http.get(_service_url(path))
        response.raise_for_status()
    return response.json()


#: The demo stages five failures of get_weather on purpose (two 503s, three timeouts)
#: among a dozen calls; the default breaker (50% of at least 10 calls) would open
#: on what the script itself arranged and refuse the fan-out that follows.
_DEMO_BREAKER = BreakerPolicy(consecutive_failures=10, failure_rate=None)


@tool(timeout=1.0, max_attempts=3, backoff_base=0.2, backoff_cap=1.0, breaker=_DEMO_BREAKER)
def get_weather(
    city: Annotated[str, Field(description="City name, e.g. 'Oslo'.")],
    unit: Literal["c", "f"] = "c",
) -> dict[str, Any]:
    """Current weather in a city: temperature in the unit asked for, and conditions."""
    report = _get_json(f"/weather/{quote(city)}")
    celsius = float(report["temp_c"])
    temperature = celsius if unit == "c" else round(celsius * 9 / 5 + 32, 1)
    return {
        "city": city,
        "temperature": temperature,
        "unit": unit,
        "conditions": report["conditions"],
    }


@tool(timeout=3.0, max_attempts=3, backoff_base=0.2, backoff_cap=2.0)
def query_order(
    order_id: Annotated[str, Field(description="Order id as the customer gave it, e.g. 'A-1001'.")],
) -> dict[str, Any]:
    """Look up an order: its status, items and expected delivery date."""
    order: dict[str, Any] = _get_json(f"/orders/{quote(order_id)}")
    return order
