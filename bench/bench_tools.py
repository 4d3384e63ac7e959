"""What the benchmarks run: toolexec tools and bare Celery tasks, side by side.

Both kinds live in this one module so that one worker process serves them
with the same pool, the same concurrency and the same Celery settings; the
only difference left between the two paths is toolexec itself.
"""

from __future__ import annotations

import time

from toolexec import tool
from toolexec.app import app


@tool(timeout=60, max_attempts=1)
def bench_noop() -> None:
    """Does nothing, so that a call's whole round trip is overhead."""


@tool(timeout=60, max_attempts=1)
def bench_sleep(seconds: float) -> float:
    """Sleeps, to measure how well calls fan out over the worker's slots."""
    time.sleep(seconds)
    return seconds


@app.task(name="bench.noop", ignore_result=False)  # type: ignore[untyped-decorator]
def bare_noop() -> None:
    """The bare Celery baseline of :func:`bench_noop`; its result goes to the backend."""


@app.task(name="bench.sleep", ignore_result=False)  # type: ignore[untyped-decorator]
def bare_sleep(seconds: float) -> float:
    """The bare Celery baseline of :func:`bench_sleep`."""
    time.sleep(seconds)
    return seconds
