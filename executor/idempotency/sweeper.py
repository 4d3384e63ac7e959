"""Finding calls whose holder died, and handing their messages back to be published.

Every worker runs one :class:`LeaseSweeper`; the publishing itself is given by
the worker runtime (``toolexec.tasks.runtime``), so this module knows no Celery.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence

from toolexec.idempotency.records import Message
from toolexec.idempotency.store import IdempotencyStore
from toolexec.idempotency.ticks import run_every

__all__ = ["LeaseSweeper"]

log = logging.getLogger("toolexec.idempotency")

#: A sweeper goes through the lease index's buckets in this many ticks.
SWEEP_SPLIT = 4


class LeaseSweeper:
    """Hands calls whose holder died to another worker: every worker runs one.

    Each tick asks for records whose lease ended (one round trip) and claims
    them (one more, only when some are due); a claim moves the lease forward
    by ``lease_s`` before the message is published, so two sweepers never
    publish the same call in the same lease period. ``publish`` is given by
    the Celery side (``toolexec.tasks.lease_sweeper``) and sends a batch at once;
    this module knows no Celery.
    """

    def __init__(
        self,
        store: IdempotencyStore,
        publish: Callable[[Sequence[Message]], object],
        interval_s: float,
        *,
        limit: int = 100,
    ) -> None:
        self.store = store
        self.publish = publish
        self.interval_s = interval_s
        self.limit = limit
        self._stop = threading.Event()
        # Each tick scans a quarter of the lease index's buckets, from a random
        # start so that a fleet's sweepers cover every bucket at once: every
        # bucket is seen within four ticks by each sweeper, and a worker's
        # sweeping costs 4 small scripts a tick, not one per bucket.
        self._cursor = random.randrange(store.keys.buckets)
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> list[Message]:
        """Publish the calls whose lease ended in this tick's buckets; returns them."""
        due = self.store.due(self.limit, self._next_buckets())
        if not due:
            return []
        messages = self.store.claim(due)
        if messages:
            self.publish(messages)
        for message in messages:
            log.warning(
                "call %s (%s): its worker stopped renewing the lease; handed to another",
                message.call_id,
                message.task,
            )
        return messages

    def _next_buckets(self) -> list[int]:
        total = self.store.keys.buckets
        step = max(1, -(-total // SWEEP_SPLIT))
        chosen = [(self._cursor + i) % total for i in range(step)]
        self._cursor = (self._cursor + step) % total
        return chosen

    def start(self) -> LeaseSweeper:
        self._thread = threading.Thread(target=self._loop, name="toolexec-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        run_every(self.interval_s, self.sweep_once, "lease sweep", self._stop)
