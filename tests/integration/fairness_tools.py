"""A tool only the fairness tests' own worker imports, on a queue no other worker consumes."""

from __future__ import annotations

import itertools
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


@tool(timeout=30, max_attempts=1, queue=QUEUE)
def stamp(ms: int) -> float:
    """Says when it started (the worker's clock), then sleeps ``ms`` milliseconds."""
    started = time.time()
    time.sleep(ms / 1000)
    return started


@tool(timeout=90, max_attempts=1, queue=QUEUE)
def gated_hold(flag: str) -> None:
    """Holds its slot until the file ``flag`` exists (at most 60 s): a test's gate.

    Says it started with a file ``<flag>.held.<n>`` beside it.
    """
    for n in itertools.count():
        try:
            with open(f"{flag}.held.{n}", "x"):
                break
        except FileExistsError:
            continue
    end = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.02)


@tool(timeout=30, max_attempts=1, queue=QUEUE)
def span(ms: int) -> list[float]:
    """Sleeps ``ms`` milliseconds; says when it started and ended (the worker's clock)."""
    started = time.time()
    time.sleep(ms / 1000)
    return [started, time.time()]
