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

from toolexec.errors import ToolException
from toolexec.fallback import Alternative
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy
from toolexec.registry import tool

__all__ = [
    "SERVICE_URL_ENV",
    "check_stock",
    "create_order",
    "fetch_logs",
    "get_weather",
    "list_reviews",
    "query_order",
    "search_products",
    "search_products_lite",
]

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


def _post_json(path: str, body: dict[str, Any]) -> Any:
    with httpx.Client(timeout=_HTTP_TIMEOUT_S) as http:
        response = http.post(_service_url(path), json=body)
        response.raise_for_status()
    return response.json()


#: get_weather's limit (1.5 s) leaves the fan-out's 0.5 s answers a second to spare on a
#: loaded machine, and still cuts the 3 s one short. The demo (and
#: examples/agent_loop.py) make get_weather fail on purpose; the
#: default breaker (50% of at least 10 calls) must not open on what the script itself
#: arranged and refuse the fan-out that follows.
_DEMO_BREAKER = BreakerPolicy(consecutive_failures=10, failure_rate=None)


@tool(timeout=1.5, max_attempts=3, backoff_base=0.2, backoff_cap=1.0, breaker=_DEMO_BREAKER)
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


#: Opens after two failed calls in a row, so the demo shows the third failing fast; after
#: 1.5 s open it lets one probe through, and one probe that succeeds closes it again.
#: ``max_wait_s=0``: a call that meets the open breaker is answered at once instead of
#: waiting for the probe (the default lets a first trip be waited out for up to 2 s).
_STOCK_BREAKER = BreakerPolicy(
    consecutive_failures=2,
    failure_rate=None,
    open_s=1.5,
    half_open_probes=1,
    close_after=1,
    max_wait_s=0,
)


@tool(timeout=1.0, max_attempts=1, breaker=_STOCK_BREAKER)
def check_stock(
    sku: Annotated[str, Field(description="Product code, e.g. 'SKU-7'.")],
) -> dict[str, Any]:
    """How many of a product are in stock, per warehouse."""
    stock: dict[str, Any] = _get_json(f"/stock/{quote(sku)}")
    return stock


@tool(timeout=1.0, max_attempts=2, backoff_base=0.1, backoff_cap=0.2)
def search_products_lite(query: str) -> list[dict[str, Any]]:
    """A smaller product index, refreshed hourly: what search_products falls back to."""
    hits: list[dict[str, Any]] = _get_json(f"/search-lite/{quote(query)}")
    return hits


@tool(
    timeout=1.0,
    max_attempts=2,
    backoff_base=0.1,
    backoff_cap=0.2,
    fallbacks=[Alternative("search_products_lite")],
)
def search_products(
    query: Annotated[str, Field(description="What the customer is looking for.")],
) -> list[dict[str, Any]]:
    """Search the product catalogue; the best matches first."""
    hits: list[dict[str, Any]] = _get_json(f"/search/{quote(query)}")
    return hits


#: Retries of list_reviews, all workers together: 2 in 30 s however many calls fail (the
#: demo's outage would otherwise triple the load on a service that is already down).
_REVIEWS_BUDGET = RetryBudgetPolicy(ratio=0.0, min_retries=2, window_s=30)


@tool(
    timeout=1.0,
    max_attempts=3,
    backoff_base=0.05,
    backoff_cap=0.1,
    retry_budget=_REVIEWS_BUDGET,
    breaker=BreakerPolicy(enabled=False),
)
def list_reviews(
    sku: Annotated[str, Field(description="Product code, e.g. 'SKU-7'.")],
) -> list[dict[str, Any]]:
    """Customer reviews of a product, newest first."""
    reviews: list[dict[str, Any]] = _get_json(f"/reviews/{quote(sku)}")
    return reviews


@tool(timeout=2.0, max_attempts=2, backoff_base=0.1, backoff_cap=0.2, side_effects=True)
def create_order(
    order_id: Annotated[str, Field(description="A new order id, e.g. 'C-3003'.")],
    sku: str,
    quantity: int = 1,
) -> dict[str, Any]:
    """Place an order. Runs at most once per run and arguments, however often it is asked."""
    order: dict[str, Any] = _post_json(
        "/orders", {"order_id": order_id, "sku": sku, "quantity": quantity}
    )
    return order


@tool(timeout=3.0, max_attempts=1)
def fetch_logs(
    service: Annotated[str, Field(description="Service whose recent log lines to read.")],
) -> str:
    """The service's log of the last hour, as text (it can be long)."""
    lines: list[str] = _get_json(f"/logs/{quote(service)}")
    return "\n".join(lines)
