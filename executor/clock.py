"""Time as an injectable dependency.

Backoff, deadlines and TTLs all read time through a :class:`Clock`, so tests
drive them with a :class:`ManualClock` and never sleep. Deadlines travel between
hosts as Unix epoch seconds; on client and worker they are read from an
:class:`AnchoredClock`, the host's clock corrected by its offset to Redis
``TIME``, so that two hosts whose clocks disagree still agree on a deadline
(docs/architecture.md, "Deadlines and clock skew").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["AnchoredClock", "Clock", "ManualClock", "SystemClock"]

log = logging.getLogger("toolexec.clock")


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


class AnchoredClock:
    """This host's clock, corrected by its offset to a reference clock shared by the fleet.

    ``reference`` returns the shared time (Redis ``TIME``, one round trip); the
    offset is measured against the midpoint of the round trip, so it is off by
    at most half of it, and measured again every ``resync_s`` of ``base`` time
    in case the host's clock was stepped. While the reference does not answer
    the last offset stays (none yet: the host's own time), and it is asked
    again after ``retry_s``: a clock must never fail a call.
    """

    def __init__(
        self,
        reference: Callable[[], float],
        base: Clock | None = None,
        *,
        resync_s: float = 60.0,
        retry_s: float = 5.0,
    ) -> None:
        self.reference = reference
        self.base = base or SystemClock()
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.offset = 0.0
        self._next_sync = float("-inf")

    def now(self) -> float:
        local = self.base.now()
        if local >= self._next_sync:
            self.sync()
            local = self.base.now()
        return local + self.offset

    def sync(self) -> None:
        """Measure the offset now."""
        before = self.base.now()
        try:
            shared = self.reference()
        except Exception as exc:  # Redis away: keep the last offset, ask again soon
            self._next_sync = before + self.retry_s
            log.warning("could not read the shared clock (%s: %s)", type(exc).__name__, exc)
            return
        after = self.base.now()
        self.offset = shared - (before + after) / 2
        self._next_sync = after + self.resync_s
