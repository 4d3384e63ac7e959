"""The Celery application, configured from :class:`Settings` when first used.

``celery -A toolexec.worker.app worker|inspect|events|flower`` works as operators
expect: the module-level :data:`app` reads its settings through Celery's
``on_configure`` hook, not at import time. Everything Celery does with a
message is fixed here: JSON only, late acknowledgement, redelivery of calls
from a worker that died, a visibility timeout longer than any call can live,
and task events on for Flower.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery, signals

from toolexec.connection import celery_url, is_cluster, redis_url
from toolexec.settings import Settings

__all__ = ["app", "celery_config", "create_app", "settings_of"]


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for toolexec; see docs/background.md, Celery for why each matters."""
    state_url = redis_url(settings)
    # One list per queue (no kombu priority sub-lists: toolexec's priorities and fairness
    # keys are lanes a worker sorts the queue into, toolexec.transport.lanes), so that a worker
    # takes
    # a message by moving it, never holding it only in memory (toolexec.transport.inbox).
    transport = {"visibility_timeout": settings.visibility_timeout, "priority_steps": [0]}
    # sentinel:// needs master_name in the transport options; rediss:// an ssl_cert_reqs.
    broker, broker_options = celery_url(settings.broker_url or state_url)
    # Results never go through Celery's backend (task_ignore_result), and Celery has
    # no Redis Cluster backend: with toolexec's state on a cluster, there is none.
    backend: str | None = None
    backend_options: dict[str, Any] = {}
    if not is_cluster(state_url):
        backend, backend_options = celery_url(state_url)
    priorities: dict[str, Any] = {}
    if broker.startswith(("amqp", "pyamqp")):
        # Without publisher confirms, a call RabbitMQ accepted but had not stored when it
        # crashed would be lost while the client waits for it until its deadline.
        broker_options = {**broker_options, "confirm_publish": True}
        if settings.rabbitmq_priorities:  # the broker orders by priority (toolexec.fairness)
            priorities = {"task_queue_max_priority": 5, "task_default_priority": 3}
    return {
        "broker_url": broker,
        "result_backend": backend,
        # JSON only: a pickle message from an untrusted producer would run code.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Acknowledge after the call, and send it again if the worker dies mid-call;
        # Celery 5.7 counts that resend against max_retries, so it cannot loop.
        # (task_retry_on_worker_lost covers a prefork child that dies; a whole worker
        # killed leaves its messages unacked, and on a Redis broker the other workers
        # put them back within seconds (toolexec.transport.orphans) while a call that had
        # started is handed over by its lease (toolexec.idempotency); the visibility
        # timeout stays as the last backstop: Settings.visibility_timeout.)
        "task_acks_late": True,
        "task_retry_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {**transport, **broker_options},
        "result_backend_transport_options": {**transport, **backend_options},
        "broker_connection_retry_on_startup": True,
        "broker_pool_acquire_timeout": 10.0,
        "task_default_queue": settings.default_queue,
        "task_ignore_result": True,
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "imports": ["toolexec.tasks", *settings.tools],
        "worker_hijack_root_logger": False,
        # reconnect at the pace of a blip, not of an outage (toolexec.worker.consumer)
        "worker_consumer": "toolexec.worker.consumer:Consumer",
        # After a reconnect Celery lowers the prefetch and raises it again from the
        # callback of each finished task; on the threads pool that callback runs on a
        # pool thread and its basic.qos RPC reads the AMQP socket the consumer is
        # reading too: "UnexpectedFrame", another reconnect, and after a few rounds a
        # worker that consumes nothing (measured: bench/chaos.py, rabbitmq-restart).
        "worker_enable_prefetch_count_reduction": False,
        **priorities,
    }


def create_app(
    settings: Settings | None = None, name: str = "toolexec", *, sending_only: bool = False
) -> Celery:
    """A Celery app for ``settings``; configured lazily when ``settings`` is None.

    ``sending_only`` is the client's app, which never runs a worker: it goes
    without Celery's built-in Django fix-up, whose module imports
    ``celery.worker`` (it only acts in a worker), so an agent's process loads
    none of Celery's worker.
    """
    celery_app = Celery(name, set_as_current=False, fixups=[] if sending_only else None)
    # Named, not imported: Celery resolves a step's name when a worker builds its
    # consumer, so a process that only sends (an agent) never loads celery.worker
    # or toolexec's worker side (tests/unit/test_import_boundaries.py).
    celery_app.steps["consumer"].add("toolexec.worker.consumer:LivenessBeat")
    celery_app.steps["consumer"].add("toolexec.worker.consumer:OrphanWatchStep")
    celery_app.steps["consumer"].add("toolexec.worker.amqp_lanes:AmqpLanesStep")
    if settings is not None:
        celery_app.conf.update(celery_config(settings))
        celery_app.conf.toolexec_settings = settings
        return celery_app

    def configure(sender: Celery, **_: Any) -> None:
        loaded = Settings.from_env()
        sender.conf.update(celery_config(loaded))
        sender.conf.toolexec_settings = loaded

    celery_app.on_configure.connect(configure, weak=False)
    return celery_app


def _as_worker(sender: Any = None, instance: Any = None, conf: Any = None, **_: Any) -> None:
    """A worker of a toolexec app starts: check kombu's and Celery's versions, pick the transport.

    Only here, in the worker, is toolexec's Redis transport selected
    (:mod:`toolexec.transport`); every other process that builds the app (an
    agent calling tools) runs kombu as kombu ships it.
    """
    if instance is None or conf is None or not isinstance(conf.get("toolexec_settings"), Settings):
        return
    from toolexec import transport

    transport.check_versions()
    chosen = transport.transport_for(str(conf.broker_url or ""))
    if chosen is not None:
        conf.broker_transport = chosen


signals.celeryd_init.connect(_as_worker, weak=False)


def settings_of(celery_app: Celery) -> Settings:
    """The settings ``celery_app`` was configured with."""
    found = celery_app.conf.get("toolexec_settings")
    if not isinstance(found, Settings):
        found = Settings.from_env()
        celery_app.conf.toolexec_settings = found
    return found


#: The application ``celery -A toolexec.worker.app`` and the worker use; declared here,
#: made on first use by :func:`__getattr__` below.
app: Celery

_app: Celery | None = None
_app_lock = threading.Lock()


def __getattr__(name: str) -> Celery:
    """``app``: the application ``celery -A toolexec.worker.app`` and the worker use, made on first
    use.

    Not at import: a client imports this module to build its own app
    (``toolexec.client.publish``), and a worker's app loads Celery's Django
    fix-up, which imports ``celery.worker``.
    """
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _app_lock:
        if _app is None:
            _app = create_app()
        return _app
