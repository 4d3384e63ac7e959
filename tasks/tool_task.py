"""Each tool as its own Celery task, ``tools.<name>``; thin by design.

The task deserialises the message, asks the executor for a verdict on this
attempt and maps it onto Celery: a final result is pushed to the caller's
reply list, then the task returns (SUCCESS) or raises :class:`ToolFailed`
(FAILURE, with the error type in Flower); a transient failure raises
:class:`RetryLater`, which Celery's autoretry turns into ``Task.retry`` with
the countdown the retry policy computed (Celery's own backoff is whole
seconds and blind to Retry-After and deadlines).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Retry as CeleryRetry

from toolexec.app import settings_of
from toolexec.breaker import CircuitBreaker
from toolexec.breaker.layer import BreakerLayer
from toolexec.clock import Clock, SystemClock
from toolexec.connection import fail_fast_client, redis_client, redis_url
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.execution import Defer, Executor, Final, NoReply, Retry, error_result
from toolexec.fallback.cache import LastGoodLayer, worker_cache
from toolexec.fallback.chain import ChainRunner
from toolexec.faults import FaultConfig, FaultLayer, FaultStore
from toolexec.idempotency import IdempotencyLayer, IdempotencyStore
from toolexec.keys import Keys
from toolexec.logs import call_fields
from toolexec.observe import CallObservers
from toolexec.ops.metrics import metrics
from toolexec.payloads import worker_payloads
from toolexec.ratelimit import RateLimiter, RateLimitLayer, RateLimitPolicy
from toolexec.redaction import secret_names, shown_kwargs
from toolexec.registry import ToolSpec, default_registry
from toolexec.replies import deliver
from toolexec.results import ErrorInfo, ToolResult
from toolexec.retry_budget import RetryBudget, RetryBudgetLayer
from toolexec.settings import Settings
from toolexec.stats import CallStats

__all__ = ["DeferLater", "RetryLater", "ToolFailed", "ToolTask", "register_tool_task"]

log = logging.getLogger("toolexec.worker")

#: Extra seconds past a tool's own limit before prefork's hard limit kills the
#: child: the executor's own limit should always fire first.
_HARD_LIMIT_GRACE_S = 30


class ToolFailed(Exception):
    """A call ended in failure; raised so Celery and Flower show FAILURE."""


class RetryLater(Exception):
    """The attempt failed transiently and the policy allows another."""

    def __init__(self, verdict: Retry) -> None:
        error = verdict.error
        super().__init__(f"{error.error_type}: {error.message}; retrying in {verdict.delay:.3f} s")
        self.verdict = verdict


class DeferLater(Exception):
    """The tool's shared rate limit reserved a later slot: wait in the queue, using no attempt."""

    def __init__(self, verdict: Defer) -> None:
        super().__init__(f"rate limited by toolexec; waiting {verdict.delay:.3f} s for a slot")
        self.verdict = verdict


@dataclass
class _WorkerState:
    pid: int
    redis: redis.Redis
    keys: Keys
    executor: Executor
    chains: ChainRunner
    observers: CallObservers


_state: _WorkerState | None = None
_state_lock = threading.Lock()


def worker_state(celery_app: Celery) -> _WorkerState:
    """Per-process connections, created after a prefork child is forked."""
    global _state
    with _state_lock:
        if _state is None or _state.pid != os.getpid():
            settings = settings_of(celery_app)
            url = redis_url(settings)
            _state = _WorkerState(
                pid=os.getpid(),
                redis=redis_client(url),
                keys=Keys(settings.key_prefix),
                executor=build_executor(settings, url),
                chains=ChainRunner.for_worker(settings, url, default_registry),
                observers=build_observers(settings, url),
            )
        return _state


def build_observers(settings: Settings, url: str) -> CallObservers:
    """Counters for ``toolexec status`` (unless turned off) and Prometheus metrics."""
    stats = (
        CallStats(
            fail_fast_client(url),
            Keys(settings.key_prefix),
            lease_ttl_s=settings.visibility_timeout,
        )
        if settings.stats
        else None
    )
    return CallObservers(stats, metrics())


