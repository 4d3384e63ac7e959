"""What bench/payloads.py runs: a tool and a bare Celery task returning the same text.

The text of each size is built once per worker process and cached, so the
figures measure moving the result, not making it.
"""

from __future__ import annotations

import functools

from toolexec import tool
from toolexec.policies import BreakerPolicy
from toolexec.worker.app import app


@functools.cache
def text_of(size: int) -> str:
    """``size`` bytes of numbered 64-byte lines (the last one may be shorter)."""
    line_count = -(-size // 64)
    lines = (
        f"{i:010d} {'lorem ipsum dolor sit amet ' * 2}".ljust(63) + "\n" for i in range(line_count)
    )
    return "".join(lines)[:size]


@tool(timeout=300, max_attempts=1, breaker=BreakerPolicy(enabled=False))
def bench_text(size: int) -> str:
    """Returns ``size`` bytes of text."""
    return text_of(size)


@app.task(name="bench.payload_text", ignore_result=False)  # type: ignore[untyped-decorator]
def bare_text(size: int) -> str:
    """The bare Celery baseline: the whole text goes to the result backend."""
    return text_of(size)
