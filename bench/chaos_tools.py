"""What the chaos scenarios run: a read-only call that takes a while, a write, a failure.

A call that sleeps keeps its slot long enough for a fault to land while it is
in flight; the write counts how often its effect happened, in a Redis of its
own that no scenario kills, so a run twice shows as a count of two. The
failing call lets a scenario kill Redis between the tool's end and the
worker's records of it (breaker, retry budget, stats), through the ledger.
"""

from __future__ import annotations

import os
import time

import redis

from toolexec import tool
from toolexec.errors import UnavailableError
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy


@tool(timeout=30, max_attempts=3, backoff_base=0.05, backoff_cap=0.5)
def chaos_sleep(seconds: float) -> float:
    """Sleeps: a read-only call in flight while a process is killed."""
    time.sleep(seconds)
    return seconds


@tool(timeout=30, max_attempts=3, side_effects=True)
def chaos_write(key: str, seconds: float = 0.0) -> int:
    """Counts one effect for ``key`` in the ledger Redis, then sleeps."""
    ledger = redis.Redis.from_url(os.environ["CHAOS_LEDGER_URL"])
    try:
        effects = int(ledger.incr(f"chaos:effects:{key}"))
    finally:
        ledger.close()
    time.sleep(seconds)
    return effects


@tool(
    timeout=30,
    max_attempts=2,
    backoff_base=0.05,
    backoff_cap=0.1,
    breaker=BreakerPolicy(consecutive_failures=5),
    retry_budget=RetryBudgetPolicy(kind="tokens", max_tokens=10),
)
def chaos_fail(key: str) -> None:
    """Fails (unavailable) twice; the last attempt waits for the scenario's go first.

    It notes ``chaos:last:<key>`` in the ledger and waits on ``chaos:go:<key>``
    (BLPOP, 20 s at most), so that the scenario can kill toolexec's Redis
    while the worker has yet to record the failure.
    """
    ledger = redis.Redis.from_url(os.environ["CHAOS_LEDGER_URL"])
    try:
        if int(ledger.incr(f"chaos:attempts:{key}")) >= 2:
            ledger.set(f"chaos:last:{key}", "1")
            ledger.blpop([f"chaos:go:{key}"], timeout=20)
            ledger.set(f"chaos:failed:{key}", "1")
    finally:
        ledger.close()
    raise UnavailableError(f"{key} is unavailable (a chaos scenario's failure)")