def build_executor(settings: Settings, url: str) -> Executor:
    """The worker's executor and its layers, outermost first."""
    keys = Keys(settings.key_prefix)
    breakers = CircuitBreaker(
        fail_fast_client(url), keys, on_redis_error=settings.breaker_on_redis_error
    )
    breakers.add_listener(metrics().on_transition)
    clock = SystemClock()
    last_good = LastGoodLayer(worker_cache(settings, url, clock), default_registry)
    payloads = worker_payloads(settings, url, clock)
    guards = load_guards(settings, url, keys, clock)
    return Executor(
        clock=clock,
        layers=[
            idempotency_layer(settings, url, keys),
            guards.rate_limit,
            BreakerLayer(breakers),
            guards.budget,
            last_good,
            payloads.layer,
            guards.faults,
        ],
        resolve_arguments=payloads.resolve,
        retry_gate=guards.budget,
    )


def idempotency_layer(settings: Settings, url: str, keys: Keys) -> IdempotencyLayer:
    """Records of side-effecting and coalesced calls; their time is Redis TIME."""
    store = IdempotencyStore(
        fail_fast_client(url),
        keys,
        lease_s=settings.idempotency_lease_s,
        retention_s=settings.idempotency_retention_s,
    )
    return IdempotencyLayer(store, default_queue=settings.default_queue)


@dataclass(frozen=True)
class LoadGuards:
    """What keeps the fleet from overloading a service: limit, budget, and chaos to test them."""

    rate_limit: RateLimitLayer
    budget: RetryBudgetLayer
    faults: FaultLayer


def load_guards(settings: Settings, url: str, keys: Keys, clock: Clock) -> LoadGuards:
    """Shared rate limits, retry budgets and fault injection; their time is Redis TIME."""
    client = fail_fast_client(url)
    limits = {name: RateLimitPolicy.from_json(raw) for name, raw in settings.rate_limits.items()}
    faults = {name: FaultConfig.from_json(raw) for name, raw in settings.faults.items()}
    return LoadGuards(
        rate_limit=RateLimitLayer(RateLimiter(client, keys), limits),
        budget=RetryBudgetLayer(RetryBudget(client, keys)),
        faults=FaultLayer(
            FaultStore(client, keys), enabled=settings.faults_enabled, static=faults, clock=clock
        ),
    )


class ToolTask(Task):  # type: ignore[misc]
    """Base class of every ``tools.<name>`` task."""

    spec: ToolSpec
    autoretry_for = (RetryLater, DeferLater)
    throws = (ToolFailed,)
    acks_late = True
    ignore_result = True
    typing = False  # arguments are validated by the tool's own model

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Any = None,
        throw: bool = True,
        eta: Any = None,
        countdown: Any = None,
        max_retries: Any = None,
        **options: Any,
    ) -> Any:
        """Retry with the policy's countdown and the context carried forward."""
        if isinstance(exc, RetryLater | DeferLater):
            countdown = exc.verdict.delay
            kwargs = {**self.request.kwargs, "context": exc.verdict.context.to_json()}
            max_retries = self._retries_allowed(exc)
        # Celery would show the retry's kwargs with saferepr, secrets and all.
        options.setdefault(
            "kwargsrepr", self._shown(self.request.kwargs if kwargs is None else kwargs)
        )
        try:
            return super().retry(
                args=args,
                kwargs=kwargs,
                exc=exc,
                throw=throw,
                eta=eta,
                countdown=countdown,
                max_retries=max_retries,
                **options,
            )
        except CeleryRetry:
            raise
        except Exception as publish_error:
            if not isinstance(exc, RetryLater | DeferLater):
                raise
            # The broker refused the retry: end the call now rather than leave the
            # caller waiting for a reply that would never come.
            self._finish_with_error(
                exc.verdict.context,
                ErrorType.INTERNAL_ERROR,
                f"a retry could not be scheduled ({type(publish_error).__name__}: "
                f"{publish_error}); last error: {_last_error(exc)}",
            )
            raise

    def _shown(self, kwargs: Any) -> str:
        """``kwargsrepr`` of a message this task sends, secrets redacted as the client does."""
        return shown_kwargs(kwargs or {}, secret_names(self.spec.json_schema()))

    def _conclude(self, arguments: Any, ctx: CallContext, result: ToolResult) -> None:
        """Deliver a final result, unless the tool's fallback chain takes the call over."""
        state = worker_state(self.app)
        action = state.chains.after_final(self.spec, arguments, ctx, result)
        if action is None:
            self._finish(ctx, result)
            return
        from toolexec.tasks.fallback_task import carry_out  # it builds on this module

        # this attempt is over; the call's end is counted by whichever step answers
        state.observers.withdrawn(self.spec, ctx, attempt_number(self.request.retries, ctx))
        carry_out(self, ctx, action)

    def _retries_allowed(self, exc: RetryLater | DeferLater) -> int:
        """Celery's cap on re-sends: it counts deferrals as retries, though they used no attempt.

        A deferral is always allowed (the executor checked the deadline); a
        retry gets the tool's own allowance plus the deferrals so far.
        """
        if isinstance(exc, DeferLater):
            return int(self.request.retries) + 1
        return int(self.max_retries) + exc.verdict.context.deferrals

    def _finish(self, ctx: CallContext, result: ToolResult) -> None:
        state = worker_state(self.app)
        ttl = max(0.0, ctx.deadline - state.executor.clock.now())
        deliver(state.redis, state.keys, ctx.reply_to, result, ttl)
        state.observers.finished(ctx, attempt_number(self.request.retries, ctx), result)
        log.info(
            "call %s tool=%s run=%s status=%s error=%s attempts=%d elapsed_ms=%.1f",
            result.call_id,
            result.tool,
            result.run_id,
            result.status,
            result.error.type if result.error else None,
            result.attempts,
            result.elapsed_ms,
            extra=call_fields(result),
        )

    def _finish_with_error(self, ctx: CallContext, kind: ErrorType, message: str) -> None:
        now = worker_state(self.app).executor.clock.now()
        info = ErrorInfo(
            type=kind,
            message=message,
            retryable=True,
            suggestion="toolexec itself failed; try again later and report it if it persists.",
        )
        attempts = attempt_number(self.request.retries, ctx)
        self._finish(ctx, error_result(ctx, info, attempts=attempts, now=now))


