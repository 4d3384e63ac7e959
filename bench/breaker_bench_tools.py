"""The tools bench/breaker.py runs on a real worker: each in a guarded and a bare form.

The two forms of a pair differ only in their circuit breaker, so the
difference between them in a run is the breaker's own cost or effect.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy

NO_BREAKER = BreakerPolicy(enabled=False)

#: The outage's breaker: 5 failures in a row (or half of the last 20) open it for
#: 5 s; 2 probes at a time, 2 successes close it.
OUTAGE_BREAKER = BreakerPolicy(
    consecutive_failures=5,
    failure_rate=0.5,
    window_size=20,
    min_calls=10,
    open_s=5.0,
    half_open_probes=2,
    close_after=2,
    probe_lease_s=30.0,
)

_RETRIES: dict[str, Any] = {"max_attempts": 3, "backoff_base": 0.1, "backoff_cap": 0.4}


@tool(timeout=10, max_attempts=1)
def breaker_noop() -> None:
    """Does nothing, behind the default breaker: a normal call's round trip."""


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def bare_noop() -> None:
    """Does nothing, with no breaker: the baseline of the closed-state overhead."""


@tool(timeout=10, max_attempts=1)
def tripped_noop() -> None:
    """Its breaker is tripped open by the benchmark: every call fails fast at the client."""


def _get(url: str) -> httpx.Response:
    """GET ``url``, telling the service when the body started (just after the breaker admitted it).

    The benchmark compares that time with when the breaker opened: a request
    that reaches the service later but started earlier was admitted while closed.
    """
    with httpx.Client(timeout=5) as client:
        return client.get(url, params={"started": repr(time.time())})


@tool(timeout=5, breaker=OUTAGE_BREAKER, **_RETRIES)
def guarded_fetch(url: str) -> httpx.Response:
    """GET a URL behind the outage breaker, three attempts."""
    return _get(url)


@tool(timeout=5, breaker=NO_BREAKER, **_RETRIES)
def bare_fetch(url: str) -> httpx.Response:
    """GET a URL with the same three attempts and no breaker."""
    return _get(url)
