"""Keeping the leases of running calls alive: one thread per process, one round trip a tick.

Every call holds a lease (``toolexec.idempotency``), so a thread and a round
trip per call would be paid on every call's hot path. Instead the
:class:`LeaseKeeper` holds a set of leases; its one thread wakes every half
renewal interval and renews, in one pipeline, the leases not renewed for an
interval. A call that ends within an interval (most do) costs no renewal at
all; a lease is never left longer than one and a half intervals, a third of
the lease by default, so two renewals can fail before it runs out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from toolexec.idempotency.records import Lease
from toolexec.idempotency.store import IdempotencyStore
from toolexec.idempotency.ticks import run_every
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = ["LeaseKeeper"]

log = logging.getLogger("toolexec.idempotency")


class LeaseKeeper:
    """Renews the leases of the calls this process runs until they are dropped.

    When a lease is lost (another worker took the call over) it is dropped
    with a warning: the body cannot be stopped, but its outcome will be fenced
    off. ``monotonic`` is injectable so that tests can call :meth:`renew_due`
    with time of their own.
    """

    def __init__(
        self,
        store: IdempotencyStore,
        interval_s: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.monotonic = monotonic
        self._renewed_at: dict[Lease, float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, lease: Lease) -> None:
        """Keep ``lease`` alive from now on; it was just taken."""
        with self._lock:
            self._renewed_at[lease] = self.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="toolexec-leases", daemon=True
                )
                self._thread.start()

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease``: its call is over, or parked for a retry."""
        with self._lock:
            self._renewed_at.pop(lease, None)

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._renewed_at)

    def renew_due(self) -> list[Lease]:
        """Renew every lease not renewed for an interval; returns those found lost."""
        now = self.monotonic()
        with self._lock:
            due = [lease for lease, at in self._renewed_at.items() if now - at >= self.interval_s]
        if not due:
            return []
        try:
            kept = self.store.renew_many(due)
        except REDIS_ERRORS as exc:
            log.warning("could not renew %d leases: %s", len(due), exc)
            return []
        lost = [lease for lease, ok in zip(due, kept, strict=True) if not ok]
        with self._lock:
            for lease, ok in zip(due, kept, strict=True):
                if ok and lease in self._renewed_at:
                    self._renewed_at[lease] = now
                elif not ok:
                    self._renewed_at.pop(lease, None)
        for lease in lost:
            log.warning(
                "lost the lease of %s (token %d): another worker took the call over",
                lease.record,
                lease.token,
            )
        return lost

    def _loop(self) -> None:
        # never set: the thread is a daemon and lives as long as the process
        run_every(self.interval_s / 2, self.renew_due, "lease renewal", threading.Event())
