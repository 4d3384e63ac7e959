"""Sending prepared calls to the broker, pipelined over one producer connection.

This is the client's one edge with Celery and kombu (docs/architecture.md,
Boundaries): :func:`broker_app` builds the Celery app the client sends with and
:func:`publish` sends. Both import Celery and kombu when they run, never when
``toolexec`` is imported, so a process that declares tools or reads results
loads neither, and one that calls tools loads Celery's sending side only.

The repr of each call's kwargs that logs, task events and Flower show is
computed here with secrets redacted (:func:`~toolexec.redaction.shown_kwargs`),
since Celery would otherwise show the real values.

A batch goes out in windows of :data:`WINDOW` calls. Between windows the
caller's ``between`` hook runs (the client reads the answers already back, so
a batch that takes longer to send than its calls take to run loses none of
them), and a window whose calls' deadline has passed is not sent at all: its
calls could only sit in the queue for a worker to throw away.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from opentelemetry.trace import Span

from toolexec.client.prepare import PreparedCall
from toolexec.clock import Clock
from toolexec.errors import BrokerUnavailableError
from toolexec.fairness import is_amqp, lane_options, with_lane
from toolexec.redaction import shown_kwargs
from toolexec.settings import Settings
from toolexec.tracing import inject_headers

if TYPE_CHECKING:  # the client imports Celery only when it builds its app
    from celery import Celery

__all__ = ["WINDOW", "broker_app", "publish"]


#: Redis commands buffered before a flush: two per call (queue push, task-sent event),
#: so a batch of 256 calls is one round trip of a few hundred KB at most.
_PUBLISH_BATCH = 512

#: Calls sent between two looks at the answers and the deadline: one flush's worth.
WINDOW = _PUBLISH_BATCH // 2

_Todo = list[tuple[PreparedCall, Span | None]]


def publish(
    app: Celery,
    batch: Sequence[PreparedCall],
    spans: Sequence[Span] | None = None,
    *,
    clock: Clock | None = None,
    between: Callable[[], None] | None = None,
) -> frozenset[str]:
    """Send every call that passed the checks; the rest already have their result.

    kombu's publish batch buffers each message's Redis commands (the queue push,
    the task-sent event) and sends them ``_PUBLISH_BATCH`` at a time: one round
    trip per batch instead of two per call. ``spans`` are the calls' client spans
    (:func:`toolexec.tracing.start_call`), whose W3C context goes into each
    message's headers. ``between`` runs after each window but the last; with a
    ``clock``, the windows left when their calls' deadline has passed are not
    sent. Returns the ids of the calls not sent for that reason.
    """
    from kombu.exceptions import BatchPublishError, OperationalError

    shown: Sequence[Span | None] = spans if spans is not None else [None] * len(batch)
    todo = [(p, s) for p, s in zip(batch, shown, strict=True) if p.early is None]
    if not todo:
        return frozenset()
    start = 0
    try:
        with app.producer_or_acquire() as producer:
            for start in range(0, len(todo), WINDOW):
                if start and between is not None:
                    between()
                if clock is not None and clock.now() >= todo[start][0].ctx.deadline:
                    return frozenset(p.ctx.call_id for p, _ in todo[start:])
                with producer.batch(max_size=_PUBLISH_BATCH):
                    _send(app, producer, todo[start : start + WINDOW])
    except BatchPublishError as exc:
        cause = exc.__cause__ or exc
        raise BrokerUnavailableError(
            f"the broker failed while taking a batch of {len(todo)} call(s) "
            f"({type(cause).__name__}: {cause}); some may have been sent and will run. "
            "Check that the server is up before calling again; side-effecting tools are "
            "idempotent, so a repeat is safe."
        ) from exc
    except (OperationalError, OSError) as exc:
        ran = (
            "nothing was run"
            if start == 0
            else f"the first {start} of {len(todo)} calls were sent and will run"
        )
        raise BrokerUnavailableError(
            f"the broker did not accept the call ({type(exc).__name__}: {exc}); "
            f"{ran}. Check TOOLEXEC_BROKER_URL / TOOLEXEC_REDIS_URL and "
            "that the server is up."
        ) from exc
    return frozenset()


def broker_app(settings: Settings) -> Celery:
    """toolexec's Celery app for a client with ``settings``: what :func:`publish` sends with.

    Imported here rather than at the top: Celery (which imports click) is needed
    to publish, not to declare tools or build results, and ``import toolexec``
    must stay light for processes that only do those. The app is the one
    workers run, so every setting that shapes a message is the same; the
    worker's own parts (its consumer, its transport) are named there by
    string and load only in a worker.
    """
    from toolexec.client.sending import sending_transport
    from toolexec.worker.app import create_app

    app = create_app(settings, sending_only=True)
    chosen = sending_transport(str(app.conf.broker_url or ""))
    if chosen is not None:  # one redis-py client per pool, not one per command
        app.conf.broker_transport = chosen
    return app


def _send(app: Celery, producer: object, window: _Todo) -> None:
    amqp = is_amqp(str(app.conf.broker_url or ""))
    for p, span in window:
        kwargs = {"arguments": p.arguments, "context": p.ctx.to_json()}
        task = p.task or f"tools.{p.ctx.tool}"
        headers = None if span is None else inject_headers(span, p.queue, p.ctx.call_id, task)
        app.send_task(
            task,
            kwargs=kwargs,
            kwargsrepr=shown_kwargs(kwargs, p.secrets),
            task_id=p.ctx.call_id,
            queue=p.queue,
            producer=producer,
            ignore_result=True,
            headers=with_lane(headers, p.ctx.fairness_key, p.ctx.priority, p.tool_cap),
            **lane_options(amqp, p.ctx.priority),
        )
