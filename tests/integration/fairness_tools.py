"""A tool only the fairness tests' own worker imports, on a queue no other worker consumes."""

from __future__ import annotations

import os
import time

from toolexec import tool

#: A test on a broker of its own (RabbitMQ) names a queue of its own.
QUEUE = os.environ.get("FAIRNESS_QUEUE", "fairness")


@tool(timeout=30, max_attempts=1, queue=QUEUE)
def nap(ms: int, tag: str = "") -> str:
    """Sleeps ``ms`` milliseconds (a call of a given length), then says which it was."""
    time.sleep(ms / 1000)
    return tag


@tool(timeout=30, max_attempts=1, queue=QUEUE, max_in_flight=2)
def capped_nap(ms: int) -> None:
    """Sleeps ``ms`` milliseconds; at most two run at once across the fleet."""
    time.sleep(ms / 1000)
