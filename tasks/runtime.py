"""The worker runtime: what one worker process builds once, and its one way out.

This is the composition root of the worker. Everything a task needs is made
here, once per process (after a prefork child is forked): one Redis client and
its connection pool, shared by every store; the executor with its layers, in
the order written in :func:`build_executor`; the fallback chains; the
observers; the lease sweeper. The tasks hold no state of their own, and no
module keeps a mutable worker global: the runtime hangs on the Celery app.

It is also the only place where messages leave and answers go out:

* :meth:`WorkerRuntime.dispatch` publishes every task message the worker sends
  (fallback steps, calls handed over by the sweeper);
* :meth:`WorkerRuntime.conclude` takes every final verdict, decides whether a
  fallback chain takes the call over, and otherwise calls
  :meth:`WorkerRuntime.deliver`, which answers the call and every call that
  joined it (duplicates of a side-effecting call, coalesced reads) with the
  same result. A fallback step that answers goes through the same
  :meth:`deliver` with the joined calls it carried along, so every caller of a
  shared execution gets the same, possibly degraded, answer.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from toolexec.breaker import CircuitBreaker
from toolexec.breaker.gate import BreakerGate
from toolexec.breaker.layer import BreakerLayer
from toolexec.caller import CallerLayer
from toolexec.clock import Clock
from toolexec.connection import fail_fast_client, fleet_clock, redis_url, through_blips
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.fairness import is_amqp, lane_in, lane_options, with_lane
from toolexec.fallback.cache import LastGoodCache, LastGoodLayer
from toolexec.fallback.chain import Action, ChainRunner, Deliver, Send
from toolexec.idempotency import IdempotencyLayer, IdempotencyStore, Lease, LeaseSweeper, Message
from toolexec.keys import Keys
from toolexec.layers.approvals import ApprovalLayer, ApprovalStore, ask_caller
from toolexec.layers.batch import Batch
from toolexec.layers.faults import FaultConfig, FaultLayer, FaultStore
from toolexec.layers.ratelimit import RateLimiter, RateLimitLayer
from toolexec.layers.retry_after import RetryAfterCap
from toolexec.layers.retry_budget import RetryBudget, RetryBudgetLayer
from toolexec.payloads import worker_payloads
from toolexec.payloads.offload import result_limit
from toolexec.pipeline.execution import Executor, Final, error_result, restamped
from toolexec.pipeline.observe import CallObservers, Reporter, reporters
from toolexec.policies import RateLimitPolicy
from toolexec.registry import Registry, ToolSpec, default_registry
from toolexec.results import ErrorInfo, ToolResult
from toolexec.settings import Settings
from toolexec.stores.failopen import REDIS_ERRORS
from toolexec.stores.replies import DELIVERY_GRACE_S, queue_reply
from toolexec.stores.stats import CallStats
from toolexec.stores.tally import Tally
from toolexec.tracing import TracingLayer
from toolexec.worker.app import settings_of
from toolexec.worker.logs import call_fields, logged_outcome

__all__ = [
    "WorkerRuntime",
    "attempt_number",
    "build_executor",
    "orphans_covered",
    "runtime_of",
    "stop_runtime",
]

log = logging.getLogger("toolexec.worker")


def attempt_number(retries: int, ctx: CallContext) -> int:
    """This attempt's number: Celery's re-sends, less the rate-limit deferrals among them."""
    return retries + 1 - ctx.deferrals


class WorkerRuntime:
    """One per worker process; see the module doc."""

    def __init__(
        self,
        celery_app: Celery,
        settings: Settings,
        *,
        registry: Registry = default_registry,
        clock: Clock | None = None,
        client: redis.Redis | None = None,
        report_to: Sequence[Reporter] | None = None,
    ) -> None:
        self.app = celery_app
        self.settings = settings
        self.pid = os.getpid()
        # One pool for every store of this process. Fail fast: a check on the call
        # path that waits on a dead Redis holds the call longer than failing would.
        self.redis = client or fail_fast_client(redis_url(settings))
        # Deadlines are set on the client's host: both read them on Redis TIME.
        self.clock = clock or fleet_clock(self.redis)
        self.keys = Keys(settings.key_prefix)
        # a healthy call's success-side writes, summed here and flushed a few times a second
        self.tally = Tally(
            self.redis, clock=self.clock, running_ttl_s=int(settings.visibility_timeout)
        )
        # this process's copy of the breakers' gates, which Redis invalidates
        gates = CircuitBreaker(self.redis, self.keys)
        self.gate = BreakerGate(redis_url(settings), gates, self.keys, self.clock)
        self.idempotency = IdempotencyStore(
            self.redis,
            self.keys,
            lease_s=settings.idempotency_lease_s,
            retention_s=settings.idempotency_retention_s,
        )
        stats = CallStats(
            self.redis,
            self.keys,
            clock=self.clock,
            lease_ttl_s=settings.visibility_timeout,
            tally=self.tally,
        )
        # the reporters the process registered (toolexec worker: its metrics), unless given
        report_to = reporters() if report_to is None else report_to
        self.observers = CallObservers(stats if settings.stats else None, report_to, self.clock)
        self.executor = build_executor(self, registry)
        self.chains = ChainRunner.for_worker(settings, self.redis, registry, self.clock)
        self.tally.start()

    def stop(self) -> None:
        """The worker stops: what the tally holds is written now, not lost with the process."""
        self.tally.stop()
        self.gate.close()

    # -- the one way out for messages --------------------------------------------

    def dispatch(self, publications: Sequence[Send]) -> None:
        """Publish task messages over one producer connection, with results ignored."""
        amqp = is_amqp(str(self.app.conf.broker_url or ""))
        with self.app.producer_or_acquire() as producer:
            for message in publications:
                options: dict[str, Any] = {}
                if message.retries is not None:
                    options["retries"] = message.retries
                lane = lane_in(message.kwargs)  # a fallback step waits in its call's lane
                options.update(lane_options(amqp, lane.priority))
                headers = with_lane(None, lane.fairness_key, lane.priority)
                if headers is not None:
                    options["headers"] = headers
                self.app.send_task(
                    message.task,
                    kwargs=message.kwargs,
                    kwargsrepr=message.shown,
                    task_id=message.task_id,
                    queue=message.queue,
                    ignore_result=True,
                    producer=producer,
                    **options,
                )

    # -- the one way out for answers ---------------------------------------------

    def conclude(
        self,
        spec: ToolSpec,
        arguments: Any,
        ctx: CallContext,
        final: Final,
        attempt: int,
        batch: Batch | None = None,
    ) -> str:
        """A call's final verdict: its fallback chain takes it over, or it is delivered.

        ``batch`` holds the attempt's settlement (the layers' records); it goes
        out with the answer, or before the chain's first step.
        """
        batch = Batch() if batch is None else batch
        ctx = ctx.joining(final.joined)
        action = self.chains.after_final(spec, arguments, ctx, final.result)
        if action is None:
            self.deliver(ctx, final.result, attempt, release=final.release, batch=batch)
            return "answered"
        if final.release is not None:
            self.idempotency.release(final.release, batch)
        # this attempt is over (counted here); the call's end is counted, under the tool
        # called, by whichever step answers
        self.observers.handed_on(spec, ctx, attempt, batch)
        batch.execute(hold=True)
        _note_held(ctx, batch)
        try:
            return self.carry_out(ctx, action, attempt)
        finally:
            self.settle_held(ctx, batch)

    def carry_out(self, ctx: CallContext, action: Action, attempt: int) -> str:
        """Do what a chain decided; returns what happened, for Flower's result column.

        A step that cannot be sent (the broker refused it) ends the chain with its
        explanation, delivered at once.
        """
        if isinstance(action, Deliver):
            self.deliver(ctx, action.result, attempt)
            if action.result.source is not None:
                self.observers.fell_back(action.result.tool, action.result.source)
            return f"answered from {action.result.source}"
        try:
            self.dispatch([action])
        except Exception as exc:
            log.exception("could not send fallback step %s of call %s", action.task, ctx.call_id)
            step_ctx = CallContext.from_json(action.kwargs["context"])
            reason = f"could not send {action.task} ({type(exc).__name__}: {exc})"
            self.deliver(ctx, self.chains.explain_now(step_ctx, reason), attempt)
            return "answered with the explanation: " + reason
        return f"sent {action.task} ({action.task_id})"

    def deliver(
        self,
        ctx: CallContext,
        result: ToolResult,
        attempt: int,
        *,
        release: Lease | None = None,
        batch: Batch | None = None,
    ) -> None:
        """Answer the call, and with the same result every call that joined it.

        All the answers, the release of the call's lease if it holds one, the
        counters and whatever else ``batch`` holds (the layers' records) go in
        one round trip, the answers last: whoever reads the counters or the
        breaker after the answer arrived sees this call in them.
        """
        batch = Batch() if batch is None else batch
        now = self.clock.now()
        answers = [(ctx, attempt, result)]
        for joined in ctx.joined:
            waiter = joined.context(ctx.tool)
            answer = restamped(result, waiter, now, replayed=True, attempts=0)
            answers.append((waiter, 0, answer))
        if release is not None:
            self.idempotency.release(release, batch)
        for answered, number, sent in answers:
            self.observers.finished(answered, number, sent, batch)

        def queue(pipe: Any) -> None:
            for answered, _, sent in answers:
                queue_reply(pipe, self.keys, answered.reply_to, sent, answered.deadline - now)

        unsent: list[Exception] = []
        batch.add(self.redis, queue, on_error=unsent.append)
        try:
            batch.execute(hold=True)
        except REDIS_ERRORS as exc:  # another owner's write; a lease left behind expires
            log.warning("call %s: a write beside its answer failed: %s", ctx.call_id, exc)
        _note_held(ctx, batch)
        try:
            if unsent:  # a Redis blip must not lose an answer already paid for
                through_blips(lambda: _push(self.redis, queue), _delivery_window(ctx, now))
            for _, _, sent in answers:
                _log_outcome(sent)
            logged_outcome(ctx.call_id)  # Celery's success line would repeat it (worker.logs)
        finally:  # the answer went first; what else the blip cut off follows
            self.settle_held(ctx, batch)

    def flush(self, batch: Batch, ctx: CallContext, within_s: float | None = None) -> None:
        """Send an attempt's settlement that answers nobody (a retry, a deferral).

        Its held writes are sent again after a blip for ``within_s`` at most
        (a retry's delay: the next attempt must not wait on them), never past
        the call's deadline. Other owners handle Redis being away themselves;
        what is left is a bug, logged: the retry still goes out.
        """
        try:
            batch.execute(hold=True)
        except Exception:
            log.exception("an attempt's settlement failed; the call goes on")
        _note_held(ctx, batch)
        self.settle_held(ctx, batch, within_s)

    def settle_held(self, ctx: CallContext, batch: Batch, within_s: float | None = None) -> None:
        """The held writes a blip cut off, sent again until the call's deadline, else given up.

        Each is safe to send twice (``toolexec.layers.batch``). One that still cannot
        be made is counted in ``toolexec_writes_dropped`` and logged, in one line.
        """
        if not batch.held:
            return
        window = held_window(ctx.deadline - self.clock.now(), within_s)
        what = ", ".join(sorted(set(batch.held)))

        def again() -> None:
            if not batch.resend_held():
                assert batch.held_error is not None
                raise batch.held_error

        try:
            through_blips(again, window)
        except REDIS_ERRORS as exc:
            for dropped in batch.drop_held():
                self.observers.write_dropped(dropped)
            log.warning(
                "call %s: gave up writing %s: Redis unreachable for the %.1f s left before the "
                "call's deadline (%s: %s); counted in toolexec_writes_dropped",
                ctx.call_id,
                what,
                window,
                type(exc).__name__,
                exc,
            )
        except Exception:  # a script's own error is a bug; the call was answered
            log.exception("call %s: writing %s again failed", ctx.call_id, what)
        else:
            log.info("call %s: wrote %s after a Redis blip", ctx.call_id, what)

    def fail(
        self,
        ctx: CallContext,
        kind: ErrorType,
        message: str,
        attempt: int,
        batch: Batch | None = None,
    ) -> None:
        """Answer a call that toolexec itself could not carry on (a bug, a refused retry)."""
        info = ErrorInfo(
            type=kind,
            message=message,
            retryable=True,
            suggestion="toolexec itself failed; try again later and report it if it persists.",
        )
        now = self.clock.now()
        result = error_result(ctx, info, attempts=attempt, now=now)
        self.deliver(ctx, result, attempt, batch=batch)

    # -- background work -----------------------------------------------------------

    def start_sweeper(self) -> LeaseSweeper:
        """Hands calls whose worker died on to live workers (``toolexec.idempotency``)."""
        sweeper = LeaseSweeper(self.idempotency, self.hand_over, self.settings.idempotency_sweep_s)
        return sweeper.start()

    def hand_over(self, messages: Sequence[Message]) -> None:
        """Publish claimed calls as the client would, each under its own call id.

        Celery's ``retries`` carries the attempts already made (the dead worker's
        included), plus the rate-limit deferrals that Celery also counts as
        retries, so that the taker's attempt number goes on from there.
        """
        self.dispatch(
            [
                Send(
                    m.task,
                    m.kwargs(),
                    m.call_id,
                    m.queue,
                    f"{{'call': '{m.call_id}', 'handed over': True}}",
                    retries=m.attempt + int(m.context.get("deferrals") or 0),
                )
                for m in messages
            ]
        )


def _push(client: redis.Redis, queue: Callable[[Any], None]) -> None:
    """The answers alone, in a pipeline of their own (built anew for each try)."""
    pipe = client.pipeline(transaction=False)
    queue(pipe)
    pipe.execute()


def _note_held(ctx: CallContext, batch: Batch) -> None:
    if batch.held:
        log.info(
            "call %s: Redis unreachable for its settlement (%s); its answer goes first, then "
            "%s again until its deadline",
            ctx.call_id,
            batch.held_error,
            ", ".join(sorted(set(batch.held))),
        )


def held_window(deadline_left: float, within_s: float | None) -> float:
    """How long held writes may be sent again: never past the call's deadline.

    A record made after the deadline could no longer be told from a copy the
    script has forgotten (``WRITE_ID_MARGIN_S``), and the caller has long moved on.
    """
    left = max(0.0, deadline_left)
    return left if within_s is None else min(left, max(0.0, within_s))


def _delivery_window(ctx: CallContext, now: float) -> float:
    """How long an answer is worth retrying: while its caller still waits."""
    return max(0.0, ctx.deadline - now) + DELIVERY_GRACE_S


def _log_outcome(result: ToolResult) -> None:
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


def build_executor(runtime: WorkerRuntime, registry: Registry) -> Executor:
    """The worker's executor and its layers, outermost first: the order is the design."""
    settings, client, keys, clock = runtime.settings, runtime.redis, runtime.keys, runtime.clock
    # the fleet's clock, not Redis TIME in each script: no TIME command per attempt
    breakers = CircuitBreaker(
        client, keys, clock=clock, on_redis_error=settings.breaker_on_redis_error
    )
    breakers.add_listener(runtime.observers.on_transition)
    payloads = worker_payloads(
        settings, redis_url(settings), clock, client, runtime.observers.offloaded
    )
    limits = {name: RateLimitPolicy.from_json(raw) for name, raw in settings.rate_limits.items()}
    faults = {name: FaultConfig.from_json(raw) for name, raw in settings.faults.items()}
    return Executor(
        clock=clock,
        result_limit=functools.partial(result_limit, settings),
        layers=[
            TracingLayer(),  # outermost: its settle sees the verdict last (toolexec.tracing)
            IdempotencyLayer(
                runtime.idempotency,
                default_queue=settings.default_queue,
                clock=clock,
                lease_reads=not orphans_covered(runtime.app),
            ),
            # a call waiting for a person holds no rate-limit slot, breaker permit or budget
            ApprovalLayer(ApprovalStore(client, keys), clock, ask_caller(client, keys, clock)),
            RateLimitLayer(RateLimiter(client, keys), limits, clock=clock),
            BreakerLayer(breakers, gate=runtime.gate, tally=runtime.tally),
            RetryBudgetLayer(RetryBudget(client, keys, clock=clock), tally=runtime.tally),
            LastGoodLayer(LastGoodCache(client, keys, clock), registry),
            payloads.layer,
            RetryAfterCap(settings.retry_after_cap_s),
            FaultLayer(
                FaultStore(client, keys),
                enabled=settings.faults_enabled,
                static=faults,
                clock=clock,
            ),
            CallerLayer(client, keys, clock),  # innermost: the body's line to its caller
        ],
        resolve_arguments=payloads.resolve,
    )


@dataclass
class _Slot:
    """Where an app keeps its process's runtime; the lock serialises its first build."""

    lock: threading.Lock
    runtime: WorkerRuntime | None = None


def orphans_covered(celery_app: Celery) -> bool:
    """Whether this worker's broker gives a dead consumer's messages back within seconds.

    Redis through toolexec's transport (``toolexec.transport.orphans``, selected in a
    worker only) and RabbitMQ (on the connection's loss) do: there a read-only
    call needs no lease of its own to be handed on when its worker dies
    (``IdempotencyLayer.lease_reads``; tests/chaos/test_worker_loss.py).
    """
    chosen = str(celery_app.conf.get("broker_transport") or "")
    scheme = str(celery_app.conf.broker_url or "").partition("://")[0].lower()
    return chosen.startswith("toolexec.transport:") or scheme in ("amqp", "amqps", "pyamqp")


def stop_runtime(celery_app: Celery) -> None:
    """Stop this process's runtime, if it built one: its last sums are written."""
    slot: _Slot | None = celery_app.__dict__.get("_toolexec_runtime")
    if slot is not None and slot.runtime is not None and slot.runtime.pid == os.getpid():
        slot.runtime.stop()


def runtime_of(celery_app: Celery) -> WorkerRuntime:
    """This process's runtime for ``celery_app``, built on first use (again after a fork)."""
    slot: _Slot = celery_app.__dict__.setdefault("_toolexec_runtime", _Slot(threading.Lock()))
    with slot.lock:
        if slot.runtime is None or slot.runtime.pid != os.getpid():
            slot.runtime = WorkerRuntime(celery_app, settings_of(celery_app))
        return slot.runtime
