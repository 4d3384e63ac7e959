"""A second Ctrl-C (or a SIGQUIT) stops a threads-pool worker at once, losing no call.

Celery's answer to a second Ctrl-C is a cold shutdown: it asks the pool to
kill each running job. The threads pool (toolexec's default), solo and the
green pools cannot kill a job (``NotImplementedError ... does not implement
kill_job``, logged as an unrecoverable error with its traceback), and the
calls run on while the worker hangs. A thread cannot be killed either, so
toolexec does what a crash does, on purpose and in order:

* every message this worker holds goes back to its queue at once
  (:func:`toolexec.transport.orphans.hand_back`), so another worker, or this one
  restarted, runs the read-only calls again (they are at-least-once anyway);
* a call that had started keeps its idempotency record and lease
  (:mod:`toolexec.idempotency`): the lease is no longer renewed, and when it
  runs out (``idempotency_lease_s``) another worker's sweeper takes the call
  over, runs the tool's ``check``, and without one answers ``unknown`` (the
  write may have happened) instead of writing twice;
* the worker leaves the live set and the process ends with exit code 1,
  printing one line that says so.

The prefork pool keeps Celery's cold shutdown: it can kill its children.
SIGTERM stays Celery's warm shutdown (calls in flight finish).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import platforms
from celery.worker import state as worker_state

from toolexec.tasks.catalog_publisher import on_worker_shutting_down
from toolexec.transport import orphans
from toolexec.worker.app import settings_of

__all__ = ["ARMED_LINE", "install", "kills_jobs", "on_first_interrupt", "stop_line"]

log = logging.getLogger("toolexec.worker")

#: Exit code of a worker stopped with calls abandoned (Celery's cold shutdown uses 1 too).
EXIT_STOPPED_AT_ONCE = 1


def kills_jobs(pool_class: type) -> bool:
    """Whether the pool can terminate a running job (only prefork's processes can)."""
    from celery.concurrency.prefork import TaskPool as PreforkPool

    return issubclass(pool_class, PreforkPool)


def stop_line(signal_name: str, in_flight: int, handed_back: int, lease_s: float) -> str:
    """The one line a worker prints when it stops at once (pure)."""
    what = "second Ctrl-C" if signal_name == "SIGINT" else signal_name
    return (
        f"toolexec worker: {what}, stopping now with {in_flight} call(s) in flight: "
        f"{handed_back} message(s) back in their queues for another worker; a call that had "
        f"started is taken over when its lease runs out (about {lease_s:g} s): read-only "
        "calls run again, side-effecting ones are checked or answered 'unknown'"
    )


def _stop_now(worker: Any, signal_name: str) -> None:
    """Hand everything back and end the process; never returns."""
    in_flight = len(worker_state.active_requests)
    handed_back = 0
    lease_s = 0.0
    try:
        lease_s = settings_of(worker.app).idempotency_lease_s
        handed_back = orphans.hand_back()
        on_worker_shutting_down(worker.hostname)
    except Exception as exc:  # the leases and the other watchers still hand them on
        log.warning("stopping at once: %s", exc)
    line = stop_line(signal_name, in_flight, handed_back, lease_s)
    try:
        sys.__stderr__.write(line + "\n") if sys.__stderr__ else None
        sys.__stderr__.flush() if sys.__stderr__ else None
    finally:
        # No interpreter shutdown: it would wait for the pool's threads, which run on.
        os._exit(EXIT_STOPPED_AT_ONCE)


def _handler(worker: Any, signal_name: str) -> Any:
    def handle(*_: Any) -> None:
        _stop_now(worker, signal_name)

    return handle


def install(worker: Any) -> bool:
    """Make SIGQUIT stop ``worker`` at once unless its pool can kill jobs; whether it did.

    Called when the worker is ready, after Celery installed its own handlers.
    """
    if kills_jobs(worker.pool_cls if isinstance(worker.pool_cls, type) else type(worker.pool)):
        return False
    platforms.signals["SIGQUIT"] = _handler(worker, "SIGQUIT")
    _installed[worker.hostname] = worker
    return True


_installed: dict[str, Any] = {}


def on_first_interrupt(sender: Any = None, sig: str = "", **_: Any) -> None:
    """After Celery's warm shutdown on a first Ctrl-C, the second one stops at once.

    Runs from Celery's ``worker_shutting_down`` signal, sent after Celery put its
    cold-shutdown handler in place: this one replaces it.
    """
    worker = _installed.get(sender) if isinstance(sender, str) else None
    if worker is not None and sig == "SIGINT":
        platforms.signals["SIGINT"] = _handler(worker, "SIGINT")
        # Said once the handler is in place (Celery's own line comes before it is): a
        # second Ctrl-C from here on stops at once, never Celery's cold shutdown.
        if sys.__stderr__:
            sys.__stderr__.write(ARMED_LINE + "\n")
            sys.__stderr__.flush()


#: What a worker says once a second Ctrl-C will stop it at once.
ARMED_LINE = "toolexec: Ctrl-C again stops this worker at once, handing its calls on"
