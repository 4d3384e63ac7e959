"""Run a tool body with a time limit that holds on every Celery pool.

Celery enforces time limits only on prefork (and hard limits on gevent); the
threads and solo pools enforce none (docs/background.md, Celery). So the limit is enforced
here: a sync tool runs on a body thread and is abandoned when its time is up
(the caller gets ``timeout`` on time; the thread finishes in the background),
and an async tool runs on this process's event loop and is cancelled.
Tools should still carry their own I/O timeouts so abandoned threads are rare.

Body threads are reused (:class:`_BodyThreads`): starting a thread for every call
cost a ``clone``, the new thread's start-up hand-shake and its exit, on every call
of a worker whose CPU per call bounds its throughput. A fixed-size executor
(``ThreadPoolExecutor``) would not do: an abandoned body keeps its thread, and
enough stuck bodies would leave the next calls queued behind them, their time
running out before they start. So a call takes an idle thread or starts a new
one, never waits for one, and a thread goes back to the idle ones when its body
returns, however late.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from toolexec.errors import ToolTimeoutError

__all__ = ["Runner"]

log = logging.getLogger(__name__)


#: What a body thread hands back: ``(True, value)`` or ``(False, exception)``.
_Reply = tuple[bool, Any]
_Job = tuple[contextvars.Context, Callable[..., Any], dict[str, Any], "queue.SimpleQueue[_Reply]"]


class _BodyThreads:
    """Idle body threads, each waiting on an inbox of its own; grows when none is idle.

    ``max_idle`` bounds how many wait at once (the rest exit when their body
    returns), and a thread idle for ``idle_s`` exits too, so a burst's threads do
    not stay forever. After a fork (prefork) the parent's threads do not exist in
    the child, so their inboxes are forgotten.
    """

    def __init__(self, max_idle: int = 256, idle_s: float = 60.0) -> None:
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._idle: list[queue.SimpleQueue[_Job | None]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._names = itertools.count(1)

    def submit(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> queue.SimpleQueue[_Reply]:
        """Start ``func(**kwargs)`` on a body thread; its reply arrives on the returned queue."""
        reply: queue.SimpleQueue[_Reply] = queue.SimpleQueue()
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._pid = [], os.getpid()
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve,
                args=(inbox,),
                name=f"toolexec-body-{next(self._names)}",
                daemon=True,
            ).start()
        # The body sees the attempt's context vars (its trace span, for the HTTP spans
        # and traceparent of the tool's own clients), as the async path does by itself.
        inbox.put((contextvars.copy_context(), func, kwargs, reply))
        return reply

    def idle(self) -> int:
        """How many threads wait for a body now."""
        with self._lock:
            return len(self._idle)

    def _serve(self, inbox: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = self._next(inbox)
            if job is None:
                return
            context, func, kwargs, reply = job
            try:
                reply.put((True, context.run(func, **kwargs)))
            except BaseException as exc:  # handed to the caller's thread
                reply.put((False, exc))
            del job, context, func, kwargs, reply  # keep nothing of the call while idle
            if not self._back(inbox):
                return

    def _next(self, inbox: queue.SimpleQueue[_Job | None]) -> _Job | None:
        """The next job, or None when idle too long (and nobody took this thread meanwhile)."""
        while True:
            try:
                return inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return None
                # taken just as the wait ended: its job is on the way

    def _back(self, inbox: queue.SimpleQueue[_Job | None]) -> bool:
        with self._lock:
            if self._pid != os.getpid() or len(self._idle) >= self.max_idle:
                return False
            self._idle.append(inbox)
            return True


class Runner:
    """Runs callables and coroutines with a hard wall-clock limit."""

    def __init__(self, body_threads: _BodyThreads | None = None) -> None:
        self._threads = body_threads or _BodyThreads()
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
        reply = self._threads.submit(func, kwargs)
        try:
            # a limit already spent times out at once (the queue refuses a negative wait)
            ok, value = reply.get(timeout=max(limit, 0.0))
        except queue.Empty:
            self.abandoned += 1
            log.warning(
                "tool %s overran its %.3f s limit; its thread is abandoned (%d so far)",
                func.__name__,
                limit,
                self.abandoned,
            )
            raise _timeout(limit) from None
        if not ok:
            raise value
        return value

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
