"""What a worker reports about each attempt: Redis counters and Prometheus metrics.

The task calls four hooks (an attempt started; it ended in a retry; the call
ended; the attempt stopped without an outcome of its own, deferred by a rate
limit or answered by another worker) and this fans them out to
:class:`~toolexec.stats.CallStats` (fleet-wide counters for ``toolexec
status``) and :class:`~toolexec.ops.metrics.Metrics` (this process's
``/metrics``). Observing must never fail a call: a report that raises (Redis
away, a bug in a metric) is logged and dropped, with a warning at most once a
minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from toolexec.batch import Batch
from toolexec.clock import Clock, SystemClock
from toolexec.context import CallContext
from toolexec.keys import WRITE_ID_MARGIN_S
from toolexec.ops.metrics import Metrics
from toolexec.registry import ToolSpec
from toolexec.results import ToolResult
from toolexec.stats import CallStats
from toolexec.tracing import AttemptSpans

__all__ = ["LEASE_GRACE_S", "CallObservers"]

log = logging.getLogger("toolexec.worker")

#: An attempt counts as running until its time limit plus this, in case the
#: worker running it died: the same grace prefork's hard limit gives.
LEASE_GRACE_S = 30.0

_WARN_INTERVAL_S = 60.0


class CallObservers:
    """Fans the task's hooks out; ``stats`` None turns the Redis counters off."""

    def __init__(
        self, stats: CallStats | None, metrics: Metrics, clock: Clock | None = None
    ) -> None:
        self.stats = stats
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.spans = AttemptSpans()  # the outcome on the attempt's span, when tracing
        self._warned_at = float("-inf")

    def started(
        self, spec: ToolSpec, ctx: CallContext, attempt: int, batch: Batch | None = None
    ) -> None:
        now = self.clock.now()
        lease_until = now + max(0.0, min(spec.policy.timeout, ctx.deadline - now)) + LEASE_GRACE_S
        self._quietly(self.metrics.started, spec.name, ctx.call_id, attempt, lease_until)
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
        self._quietly(self.metrics.retrying, spec.name, ctx.call_id, attempt, error_type)
        if self.stats is not None:
            self._counted(
                self.stats.retrying, batch, ctx, spec.name, ctx.call_id, attempt, error_type
            )

    def finished(
        self, ctx: CallContext, attempt: int, result: ToolResult, batch: Batch | None = None
    ) -> None:
        error_type = None if result.error is None else str(result.error.type)
        elapsed_s = result.elapsed_ms / 1000.0
        self._quietly(self.metrics.finished, ctx.tool, ctx.call_id, attempt, error_type, elapsed_s)
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
        self._quietly(self.metrics.withdrawn, spec.name, ctx.call_id, attempt)
        if self.stats is not None:
            self._counted(self.stats.handed_on, batch, ctx, spec.name, ctx.call_id, attempt)

    def withdrawn(
        self, spec: ToolSpec, ctx: CallContext, attempt: int, batch: Batch | None = None
    ) -> None:
        self._quietly(self.metrics.withdrawn, spec.name, ctx.call_id, attempt)
        if self.stats is not None:
            self._counted(self.stats.withdrawn, batch, ctx, spec.name, ctx.call_id, attempt)

    def _counted(
        self,
        report: Callable[..., None],
        batch: Batch | None,
        held: CallContext | None,
        *args: object,
    ) -> None:
        """A Redis counter, queued on the attempt's ``batch`` when there is one.

        With ``held`` (the call) it is a held write there, sent again after a
        blip while the call's deadline allows (``toolexec.batch``). Its error
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
