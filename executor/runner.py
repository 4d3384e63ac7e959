"""Run a tool body with a time limit that holds on every Celery pool.

Celery enforces time limits only on prefork (and hard limits on gevent); the
threads and solo pools enforce none (docs/background.md, Celery). So the limit is enforced
here: a sync tool runs on its own thread and is abandoned when its time is up
(the caller gets ``timeout`` on time; the thread finishes in the background),
and an async tool runs on this process's event loop and is cancelled.
Tools should still carry their own I/O timeouts so abandoned threads are rare.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from toolexec.errors import ToolTimeoutError

__all__ = ["Runner"]

log = logging.getLogger(__name__)


class _Outcome:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Runner:
    """Runs callables and coroutines with a hard wall-clock limit."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_pid = 0
        self._lock = threading.Lock()
        self.abandoned = 0

    def run(self, func: Callable[..., Any], kwargs: dict[str, Any], limit: float) -> Any:
        """``func(**kwargs)`` within ``limit`` seconds, or :class:`ToolTimeoutError`."""
        if asyncio.iscoroutinefunction(func):
            return self._run_async(func, kwargs, limit)
        return self._run_sync(func, kwargs, limit)

    def _run_sync(self, func: Callable[..., Any], kwargs: dict[str, Any], limit: float) -> Any:
        outcome = _Outcome()
        # The body sees the attempt's context vars (its trace span, for the HTTP spans
        # and traceparent of the tool's own clients), as the async path does by itself.
        context = contextvars.copy_context()

        def target() -> None:
            try:
                outcome.value = context.run(func, **kwargs)
            except BaseException as exc:  # handed to the caller's thread
                outcome.error = exc
            finally:
                outcome.done.set()

        thread = threading.Thread(target=target, name=f"tool-{func.__name__}", daemon=True)
        thread.start()
        if not outcome.done.wait(limit):
            self.abandoned += 1
            log.warning(
                "tool %s overran its %.3f s limit; its thread is abandoned (%d so far)",
                func.__name__,
                limit,
                self.abandoned,
            )
            raise _timeout(limit)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def _run_async(self, func: Callable[..., Any], kwargs: dict[str, Any], limit: float) -> Any:
        loop = self._event_loop()
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(func(**kwargs), limit), loop)
        try:
            return future.result(timeout=limit + 1.0)
        except TimeoutError:
            future.cancel()
            raise _timeout(limit) from None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """One loop per process, started lazily so prefork children get their own."""
        with self._lock:
            if self._loop is None or self._loop_pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="toolexec-async-tools", daemon=True
                ).start()
                self._loop, self._loop_pid = loop, os.getpid()
            return self._loop


def _timeout(limit: float) -> ToolTimeoutError:
    return ToolTimeoutError(
        f"the tool did not finish within its time limit of {limit:.3g} s",
        suggestion="The service was too slow; try again later or ask for less at once.",
        details={"limit_s": round(limit, 3)},
    )
