"""Every worker looks for calls whose worker died mid-call, and hands them on.

A call in flight holds a lease of a few seconds in its idempotency record,
renewed while its body runs (``toolexec.idempotency``). When a worker is
killed its leases run out; the sweeper started here in every worker has the
runtime publish such a call's message again (:meth:`WorkerRuntime.hand_over`),
so that another worker takes it over about ``TOOLEXEC_IDEMPOTENCY_LEASE_S``
after the last renewal. The taker checks before writing again, and the dead
worker's fencing token is stale.

Why not the broker's own redelivery: kombu's Redis transport gives back an
unacknowledged message only after the visibility timeout, which must stay
above the longest call plus countdown (``max_timeout`` + 60 s, docs/background.md, Celery), or
every long call and every countdown would run twice. That redelivery remains
as a backstop; when it comes, the record makes it a replay.
"""

from __future__ import annotations

import logging
from typing import Any

from toolexec.tasks.runtime import runtime_of

__all__ = ["on_worker_ready"]

log = logging.getLogger("toolexec.worker")


def on_worker_ready(sender: Any, **_: Any) -> None:
    sweeper = runtime_of(sender.app).start_sweeper()
    log.info("lease sweeper started (every %.2f s)", sweeper.interval_s)
