"""Tools of the limits tests (tests/security/test_result_streams.py, test_big_batches.py)."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

from toolexec import tool
from toolexec.policies import BreakerPolicy

NO_BREAKER = BreakerPolicy(enabled=False)

#: Items the last ``lim_endless`` stream handed out (this worker process).
_drawn = {"items": 0}

#: ``lim_endless`` stops here so that, on a worker that reads streams to their end, the
#: test costs a few hundred MB and not the machine: 5 000 000 items is "for ever" to a
#: 2 MB result limit (about 280 000 items).
ENDLESS_CAP = 5_000_000


def _endless() -> Iterator[int]:
    _drawn["items"] = 0
    for number in itertools.count(1_000_000):
        if _drawn["items"] >= ENDLESS_CAP:
            return
        _drawn["items"] += 1
        yield number


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER)
def lim_endless() -> Any:
    """Returns a generator that (as far as the limit can tell) never ends."""
    return _endless()


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def lim_drawn() -> int:
    """How many items the last lim_endless stream handed out."""
    return _drawn["items"]


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER)
def lim_big_line(megabytes: int) -> str:
    """That many megabytes of text on a single line."""
    return "x" * (megabytes * 1_000_000)


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def lim_pid() -> int:
    """The worker's process id."""
    return os.getpid()


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def lim_nap(seconds: float = 0.0) -> float:
    """Sleeps ``seconds`` and answers them."""
    time.sleep(seconds)
    return seconds


#: Calls of ``lim_mark`` this worker process ran.
_marks = {"ran": 0}


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def lim_mark() -> int:
    """Counts that it ran."""
    _marks["ran"] += 1
    return _marks["ran"]


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def lim_marks() -> int:
    """How many lim_mark calls this worker ran."""
    return _marks["ran"]