def _last_error(exc: RetryLater | DeferLater) -> str:
    return exc.verdict.error.message if isinstance(exc, RetryLater) else str(exc)


def attempt_number(retries: int, ctx: CallContext) -> int:
    """This attempt's number: Celery's re-sends, less the rate-limit deferrals among them."""
    return retries + 1 - ctx.deferrals


def _run_tool(self: ToolTask, arguments: Any, context: dict[str, Any]) -> dict[str, Any]:
    ctx = CallContext.from_json(context)
    observers = worker_state(self.app).observers
    observers.started(self.spec, ctx, attempt_number(self.request.retries, ctx))
    try:
        verdict = worker_state(self.app).executor.attempt(
            self.spec, arguments, ctx, attempt_number(self.request.retries, ctx)
        )
    except Exception as exc:  # a bug in toolexec; the caller still gets an answer
        log.exception("internal error running %s", self.spec.name)
        self._finish_with_error(ctx, ErrorType.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        raise
    if isinstance(verdict, Retry):
        number = attempt_number(self.request.retries, ctx)
        observers.retrying(self.spec, ctx, number, verdict.error.error_type)
        raise RetryLater(verdict)
    if isinstance(verdict, Defer | NoReply):
        observers.withdrawn(self.spec, ctx, attempt_number(self.request.retries, ctx))
    if isinstance(verdict, Defer):
        raise DeferLater(verdict)
    if isinstance(verdict, NoReply):
        log.info("call %s tool=%s: answered elsewhere (%s)", ctx.call_id, ctx.tool, verdict.reason)
        return {"status": "no_reply", "reason": verdict.reason}
    assert isinstance(verdict, Final)
    result = verdict.result
    self._conclude(arguments, ctx, result)
    if result.error is not None:
        raise ToolFailed(
            f"{result.error.type}: {result.error.message} (attempts: {result.attempts})"
        )
    return {"status": result.status, "attempts": result.attempts, "elapsed_ms": result.elapsed_ms}


def register_tool_task(celery_app: Celery, spec: ToolSpec) -> Task:
    """Create the Celery task that runs ``spec`` on ``celery_app``."""
    return celery_app.task(
        name=spec.task_name,
        base=ToolTask,
        bind=True,
        spec=spec,
        max_retries=spec.policy.retry.max_attempts - 1,
        time_limit=int(spec.policy.timeout) + _HARD_LIMIT_GRACE_S,
        queue=spec.policy.queue,
    )(_run_tool)
