"""What ``toolexec worker`` sets up around Celery: the metrics server and the log format.

Split in two because of prometheus_client's multiprocess mode: it is chosen
when prometheus_client is first imported, from ``PROMETHEUS_MULTIPROC_DIR``,
so :func:`prepare` must run before anything imports :mod:`toolexec.ops.metrics`,
and :func:`start` (which registers the metrics as the runtime's reporter) after.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from celery import signals

from toolexec.settings import Settings

__all__ = ["prepare", "start"]

log = logging.getLogger("toolexec.worker")


def prepare(pool: str, metrics_port: int | None) -> None:
    """Turn on multiprocess metrics for a prefork worker that serves them.

    Each run gets a fresh directory (removed at exit): counters left by an
    earlier run's processes would otherwise be added to this run's. An
    operator's own ``PROMETHEUS_MULTIPROC_DIR`` is used as it is.
    """
    if metrics_port is None or pool != "prefork" or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    folder = tempfile.mkdtemp(prefix="toolexec-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    signals.worker_process_shutdown.connect(_forget_child, weak=False)


def _forget_child(pid: int | None = None, **_: Any) -> None:
    """A prefork child is going: its in-flight gauge must stop counting."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


def start(settings: Settings, metrics_port: int | None) -> bool:
    """Serve ``/metrics`` (when a port is set) and install the log format.

    Returns whether the worker starts quiet: with JSON logs, no text banner, so that
    every line is JSON.
    """
    from toolexec.ops import metrics
    from toolexec.worker.logs import install

    install(settings.log_format)
    metrics.install()  # the runtime's reporter: the core never imports prometheus_client
    if metrics_port is not None:
        _serve(settings, metrics_port)
    return settings.log_format == "json"


def _serve(settings: Settings, metrics_port: int) -> None:
    from toolexec.breaker import CircuitBreaker
    from toolexec.connection import fail_fast_client, redis_url
    from toolexec.keys import Keys
    from toolexec.ops.metrics import serve

    breakers = CircuitBreaker(fail_fast_client(redis_url(settings)), Keys(settings.key_prefix))
    try:
        depths, lanes = queue_depths(settings), lane_views(settings)
        serve(metrics_port, settings.metrics_address, breakers, depths, lanes)
    except OSError as exc:
        from toolexec.errors import ConfigurationError

        raise ConfigurationError(
            f"cannot serve metrics on {settings.metrics_address}:{metrics_port} ({exc}); "
            "pick a free port with --metrics-port (one per worker on a host)"
        ) from exc
    where = f"http://{settings.metrics_address}:{metrics_port}/metrics"

    def announce(**_: Any) -> None:  # once Celery's logging is set up
        log.info("Prometheus metrics on %s", where)

    signals.worker_ready.connect(announce, weak=False)


def queue_depths(settings: Settings) -> Callable[[], dict[str, int | None]]:
    """What ``toolexec_queue_depth`` reads on each scrape: every published tool's queue."""
    from toolexec.connection import fail_fast_client, redis_url
    from toolexec.keys import Keys
    from toolexec.ops.status import amqp_depths, queue_names, redis_depths, redis_lanes
    from toolexec.stores import catalog

    url = redis_url(settings)
    client = fail_fast_client(url)
    keys = Keys(settings.key_prefix)
    broker = settings.broker_url or url
    on_rabbitmq = broker.startswith(("amqp://", "amqps://", "pyamqp://"))
    queues = client if on_rabbitmq or broker == url else fail_fast_client(broker)

    def read() -> dict[str, int | None]:
        names = queue_names(catalog.read(client, keys), settings.default_queue)
        if on_rabbitmq:
            return amqp_depths(broker, names)
        depths: dict[str, int | None] = dict(redis_depths(queues, names))
        for name, view in redis_lanes(queues, names, settings.key_prefix, time.time()).items():
            depths[name] = (depths[name] or 0) + view.in_lanes  # sorted into lanes: waiting too
        return depths

    return read


def lane_views(settings: Settings) -> Callable[[], dict[str, Any]]:
    """What the lane metrics read on each scrape: each queue's lanes on a Redis broker."""
    from toolexec.connection import fail_fast_client, redis_url
    from toolexec.keys import Keys
    from toolexec.ops.status import queue_names, redis_lanes
    from toolexec.stores import catalog

    url = redis_url(settings)
    client = fail_fast_client(url)
    keys = Keys(settings.key_prefix)
    broker = settings.broker_url or url
    if broker.startswith(("amqp://", "amqps://", "pyamqp://")):
        return dict  # RabbitMQ's own priorities: no lanes to read
    queues = client if broker == url else fail_fast_client(broker)

    def read() -> dict[str, Any]:
        names = queue_names(catalog.read(client, keys), settings.default_queue)
        views = redis_lanes(queues, names, settings.key_prefix, time.time())
        return {name: view for name, view in views.items() if view.in_lanes}

    return read
