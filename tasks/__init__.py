"""The worker side: Celery tasks that run tools, and the built-in tools.

Importing this package (the worker does, through Celery's ``imports``
setting) turns every tool in the registry, and every tool registered later,
into a ``tools.<name>`` task on :data:`toolexec.worker.app.app`, and publishes the
catalog when the worker is ready.
"""

from __future__ import annotations

from typing import Any

from celery import signals

from toolexec import tracing
from toolexec.registry import default_registry
from toolexec.tasks import http, interrupt, lease_sweeper
from toolexec.tasks.catalog_publisher import (
    on_worker_ready,
    on_worker_shutting_down,
    publish_catalog,
)
from toolexec.tasks.fallback_task import register_fallback_task
from toolexec.tasks.message_guard import MessageGuard
from toolexec.tasks.runtime import WorkerRuntime, runtime_of, stop_runtime
from toolexec.tasks.tool_task import ToolFailed, ToolTask, register_tool_task
from toolexec.worker.app import app
from toolexec.worker.logs import drop_duplicate_success_lines, scrub_handlers

__all__ = [
    "ToolFailed",
    "ToolTask",
    "WorkerRuntime",
    "http",
    "publish_catalog",
    "register_tool_task",
    "runtime_of",
]

default_registry.subscribe(lambda spec: register_tool_task(app, spec))
# refuses poison messages and hands back tasks this worker lacks, before Celery parses them
app.steps["consumer"].add(MessageGuard)
register_fallback_task(app)  # toolexec.fallback: starts chains, runs cache and explanation
signals.worker_ready.connect(on_worker_ready, weak=False)
# a worker that stops leaves the live set at once (a remote shutdown sends only the second)
signals.worker_shutting_down.connect(on_worker_shutting_down, weak=False)
signals.worker_shutdown.connect(on_worker_shutting_down, weak=False)
# the successes a process summed and has not written yet are written as it stops
signals.worker_shutdown.connect(lambda sender, **_: stop_runtime(sender.app), weak=False)
signals.worker_process_shutdown.connect(lambda **_: stop_runtime(app), weak=False)
# every log line scrubbed of credentials and kept on one line, under `celery -A toolexec.worker.app
# worker` too (`toolexec worker` installs the same in toolexec.worker.logs.install)
signals.after_setup_logger.connect(scrub_handlers, weak=False)
signals.after_setup_task_logger.connect(scrub_handlers, weak=False)
# one line per answered call: toolexec's, not Celery's "succeeded" line repeating it
drop_duplicate_success_lines()
# hands calls of a worker that died on to live ones (toolexec.idempotency)
signals.worker_ready.connect(lease_sweeper.on_worker_ready, weak=False)
# a second Ctrl-C or a SIGQUIT stops a threads/solo/green worker at once, handing its calls
# on (toolexec.tasks.interrupt); Celery's cold shutdown cannot kill a thread
signals.worker_ready.connect(lambda sender, **_: interrupt.install(sender.controller), weak=False)
signals.worker_shutting_down.connect(interrupt.on_first_interrupt, weak=False)


def _trace_attempts(**_: Any) -> None:
    """Celery's ``worker_init``: export spans if ``OTEL_*`` asks, and open one per attempt."""
    if tracing.configure("toolexec-worker"):
        tracing.install_worker_hooks(signals)


# a span per attempt when OTEL_* asks for traces (toolexec.tracing)
signals.worker_init.connect(_trace_attempts, weak=False)
