"""What the chaos scenarios run: a read-only call that takes a while, and a write.

A call that sleeps keeps its slot long enough for a fault to land while it is
in flight; the write counts how often its effect happened, in a Redis of its
own that no scenario kills, so a run twice shows as a count of two.
"""

from __future__ import annotations

import os
import time

import redis

from toolexec import tool


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
