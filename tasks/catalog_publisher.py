"""Workers publish their catalog when ready, beat while alive, and leave when they stop.

Clients read the catalog to validate and route calls. The heartbeat
(:mod:`toolexec.stores.liveness`) tells them, and ``toolexec status``, which workers
are alive and which queues they serve, so a call to a queue nobody serves is
answered at once. A worker that stops cleanly removes itself before it
finishes its last calls (it takes no new ones), so it is never counted alive
after it has gone.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.worker import state as worker_state

from toolexec.clock import SystemClock
from toolexec.fairness import AMQP_LANE_MARK
from toolexec.keys import Keys
from toolexec.registry import default_registry
from toolexec.stores import catalog, liveness
from toolexec.tasks.runtime import runtime_of
from toolexec.worker.app import settings_of

__all__ = [
    "CATALOG_EVERY",
    "HEARTBEAT_S",
    "Heartbeat",
    "on_worker_ready",
    "on_worker_shutting_down",
    "publish_catalog",
]

log = logging.getLogger("toolexec.worker")

HEARTBEAT_S = liveness.HEARTBEAT_S

#: The catalog is written again every this many beats (about 16 s): it changes
#: only when code does, but a Redis that lost its data must get it back.
CATALOG_EVERY = 8


def publish_catalog(celery_app: Celery, worker: str, queues: list[str] | None = None) -> int:
    settings = settings_of(celery_app)
    return catalog.publish(
        runtime_of(celery_app).redis,
        Keys(settings.key_prefix),
        default_registry,
        settings.default_queue,
        worker,
        SystemClock().now(),
        queues or (),
    )


def _queues_of(consumer: Any) -> list[str]:
    """The queues the worker consumes now (``add_consumer`` can change them).

    Fairness keys' queues on RabbitMQ (``toolexec.worker.amqp_lanes``) are left
    out: clients ask whether a tool's queue is served, never a key's, and a
    worker of 1 000 keys would otherwise write 1 000 liveness entries a beat.
    """
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = getattr(task_consumer, "queues", None) or ()
    return sorted({q.name for q in queues if AMQP_LANE_MARK not in q.name})


@dataclass
class Heartbeat:
    """One worker's beat: its thread, and what it must remove when it stops."""

    celery_app: Celery
    worker: str
    consumer: Any
    stop: threading.Event = field(default_factory=threading.Event)
    queues: list[str] = field(default_factory=list)
    #: A beat in flight must not put the worker back after :meth:`leave` removed it.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def beat(self, with_catalog: bool = False) -> None:
        """One beat (and the catalog again, now and then), unless the worker has left."""

        with self.lock:
            if self.stop.is_set():
                return
            self.queues = _queues_of(self.consumer) or self.queues
            settings = settings_of(self.celery_app)
            keys = Keys(settings.key_prefix)
            client = runtime_of(self.celery_app).redis
            held = (len(worker_state.scheduled_requests), settings.worker_max_scheduled)
            liveness.beat(client, keys, self.worker, self.queues, SystemClock().now(), held)
            if with_catalog:
                publish_catalog(self.celery_app, self.worker, self.queues)

    def run(self) -> None:
        beats = 0
        while not self.stop.wait(HEARTBEAT_S):
            beats += 1
            try:
                self.beat(with_catalog=beats % CATALOG_EVERY == 0)
            except Exception as exc:  # a missed beat must never stop the worker
                log.warning("could not send the worker's heartbeat: %s", exc)

    def leave(self) -> None:
        """Stop beating and remove the worker from every live set."""

        keys = Keys(settings_of(self.celery_app).key_prefix)
        with self.lock:
            self.stop.set()
            try:
                liveness.leave(runtime_of(self.celery_app).redis, keys, self.worker, self.queues)
            except Exception as exc:  # Redis gone at shutdown: the window drops it in seconds
                log.warning("could not remove %s from the live workers: %s", self.worker, exc)


_beating: dict[str, Heartbeat] = {}


def on_worker_ready(sender: Any, **_: Any) -> None:
    celery_app = sender.app
    name = sender.hostname
    heartbeat = Heartbeat(celery_app, name, sender, queues=_queues_of(sender))
    count = publish_catalog(celery_app, name, heartbeat.queues)
    _beating[name] = heartbeat
    log.info(
        "worker %s published %d tools: %s; serving queues %s",
        name,
        count,
        ", ".join(default_registry.names()),
        ", ".join(heartbeat.queues) or "-",
    )
    threading.Thread(target=heartbeat.run, name="toolexec-heartbeat", daemon=True).start()


def on_worker_shutting_down(sender: Any = None, **_: Any) -> None:
    """Celery's warm or cold shutdown began: this worker takes no new calls."""
    for name in [sender] if sender in _beating else list(_beating):
        _beating.pop(name).leave()
