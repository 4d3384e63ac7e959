"""Tools with fallback chains, run by workers that tests/integration/test_fallback.py starts.

All live on :data:`QUEUE`, which only those workers consume. Each tool GETs a
FlakyServer URL the test scripts, so the service's hit log shows which step
of a chain ran and which never did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from toolexec import tool
from toolexec.fallback import Alternative, Explain, LastGood
from toolexec.policies import BreakerPolicy

QUEUE = "fallback"
INSTEAD = "Tell the user the forecast service is down and suggest a weather website."

#: Most chains here must not be cut short by a breaker opened in an earlier test.
NO_BREAKER = BreakerPolicy(enabled=False)

#: ``forecast_guarded``: open after two failures, for long enough to test with.
GUARDED = BreakerPolicy(
    consecutive_failures=2, failure_rate=None, open_s=60, probe_lease_s=60, close_after=1
)


def _get(url: str) -> Any:
    with httpx.Client(timeout=4) as client:
        return client.get(url)


def to_lite(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The lite forecast takes a place and its own URL."""
    return {"place": arguments["city"], "url": arguments["lite_url"]}


@tool(
    timeout=5, queue=QUEUE, max_attempts=2, backoff_base=0.05, backoff_cap=0.05, breaker=NO_BREAKER
)
def forecast_lite(place: str, url: str) -> Any:
    """Today's weather only: the cheap variant."""
    return _get(url)


@tool(timeout=5, queue=QUEUE, max_attempts=1, breaker=NO_BREAKER)
def forecast_slow_lite(place: str, url: str) -> Any:
    """A lite variant that may take its whole 5 s: skipped when less time is left."""
    return _get(url)


@tool(
    timeout=5,
    queue=QUEUE,
    max_attempts=2,
    backoff_base=0.05,
    backoff_cap=0.05,
    breaker=NO_BREAKER,
    fallbacks=[
        Alternative("forecast_lite", arguments=to_lite),
        LastGood(ttl_s=600),
        Explain(instead=INSTEAD),
    ],
)
def forecast(city: str, url: str, lite_url: str) -> Any:
    """A detailed forecast; falls back to forecast_lite, then the cache, then an explanation."""
    return _get(url)


@tool(
    timeout=5,
    queue=QUEUE,
    max_attempts=2,
    backoff_base=0.05,
    backoff_cap=0.05,
    breaker=NO_BREAKER,
    fallbacks=[Alternative("forecast_slow_lite", arguments=to_lite), LastGood(ttl_s=600)],
)
def forecast_hurried(city: str, url: str, lite_url: str) -> Any:
    """Like forecast, but its alternative needs 5 s: callers with less time skip it."""
    return _get(url)


@tool(
    timeout=5,
    queue=QUEUE,
    max_attempts=1,
    breaker=GUARDED,
    fallbacks=[Alternative("forecast_lite", arguments=to_lite)],
)
def forecast_guarded(city: str, url: str, lite_url: str) -> Any:
    """Behind a breaker: while it is open, the client starts the chain without running this."""
    return _get(url)


@tool(
    timeout=5,
    queue=QUEUE,
    max_attempts=1,
    breaker=NO_BREAKER,
    coalesce=True,
    fallbacks=[Alternative("forecast_lite", arguments=to_lite), Explain(instead=INSTEAD)],
)
def forecast_shared(city: str, url: str, lite_url: str) -> Any:
    """A read that identical calls in flight share; falls back to forecast_lite."""
    return _get(url)


@tool(
    timeout=5,
    queue=QUEUE,
    max_attempts=1,
    breaker=NO_BREAKER,
    side_effects=True,
    fallbacks=[Explain(instead=INSTEAD)],
)
def post_alert(city: str, url: str) -> Any:
    """A write: duplicates with the same idempotency key join the call in flight."""
    return _get(url)
