"""Finding calls whose holder died, and handing their messages back to be published.

Every worker runs one :class:`LeaseSweeper`; the publishing itself is given by
the worker runtime (``toolexec.tasks.runtime``), so this module knows no Celery.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from toolexec.idempotency.records import Message
from toolexec.idempotency.store import IdempotencyStore
from toolexec.idempotency.ticks import run_every

__all__ = ["LeaseSweeper"]

log = logging.getLogger("toolexec.idempotency")


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
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> list[Message]:
        """Publish every call whose lease ended; returns what was published."""
        due = self.store.due(self.limit)
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

    def start(self) -> LeaseSweeper:
        self._thread = threading.Thread(target=self._loop, name="toolexec-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        run_every(self.interval_s, self.sweep_once, "lease sweep", self._stop)
