"""Workers publish their catalog when ready, and refresh it while alive.

Clients read the catalog to validate and route calls, and the heartbeat
tells them (and ``toolexec`` status views) which workers are alive.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery

from toolexec import catalog
from toolexec.app import settings_of
from toolexec.clock import SystemClock
from toolexec.keys import Keys
from toolexec.registry import default_registry
from toolexec.tasks.runtime import runtime_of

__all__ = ["HEARTBEAT_S", "publish_catalog", "start_heartbeat"]

log = logging.getLogger("toolexec.worker")

#: How often a worker refreshes its heartbeat; clients treat a worker silent for
#: three beats as gone.
HEARTBEAT_S = 15.0


def publish_catalog(celery_app: Celery, worker: str) -> int:
    settings = settings_of(celery_app)
    return catalog.publish(
        runtime_of(celery_app).redis,
        Keys(settings.key_prefix),
        default_registry,
        settings.default_queue,
        worker,
        SystemClock().now(),
    )


def start_heartbeat(celery_app: Celery, worker: str, stop: threading.Event) -> threading.Thread:
    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                publish_catalog(celery_app, worker)
            except Exception as exc:  # a missed beat must never stop the worker
                log.warning("could not refresh the tool catalog: %s", exc)

    thread = threading.Thread(target=beat, name="toolexec-heartbeat", daemon=True)
    thread.start()
    return thread


def on_worker_ready(sender: Any, **_: Any) -> None:
    celery_app = sender.app
    name = sender.hostname
    count = publish_catalog(celery_app, name)
    log.info("worker %s published %d tools: %s", name, count, ", ".join(default_registry.names()))
    start_heartbeat(celery_app, name, threading.Event())
