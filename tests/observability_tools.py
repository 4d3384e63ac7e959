"""Tools of the status, metrics and structured-log tests, on a worker of their own."""

from __future__ import annotations

import time

import httpx

from toolexec import TransientError, tool
from toolexec.policies import BreakerPolicy

NO_BREAKER = BreakerPolicy(enabled=False)

#: A queue no worker of these tests consumes: calls routed there stay queued.
PARKED_QUEUE = "obs-parked"


@tool(timeout=5, max_attempts=4, backoff_base=0.01, backoff_cap=0.05, breaker=NO_BREAKER)
def obs_fetch(url: str) -> httpx.Response:
    """GET a URL; the executor classifies the response."""
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER)
def obs_hold(seconds: float) -> float:
    """Sleeps, so that a call is in flight for a while."""
    time.sleep(seconds)
    return seconds


@tool(
    timeout=5,
    max_attempts=1,
    breaker=BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=300.0),
)
def obs_breaking() -> None:
    """Always fails transiently; its breaker opens after two calls."""
    raise TransientError("the backend is down")


@tool(timeout=5, max_attempts=1, queue=PARKED_QUEUE, breaker=NO_BREAKER)
def obs_parked() -> str:
    """Routed to a queue nobody consumes here."""
    return "ran"


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER)
def obs_big(size: int) -> str:
    """A result too large to travel inline: it is stored and passed by reference."""
    return "x" * size
