"""The one background loop the lease keeper and the lease sweeper both run.

Each wakes on a fixed interval and does one round of Redis work; a round that
fails is logged and the loop goes on, because a missed renewal or sweep must
never stop the worker (the next round makes up for it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["run_every"]

log = logging.getLogger("toolexec.idempotency")


def run_every(
    interval_s: float, job: Callable[[], object], what: str, stop: threading.Event
) -> None:
    """Call ``job`` every ``interval_s`` seconds until ``stop`` is set."""
    while not stop.wait(interval_s):
        try:
            job()
        except Exception as exc:  # a missed round must never stop the worker
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
