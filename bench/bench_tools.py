"""The toolexec tools the benchmarks call (plain Celery's are in plain_app.py)."""

from __future__ import annotations

import time

from toolexec import tool


@tool(timeout=60)
def bench_noop() -> None:
    """Does nothing, so that a call's whole round trip is overhead.

    Every default layer is on (breaker, retry budget, stats), as the targets demand.
    """


@tool(timeout=60, max_attempts=1)
def bench_sleep(seconds: float) -> float:
    """Sleeps, to measure how well calls fan out over the worker's slots."""
    time.sleep(seconds)
    return seconds


@tool(timeout=60, queue="bench-fanout")
def bench_fanout_sleep(seconds: float) -> float:
    """:func:`bench_sleep` on a queue of its own, served by a worker with 100 slots."""
    time.sleep(seconds)
    return seconds
