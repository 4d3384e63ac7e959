"""Sending prepared calls to the broker, over one producer connection per batch.

The repr of each call's kwargs that logs, task events and Flower show is
computed here with secrets redacted (:func:`~toolexec.redaction.shown_kwargs`),
since Celery would otherwise show the real values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kombu.exceptions import OperationalError

from toolexec.client.prepare import PreparedCall
from toolexec.errors import BrokerUnavailableError
from toolexec.redaction import shown_kwargs

if TYPE_CHECKING:  # the client imports Celery only when it builds its app
    from celery import Celery

__all__ = ["publish"]


def publish(app: Celery, batch: Sequence[PreparedCall]) -> None:
    """Send every call that passed the checks; the rest already have their result."""
    todo = [p for p in batch if p.early is None]
    if not todo:
        return
    try:
        with app.producer_or_acquire() as producer:
            for p in todo:
                kwargs = {"arguments": p.arguments, "context": p.ctx.to_json()}
                app.send_task(
                    p.task or f"tools.{p.ctx.tool}",
                    kwargs=kwargs,
                    kwargsrepr=shown_kwargs(kwargs, p.secrets),
                    task_id=p.ctx.call_id,
                    queue=p.queue,
                    producer=producer,
                    ignore_result=True,
                )
    except (OperationalError, OSError) as exc:
        raise BrokerUnavailableError(
            f"the broker did not accept the call ({type(exc).__name__}: {exc}); "
            "nothing was run. Check TOOLEXEC_BROKER_URL / TOOLEXEC_REDIS_URL and "
            "that the server is up."
        ) from exc
