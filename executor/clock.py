"""Time as an injectable dependency.

Backoff, deadlines and TTLs all read time through a :class:`Clock`, so tests
drive them with a :class:`ManualClock` and never sleep. Deadlines travel between
hosts as Unix epoch seconds, so the production clock is the wall clock.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Reads the current time in Unix epoch seconds."""

    def now(self) -> float: ...


class SystemClock:
    """The host's wall clock."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; for exact, sleep-free tests."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (asked to advance {seconds} s)")
        self._now += seconds
