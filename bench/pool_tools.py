"""Tools of bench/pools.py: a slow one and a fast one, each on its own queue."""

from __future__ import annotations

import time

from toolexec import tool
from toolexec.policies import BreakerPolicy

NO_BREAKER = BreakerPolicy(enabled=False)


@tool(queue="bench-slow", timeout=60, max_attempts=1, breaker=NO_BREAKER)
def bench_slow(seconds: float) -> str:
    """Hold a slot for ``seconds``, as a slow report or a long scrape would."""
    time.sleep(seconds)
    return "done"


@tool(queue="bench-fast", timeout=5, max_attempts=1, breaker=NO_BREAKER)
def bench_fast(key: str) -> str:
    """Answer at once, as a cache lookup would."""
    return key
