"""Start Celery's worker as ``celery worker`` would, without Celery's command line.

``app.worker_main(argv)`` goes through ``celery.bin.celery``: click-repl and
prompt_toolkit, every ``celery`` sub-command, and each ``celery.commands`` plugin
(Flower's web app and Tornado among them), imported into every worker process
before the same :class:`celery.apps.worker.Worker` is built, for options
``toolexec worker`` chose itself. Started to a first answer, the same app through
``celery -A toolexec.worker.app worker`` took 0.78 s of CPU and 84 MiB, built here
0.72 s and 72 MiB (medians of 7, ``python bench/worker_start.py --rounds 7``,
2026-12-03). The command line is toolexec's own (``toolexec.ops.cli``), so the
Worker is built from those options directly, converted as Celery's command line
converts them (pool names through ``celery.concurrency``, ``%h`` in the name,
autoscale's ``MAX,MIN``); the exit code is left to the caller, as ``worker_main``
leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery

__all__ = ["WorkerOptions", "autoscale_bounds", "start_worker"]


@dataclass(frozen=True)
class WorkerOptions:
    """What ``toolexec worker`` decided; ``concurrency`` is ignored under ``autoscale``."""

    queues: str
    pool: str
    hostname: str
    loglevel: str
    concurrency: int
    autoscale: str | None = None
    task_events: bool = False
    #: No text banner: with JSON logs every line stays JSON.
    quiet: bool = False


def autoscale_bounds(value: str) -> tuple[int, int]:
    """``MAX,MIN`` (either order) or ``MAX`` as ``(max, min)``, as ``celery worker`` reads it."""
    parts = [part.strip() for part in value.split(",")]
    if not 1 <= len(parts) <= 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"--autoscale takes MAX,MIN or MAX (integers), not {value!r}")
    numbers = sorted((int(part) for part in parts), reverse=True)
    return (numbers[0], numbers[1] if len(numbers) == 2 else 0)


def start_worker(app: Celery, options: WorkerOptions) -> int:
    """Run the worker until it stops; returns Celery's exit code for it."""
    from celery import concurrency
    from celery.utils.log import mlevel
    from celery.utils.nodenames import default_nodename, host_format

    settings: dict[str, object] = {
        "hostname": host_format(default_nodename(options.hostname)),
        "pool_cls": concurrency.get_implementation(options.pool),
        "loglevel": mlevel(options.loglevel.upper()),
        "queues": [queue for queue in options.queues.split(",") if queue],
        "task_events": options.task_events,
        "quiet": options.quiet,
        # Mingle costs a second at every reconnect and gossip breaks on it (toolexec uses
        # neither: no revokes to sync, no worker events to follow).
        "without_mingle": True,
        "without_gossip": True,
    }
    if options.autoscale:
        settings["autoscale"] = autoscale_bounds(options.autoscale)
    else:
        settings["concurrency"] = options.concurrency
    worker = app.Worker(**settings)
    worker.start()
    return int(worker.exitcode or 0)
