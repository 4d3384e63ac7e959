"""Tools of the operations tests (Celery-native commands, Flower, worker pools).

Each names its own queue, so the shared worker (which does not import this
module) never receives one of their messages, and none shares a breaker.
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import httpx

from toolexec import NotFoundError, tool
from toolexec.policies import BreakerPolicy
from toolexec.redaction import Secret

NO_BREAKER = BreakerPolicy(enabled=False)
OPS_QUEUE = "ops"
FAST_QUEUE = "pool-fast"
SLOW_QUEUE = "pool-slow"
AUTOSCALE_QUEUE = "pool-auto"


@tool(queue=OPS_QUEUE, timeout=5, breaker=NO_BREAKER)
def greet(name: str) -> str:
    """Say hello; always succeeds."""
    return f"hello {name}"


@tool(
    queue=OPS_QUEUE,
    timeout=5,
    max_attempts=4,
    backoff_base=0.05,
    backoff_cap=0.2,
    breaker=NO_BREAKER,
)
def fetch_with_token(
    url: str,
    token: Annotated[str, Secret],
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """GET a URL with a bearer token; 5xx answers are retried."""
    sent = {**(headers or {}), "Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=5) as client:
        return client.get(url, headers=sent)


@tool(queue=OPS_QUEUE, timeout=5, breaker=NO_BREAKER)
def lookup_order(order_id: str) -> dict[str, str]:
    """Look an order up; there are none, so it always fails with not_found."""
    raise NotFoundError(f"no order {order_id}", suggestion="Check the order id.")


@tool(queue=SLOW_QUEUE, timeout=30, max_attempts=1, breaker=NO_BREAKER)
def slow_report(seconds: float) -> str:
    """A slow tool: holds its worker slot for ``seconds``."""
    time.sleep(seconds)
    return "report ready"


@tool(queue=FAST_QUEUE, timeout=5, max_attempts=1, breaker=NO_BREAKER)
def quick_lookup(key: str) -> str:
    """A fast tool, on its own pool."""
    return key.upper()


@tool(queue=AUTOSCALE_QUEUE, timeout=10, max_attempts=1, breaker=NO_BREAKER)
def hold(seconds: float) -> int:
    """Hold a slot for ``seconds``; returns the process that served it (prefork children)."""
    time.sleep(seconds)
    return os.getpid()
