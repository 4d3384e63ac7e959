"""What a protection on the call path does while its Redis is away: step aside.

A retry budget, a shared rate limit, a circuit breaker and fault injection all
protect calls through Redis, but none of them is worth failing a call for: a
budget that cannot be read must not turn every transient failure into a final
one, and a worker must not wait seconds on a dead Redis for every call of an
outage. So each of them asks :class:`FailOpen` first; after a failure it does
not ask Redis again for ``retry_s``, and it warns at most once per
``warn_interval_s``. :data:`REDIS_ERRORS` is the one definition of what Redis
being away looks like, for every module that catches it.
"""

from __future__ import annotations

import logging
import threading
import time

import redis.exceptions

from toolexec.clock import Clock

__all__ = ["REDIS_ERRORS", "FailOpen"]

_default_log = logging.getLogger("toolexec.stores.failopen")

#: What Redis being away looks like; anything else (a script error) is a bug and raises.
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
)


class FailOpen:
    """Remembers that Redis failed recently, and says so in the log now and then."""

    def __init__(
        self,
        what: str,
        *,
        clock: Clock | None = None,
        retry_s: float = 1.0,
        warn_interval_s: float = 60.0,
        log: logging.Logger | None = None,
    ) -> None:
        self.what = what
        self.clock = clock
        self.retry_s = retry_s
        self.warn_interval_s = warn_interval_s
        self._lock = threading.Lock()
        self._down_until = float("-inf")
        self._warned_at: float | None = None
        #: The owner's logger, so an operator finds the warning under the owner's name.
        self.log = log or _default_log

    def _now(self) -> float:
        return time.monotonic() if self.clock is None else self.clock.now()

    def down(self) -> bool:
        """Whether Redis failed so recently that the call path should not wait on it."""
        return self._now() < self._down_until

    def failed(self, exc: Exception, consequence: str) -> None:
        """Note a failure; log ``consequence`` (what calls get meanwhile) now and then."""
        now = self._now()
        with self._lock:
            self._down_until = now + self.retry_s
            if self._warned_at is not None and now - self._warned_at < self.warn_interval_s:
                return
            self._warned_at = now
        self.log.warning(
            "%s cannot reach Redis (%s: %s); %s", self.what, type(exc).__name__, exc, consequence
        )
