"""Tools the integration tests run on real workers; each talks to the FlakyServer."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import httpx

from toolexec import Jitter, TransientError, tool
from toolexec.policies import BreakerPolicy

#: These tools serve many failing scenarios in one session; a breaker opened by one
#: test would refuse the next. Breakers are tested with tools of their own.
NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=5, max_attempts=4, backoff_base=0.05, backoff_cap=0.2, breaker=NO_BREAKER)
def fetch(url: str) -> httpx.Response:
    """GET a URL; the executor classifies the response."""
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(
    timeout=5,
    max_attempts=10,
    backoff_base=0.2,
    backoff_cap=0.5,
    jitter=Jitter.NONE,
    breaker=NO_BREAKER,
)
def fetch_patiently(url: str) -> httpx.Response:
    """GET a URL with many attempts, to show the deadline stops them."""
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(timeout=5, max_attempts=3, breaker=NO_BREAKER)
def record(url: str, count: int, unit: Literal["c", "f"] = "c") -> dict[str, object]:
    """POST to a URL; used to prove that invalid arguments never reach the body."""
    with httpx.Client(timeout=5) as client:
        client.post(url, json={"count": count, "unit": unit})
    return {"count": count, "unit": unit}


@tool(timeout=0.5, max_attempts=2, backoff_base=0.01, backoff_cap=0.01, breaker=NO_BREAKER)
def stubborn(seconds: float) -> str:
    """Ignores cancellation: sleeps in a thread that cannot be interrupted."""
    time.sleep(seconds)
    return "woke up"


@tool(timeout=0.5, max_attempts=1, breaker=NO_BREAKER)
async def async_sleep(seconds: float) -> str:
    """An async tool: cancelled at its time limit."""
    await asyncio.sleep(seconds)
    return "slept"


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER)
def pause(seconds: float) -> float:
    """Sleeps, for fan-out timing."""
    time.sleep(seconds)
    return seconds


@tool(timeout=5, max_attempts=3, backoff_base=0.01, backoff_cap=0.01, breaker=NO_BREAKER)
def raise_transient(retry_after: float | None = None, url: str | None = None) -> None:
    """Always fails transiently, as a tool author would signal it.

    With ``url``, each attempt first POSTs there, so a test can time the attempts.
    """
    if url:
        with httpx.Client(timeout=5) as client:
            client.post(url)
    raise TransientError("the backend is warming up", retry_after=retry_after)


@tool(timeout=5, max_attempts=3, breaker=NO_BREAKER)
def crash(message: str) -> None:
    """An unexpected exception: tool_error, not retried."""
    raise RuntimeError(message)
