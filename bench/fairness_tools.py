"""The tool ``bench/fairness.py`` runs: counts each start per fairness key, then naps."""

from __future__ import annotations

import os
import time
from functools import cache

import redis

from toolexec import tool


@cache
def _counter() -> redis.Redis:
    return redis.Redis.from_url(os.environ["TOOLEXEC_REDIS_URL"])


@tool(timeout=60, max_attempts=1)
def fair_count(key: str, ms: int) -> None:
    """Counts a start of ``key``'s call in Redis (the bench's shares), then sleeps ``ms``."""
    _counter().incr(f"{os.environ['TOOLEXEC_KEY_PREFIX']}:bench:started:{key}")
    time.sleep(ms / 1000)


@tool(timeout=300, max_attempts=1)
def fair_gate(flag: str) -> None:
    """Holds a slot until the file ``flag`` exists (at most 240 s); marks its start beside it."""
    mark = f"{flag}.held.{os.getpid()}.{time.monotonic_ns()}"
    open(mark, "x").close()
    end = time.monotonic() + 240
    while not os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.02)
