"""Every worker looks for calls whose worker died mid-call, and hands them on.

A side-effecting (or coalesced) call holds a lease of a few seconds in its
idempotency record, renewed while its body runs (``toolexec.idempotency``).
When a worker is killed its leases run out; the sweeper started here in every
worker publishes such a call's message again, so that another worker takes it
over about ``TOOLEXEC_IDEMPOTENCY_LEASE_S`` after the last renewal. The taker
checks before writing again, and the dead worker's fencing token is stale.

Why not the broker's own redelivery: kombu's Redis transport gives back an
unacknowledged message only after the visibility timeout, which must stay
above the longest call plus countdown (``max_timeout`` + 60 s, docs/background.md, Celery), or
every long call and every countdown would run twice. That redelivery remains
as a backstop; when it comes, the record makes it a replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery

from toolexec.app import settings_of
from toolexec.connection import fail_fast_client, redis_url
from toolexec.idempotency import IdempotencyStore, LeaseSweeper, Message
from toolexec.keys import Keys

__all__ = ["on_worker_ready", "publisher", "start_lease_sweeper"]

log = logging.getLogger("toolexec.worker")


def publisher(celery_app: Celery) -> Callable[[Sequence[Message]], None]:
    """Publish claimed calls as the client would, each under its own call id.

    Celery's ``retries`` carries the attempts already made (the dead worker's
    included), plus the rate-limit deferrals that Celery also counts as
    retries, so that the taker's attempt number goes on from there.
    """

    def publish(messages: Sequence[Message]) -> None:
        with celery_app.producer_or_acquire() as producer:
            for message in messages:
                deferrals = int(message.context.get("deferrals") or 0)
                celery_app.send_task(
                    message.task,
                    kwargs=message.kwargs(),
                    kwargsrepr=f"{{'call': '{message.call_id}', 'handed over': True}}",
                    task_id=message.call_id,
                    queue=message.queue,
                    retries=message.attempt + deferrals,
                    ignore_result=True,
                    producer=producer,
                )

    return publish


def start_lease_sweeper(celery_app: Celery) -> LeaseSweeper:
    settings = settings_of(celery_app)
    store = IdempotencyStore(
        fail_fast_client(redis_url(settings)),
        Keys(settings.key_prefix),
        lease_s=settings.idempotency_lease_s,
        retention_s=settings.idempotency_retention_s,
    )
    return LeaseSweeper(store, publisher(celery_app), settings.idempotency_sweep_s).start()


def on_worker_ready(sender: Any, **_: Any) -> None:
    sweeper = start_lease_sweeper(sender.app)
    log.info("lease sweeper started (every %.2f s)", sweeper.interval_s)
