"""What a worker reports about each attempt: Redis counters and the registered reporters.

The task calls four hooks (an attempt started; it ended in a retry; the call
ended; the attempt stopped without an outcome of its own, deferred by a rate
limit or answered by another worker) and this fans them out to
:class:`~toolexec.stores.stats.CallStats` (fleet-wide counters for ``toolexec
status``) and to every :class:`Reporter` the process registered. The
Prometheus metrics are one (:class:`toolexec.ops.metrics.Metrics`), registered
by ``toolexec worker`` with :func:`add_reporter`: the worker's core imports
neither them nor prometheus_client, which is the optional ``ops`` extra
(docs/architecture.md, Boundaries). Observing must never fail a call: a report
that raises (Redis away, a bug in a metric) is logged and dropped, with a
warning at most once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from toolexec.breaker import Transition
from toolexec.clock import Clock, SystemClock
from toolexec.context import CallContext
from toolexec.keys import WRITE_ID_MARGIN_S
from toolexec.layers.batch import Batch
from toolexec.registry import ToolSpec
from toolexec.results import ToolResult
from toolexec.stores.stats import CallStats
from toolexec.tracing import AttemptSpans

__all__ = ["LEASE_GRACE_S", "CallObservers", "Reporter", "add_reporter", "reporters"]

log = logging.getLogger("toolexec.worker")

#: An attempt counts as running until its time limit plus this, in case the
#: worker running it died: the same grace prefork's hard limit gives.
LEASE_GRACE_S = 30.0

_WARN_INTERVAL_S = 60.0


class Reporter(Protocol):
    """What a process-level listener hears of the calls this worker runs.

    The hooks are called on the attempt's thread and must not block; one that
    raises is dropped like any other report.
    """

    def started(self, tool: str, call_id: str, attempt: int, lease_until: float) -> None: ...

    def retrying(self, tool: str, call_id: str, attempt: int, error_type: str) -> None: ...

    def finished(
        self, tool: str, call_id: str, attempt: int, error_type: str | None, elapsed_s: float
    ) -> None: ...

    def withdrawn(self, tool: str, call_id: str, attempt: int) -> None: ...

    def fell_back(self, tool: str, source: str) -> None:
        """A call of ``tool`` was answered by a fallback (``source``: its tool or the cache)."""

    def offloaded(self, tool: str, size_bytes: int, kind: str) -> None:
        """A ``kind`` (result or arguments) of ``tool`` went to the payload store."""

    def write_dropped(self, write: str) -> None:
        """A held write beside an answer was given up (``toolexec.layers.batch``)."""

    def on_transition(self, transition: Transition) -> None:
        """A breaker this process drove changed state."""


#: Factories of this process's reporters, called when a worker's runtime is built
#: (in a prefork child, after the fork: a reporter's state is the child's own).
#: Process-wide because the registering side (``toolexec worker``) has no route
#: to the runtime Celery builds later; docs/architecture.md lists it.
_factories: list[Callable[[], Reporter]] = []
_factories_lock = threading.Lock()


def add_reporter(factory: Callable[[], Reporter]) -> None:
    """Have every worker runtime this process builds report to ``factory()`` (once per factory)."""
    with _factories_lock:
        if factory not in _factories:
            _factories.append(factory)


def reporters() -> list[Reporter]:
    """The reporters registered in this process, made now."""
    with _factories_lock:
        factories = list(_factories)
    return [factory() for factory in factories]


class CallObservers:
    """Fans the task's hooks out; ``stats`` None turns the Redis counters off."""

    def __init__(
        self,
        stats: CallStats | None,
        reporters: Sequence[Reporter] = (),
        clock: Clock | None = None,
    ) -> None:
        self.stats = stats
        self.reporters = tuple(reporters)
        self.clock = clock or SystemClock()
        self.spans = AttemptSpans()  # the outcome on the attempt's span, when tracing
        self._warned_at = float("-inf")

    def started(
        self, spec: ToolSpec, ctx: CallContext, attempt: int, batch: Batch | None = None
    ) -> None:
        now = self.clock.now()
        lease_until = now + max(0.0, min(spec.policy.timeout, ctx.deadline - now)) + LEASE_GRACE_S
        for r in self.reporters:
            self._quietly(r.started, spec.name, ctx.call_id, attempt, lease_until)
        if self.stats is not None:
            # not held: the admission goes before the attempt, which does not wait for it
            self._counted(
                self.stats.started, batch, None, spec.name, ctx.call_id, attempt, lease_until
            )

    def retrying(
        self,
        spec: ToolSpec,
        ctx: CallContext,
        attempt: int,
        error_type: str,
        batch: Batch | None = None,
    ) -> None:
        for r in self.reporters:
            self._quietly(r.retrying, spec.name, ctx.call_id, attempt, error_type)
        if self.stats is not None:
            self._counted(
                self.stats.retrying, batch, ctx, spec.name, ctx.call_id, attempt, error_type
            )

    def finished(
        self, ctx: CallContext, attempt: int, result: ToolResult, batch: Batch | None = None
    ) -> None:
        error_type = None if result.error is None else str(result.error.type)
        elapsed_s = result.elapsed_ms / 1000.0
        for r in self.reporters:
            self._quietly(r.finished, ctx.tool, ctx.call_id, attempt, error_type, elapsed_s)
        self._quietly(self.spans.finished, ctx.call_id, result)
        if self.stats is not None:
            self._counted(
                partial(
                    self.stats.finished,
                    call_of=_called(ctx),
                    degraded=result.degraded,
                    chained=result.fallback is not None,
                ),
                batch,
                ctx,
                ctx.tool,
                ctx.call_id,
                attempt,
                error_type,
            )

    def handed_on(
        self, spec: ToolSpec, ctx: CallContext, attempt: int, batch: Batch | None = None
    ) -> None:
        """The attempt ended and its result goes to the fallback chain (which may answer)."""
        for r in self.reporters:
            self._quietly(r.withdrawn, spec.name, ctx.call_id, attempt)
        if self.stats is not None:
            self._counted(self.stats.handed_on, batch, ctx, spec.name, ctx.call_id, attempt)

    def withdrawn(
        self, spec: ToolSpec, ctx: CallContext, attempt: int, batch: Batch | None = None
    ) -> None:
        for r in self.reporters:
            self._quietly(r.withdrawn, spec.name, ctx.call_id, attempt)
        if self.stats is not None:
            self._counted(self.stats.withdrawn, batch, ctx, spec.name, ctx.call_id, attempt)

    def fell_back(self, tool: str, source: str) -> None:
        for r in self.reporters:
            self._quietly(r.fell_back, tool, source)

    def offloaded(self, tool: str, size_bytes: int, kind: str = "result") -> None:
        for r in self.reporters:
            self._quietly(r.offloaded, tool, size_bytes, kind)

    def write_dropped(self, write: str) -> None:
        for r in self.reporters:
            self._quietly(r.write_dropped, write)

    def on_transition(self, transition: Transition) -> None:
        """A breaker listener (:meth:`CircuitBreaker.add_listener`)."""
        for r in self.reporters:
            self._quietly(r.on_transition, transition)

    def _counted(
        self,
        report: Callable[..., None],
        batch: Batch | None,
        held: CallContext | None,
        *args: object,
    ) -> None:
        """A Redis counter, queued on the attempt's ``batch`` when there is one.

        With ``held`` (the call) it is a held write there, sent again after a
        blip while the call's deadline allows (``toolexec.layers.batch``). Its error
        comes when the batch runs or gives it up, and is dropped the same way.
        """
        if batch is None:
            self._quietly(report, *args)
            return

        def on_error(exc: Exception) -> None:
            self._dropped(report, exc)

        if held is None:
            self._quietly(report, *args, batch, on_error)
        else:
            self._quietly(report, *args, batch, on_error, held.deadline + WRITE_ID_MARGIN_S)

    def _quietly(self, report: Callable[..., None], *args: object) -> None:
        try:
            report(*args)
        except Exception as exc:
            self._dropped(report, exc)

    def _dropped(self, report: Callable[..., None], exc: Exception) -> None:
        if time.monotonic() - self._warned_at >= _WARN_INTERVAL_S:
            self._warned_at = time.monotonic()
            log.warning(
                "call report %s not recorded (%s: %s); calls go on without it",
                getattr(report, "__qualname__", report),
                type(exc).__name__,
                exc,
            )


def _called(ctx: CallContext) -> str:
    """The tool the caller called: a fallback step's context keeps it in its chain state."""
    return ctx.fallback.primary if ctx.fallback is not None else ctx.tool
