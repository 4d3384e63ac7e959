"""Tools behind circuit breakers, run by the workers of tests/integration/test_breaker_workers.py.

They live on :data:`QUEUE`, which only those workers consume, and GET a
FlakyServer URL, so the service's own hit log counts every call that got
past the breakers. One attempt per call: a breaker test counts calls, not
retries. Each test uses its own tool, so no breaker state leaks between tests.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy

QUEUE = "breakers"

#: Opens after 3 failures in a row for 2 s; 2 probes at a time, 2 successes close it.
#: A refused call ends at once (max_wait_s 0): these tests count refusals and probes
#: exactly; calls that wait for a probe are test_defences_adapt's.
SHARED = BreakerPolicy(
    consecutive_failures=3,
    failure_rate=None,
    open_s=2.0,
    half_open_probes=2,
    close_after=2,
    probe_lease_s=10.0,
    max_wait_s=0.0,
)

#: Like SHARED, open for 4 s: room for a dozen refused calls even on a loaded machine.
OUTAGE = replace(SHARED, open_s=4.0)

#: Opens after one failure for only 1 s, so a 3 s Retry-After must be what keeps it open.
BRIEF = BreakerPolicy(
    consecutive_failures=1, failure_rate=None, open_s=1.0, close_after=1, probe_lease_s=10.0
)

#: One probe at a time, on a 5 s lease: a probe whose worker dies blocks probing that long.
LEASED = BreakerPolicy(
    consecutive_failures=1,
    failure_rate=None,
    open_s=0.5,
    half_open_probes=1,
    close_after=1,
    probe_lease_s=5.0,
)


def _get(url: str) -> Any:
    with httpx.Client(timeout=10) as client:
        return client.get(url)


@tool(timeout=3, max_attempts=1, queue=QUEUE, breaker=SHARED)
def shared_service(url: str) -> Any:
    """Two workers, one breaker."""
    return _get(url)


@tool(timeout=3, max_attempts=1, queue=QUEUE, breaker=SHARED)
def probed_service(url: str) -> Any:
    """Half-open with K=2 under 20 concurrent callers."""
    return _get(url)


@tool(timeout=3, max_attempts=1, queue=QUEUE, breaker=BRIEF)
def throttled_service(url: str) -> Any:
    """A 503 with Retry-After outlasts the breaker's own open time."""
    return _get(url)


@tool(timeout=4, max_attempts=1, queue=QUEUE, breaker=LEASED)
def leased_service(url: str) -> Any:
    """Its probe's worker is killed mid-call."""
    return _get(url)


@tool(timeout=3, max_attempts=1, queue=QUEUE, breaker=OUTAGE)
def outage_service(url: str) -> Any:
    """Down for a while, then back: only probes reach it in between."""
    return _get(url)
