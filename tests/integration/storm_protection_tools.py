"""Tools only test_storm_protections' own workers import, on a queue nobody else consumes.

Each tool's budget, limit and fault sequence is its own, so the tests cannot
disturb one another (nor the shared worker's tools) through Redis.
"""

from __future__ import annotations

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy, RateLimitPolicy, RetryBudgetPolicy

QUEUE = "storm"
NO_BREAKER = BreakerPolicy(enabled=False)
#: 10% of the calls of the last minute, at least 3: a minute outlasts the test.
BUDGET = RetryBudgetPolicy(ratio=0.1, window_s=60.0, min_retries=3)
#: Five calls a second for the whole fleet, one at a time.
FIVE_PER_S = RateLimitPolicy(rate=5, burst=1)


def _get(url: str) -> httpx.Response:
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(
    timeout=5,
    max_attempts=4,
    backoff_base=0.01,
    backoff_cap=0.05,
    breaker=NO_BREAKER,
    retry_budget=BUDGET,
    queue=QUEUE,
)
def budgeted_fetch(url: str) -> httpx.Response:
    """GET a URL, retrying 5xx up to 4 attempts within the tool's retry budget."""
    return _get(url)


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER, rate_limit=FIVE_PER_S, queue=QUEUE)
def limited_fetch(url: str) -> httpx.Response:
    """GET a URL at most five times a second across all workers; never retried."""
    return _get(url)


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER, queue=QUEUE)
def chaotic_fetch(url: str) -> httpx.Response:
    """GET a URL; the tests inject faults into it."""
    return _get(url)
