"""A worker on RabbitMQ consumes the per-key queues of its queues (``TOOLEXEC_RABBITMQ_FAIRNESS``).

Clients send a call with a fairness key to one of that key's queues
(``<queue>.fair.<key>.<n>``, :class:`toolexec.stores.fairness_store.AmqpLanes`) and
list their names in Redis first. This step reads that list every
:data:`POLL_S` and asks the worker's own consumer, through Celery's remote
control (``add_consumer``, addressed to this worker only), to consume each
queue it does not consume yet. The control message wakes the consumer's loop,
which then runs ``add_task_queue`` in its own thread, the only one that may use
its AMQP channel.

Everything else is RabbitMQ's and Celery's, unchanged: late acknowledgement,
the channel's prefetch of one per slot, and redelivery of a dead consumer's
unacknowledged calls to the queue they came from. The share comes from the
broker: when a slot frees, RabbitMQ offers it to the channel's backlogged
queues in turn, a random one first, so each queue gets an equal share and a
key with n queues gets n shares (docs/guides/fairness.md, "RabbitMQ").

Each poll also reads the fairness keys' caps and consumes again the queues of a
key the message guard stopped consuming at its ``max_in_flight``, once fewer
than the cap run (:mod:`toolexec.worker.amqp_caps`).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import bootsteps

from toolexec.fairness import AMQP_LANE_MARK
from toolexec.stores.failopen import REDIS_ERRORS
from toolexec.worker.amqp_caps import CapGate, CapTaker, gate_of, lane_key, noted, resumable

__all__ = ["POLL_S", "AmqpLanesStep", "to_consume"]

log = logging.getLogger("toolexec.worker")

#: How often the worker looks for new per-key queues: the longest a new key's first
#: call waits for a consumer, on top of the control message's trip.
POLL_S = 0.2

#: A queue asked for and still not consumed after this long is asked for again (a
#: control message lost in a reconnect).
ASK_AGAIN_S = 2.0


def to_consume(
    registered: set[str], consuming: set[str], asked: dict[str, float], now: float
) -> list[str]:
    """The registered queues to ask for: not consumed, and not asked for lately (pure)."""
    return sorted(
        name
        for name in registered - consuming
        if now - asked.get(name, -ASK_AGAIN_S) >= ASK_AGAIN_S
    )


def _resume(caps: CapTaker, gate: CapGate, asked: dict[str, float], now: float) -> set[str]:
    """Read the caps; consume again each paused key with fewer than its cap running.

    Returns the keys still paused, whose queues are not to be consumed yet.
    """
    gate.caps = caps.caps()
    noted(gate.caps, os.getpid())
    paused = gate.paused_keys()
    free = {key for key in paused if resumable(caps.running(key, now), gate.cap_of(key))}
    if free:
        gate.resume(free)
        for name in [n for n in asked if lane_key(n) in free]:
            del asked[name]  # asked for at once, not after ASK_AGAIN_S
    return paused - free


class _Seen:
    """What the polling thread knows: the registered queues, read again only on a change."""

    def __init__(self) -> None:
        self.total = -1
        self.names: set[str] = set()
        self.asked: dict[str, float] = {}
        self.pending = False
        self.failing = False

    def registered(self, lanes: Any, bases: list[str]) -> set[str]:
        """One SCARD per queue a poll; the members only when the count moved or some wait."""
        total = sum(lanes.count(queue) for queue in bases)
        if total != self.total or self.pending:
            self.names = set().union(*(lanes.names(queue) for queue in bases))
            self.total = total
        self.failing = False
        return self.names

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            log.warning("per-key queues not read from Redis (%s); trying again", exc)
        self.failing = True


class AmqpLanesStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Keeps the consumer on every per-key queue of its queues (see the module docstring)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()

    def start(self, parent: Any) -> None:
        from toolexec.fairness import is_amqp
        from toolexec.worker.app import settings_of

        settings = settings_of(parent.app)
        if self.thread is not None or not settings.rabbitmq_fairness:
            return
        if not is_amqp(str(parent.app.conf.broker_url or "")) or parent.task_consumer is None:
            return
        bases = sorted(
            q.name for q in parent.task_consumer.queues if AMQP_LANE_MARK not in q.name
        )
        self.thread = threading.Thread(
            target=self._run, args=(parent, bases), name="toolexec-amqp-lanes", daemon=True
        )
        self.thread.start()

    def _run(self, parent: Any, bases: list[str]) -> None:
        from toolexec.clock import SystemClock
        from toolexec.connection import redis_client, redis_url
        from toolexec.keys import BrokerKeys, Keys
        from toolexec.stores.fairness_store import AmqpLanes
        from toolexec.worker.app import settings_of

        settings = settings_of(parent.app)
        clock = SystemClock()
        lanes = AmqpLanes(redis_client(redis_url(settings)), Keys(settings.key_prefix), clock)
        seen = _Seen()
        caps = CapTaker(lanes.client, lanes.keys, BrokerKeys(settings.key_prefix))
        gate = gate_of(parent)
        while not self.stopping.wait(POLL_S):
            try:
                registered = seen.registered(lanes, bases)
                paused = _resume(caps, gate, seen.asked, clock.now())
            except REDIS_ERRORS as exc:
                seen.failed(exc)
                continue
            wanted = {name for name in registered if lane_key(name) not in paused}
            seen.pending = self._ask(parent, wanted, seen.asked, clock.now())

    def _ask(self, parent: Any, registered: set[str], asked: dict[str, float], now: float) -> bool:
        """Ask for what is not consumed yet; whether anything registered still is not."""
        consumer = parent.task_consumer
        consuming = {q.name for q in list(consumer.queues)} if consumer is not None else set()
        for name in to_consume(registered, consuming, asked, now):
            asked[name] = now
            try:
                parent.app.control.add_consumer(name, destination=[parent.hostname], reply=False)
            except Exception as exc:  # the broker is away: asked again after ASK_AGAIN_S
                log.warning("could not ask to consume %s (%s)", name, exc)
        return bool(registered - consuming)

    def shutdown(self, parent: Any) -> None:
        self.stopping.set()
