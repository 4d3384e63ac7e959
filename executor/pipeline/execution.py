"""One attempt of one call, from raw arguments to a verdict.

This is the executor's core and knows nothing of Celery: the task in
``toolexec.tasks.tool_task`` deserialises the message, asks :meth:`Executor.attempt`
for a verdict and maps it onto Celery (a reply and a return, a reply and a
failure, or a retry with the computed countdown). Time comes from an injected
clock and randomness from an injected generator, so every branch is testable
without a worker.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pydantic
import pydantic_core
from pydantic_core import to_jsonable_python

from toolexec.bounds import text_problem
from toolexec.clock import Clock, SystemClock
from toolexec.context import CallContext
from toolexec.errors import (
    AwaitingApprovalError,
    CircuitOpenError,
    ErrorType,
    InvalidArgumentsError,
    RetryBudgetExhaustedError,
    ThrottledError,
    ToolException,
    ToolTimeoutError,
)
from toolexec.layers import (
    Attempt,
    Defer,
    Final,
    Layer,
    NoReply,
    Outcome,
    Retry,
    Verdict,
    compose,
)
from toolexec.layers.batch import Batch
from toolexec.pipeline.classify import classify_exception, classify_response
from toolexec.pipeline.runner import Runner
from toolexec.pipeline.streams import bounded_body
from toolexec.redaction import scrub_text, secret_names
from toolexec.results import (
    ErrorInfo,
    ToolResult,
    error_info,
    error_result,
    restamped,
)
from toolexec.results import elapsed_ms_for as _elapsed_ms
from toolexec.results import timings_for as _timings
from toolexec.retry import decide
from toolexec.validation import describe_validation_error

if TYPE_CHECKING:  # a type only: the registry imports the fallback steps
    from toolexec.registry import ToolSpec

__all__ = [
    "Defer",
    "Executor",
    "Final",
    "NoReply",
    "Retry",
    "Verdict",
    "deadline_info",
    "error_info",
    "error_result",
    "restamped",
    "with_last_error",
]


def _error_json(failure: ToolException) -> dict[str, Any] | None:
    """What an attempt met, to carry to the next one; a refusal (circuit_open) is no news."""
    if failure.error_type == ErrorType.CIRCUIT_OPEN:
        return None
    # it travels in the retry's message and kwargsrepr (events, Flower): no credentials
    return {"type": str(failure.error_type), "message": scrub_text(failure.message)}


def with_last_error(info: ErrorInfo, ctx: CallContext) -> ErrorInfo:
    """An open breaker's refusal of a retried call, with the error the call really met.

    "This call was not made" alone would hide the 503 of the attempts before; the
    model needs it to decide what to do next.
    """
    if info.type != ErrorType.CIRCUIT_OPEN or not ctx.last_error:
        return info
    last = ctx.last_error
    return info.model_copy(
        update={
            "message": f"{info.message}; the call's last real error: "
            f"{last.get('type')}: {last.get('message')}",
            "details": {**info.details, "last_error": last},
        }
    )


def deadline_info(ctx: CallContext, last: ToolException | None, attempts: int) -> ErrorInfo:
    """``deadline_exceeded``, carrying the error that used up the time, if any."""
    if last is None:
        message = (
            f"the call's deadline passed before attempt {attempts + 1} could start "
            "(it waited too long in the queue: workers are busy or none is running)"
        )
        details: dict[str, Any] = {"last_error": ctx.last_error} if ctx.last_error else {}
    else:
        message = (
            f"the call's deadline left no time for another attempt after {attempts}; "
            f"last error: {last.error_type}: {last.message}"
        )
        details = {"last_error": {"type": str(last.error_type), "message": last.message}}
    return ErrorInfo(
        type=ErrorType.DEADLINE_EXCEEDED,
        message=message,
        suggestion="Try again later with a longer timeout, or continue without this result.",
        retryable=last is None or last.retryable,
        retry_after=getattr(last, "retry_after", None),
        details=details,
    )


class Executor:
    """Turns one attempt of a call into a :data:`Verdict`."""

    def __init__(
        self,
        runner: Runner | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        layers: Sequence[Layer] = (),
        resolve_arguments: Callable[[Any], Any] | None = None,
        result_limit: Callable[[ToolSpec], int] | None = None,
    ) -> None:
        self.runner = runner or Runner()
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.layers = tuple(layers)
        # per hook, the layers that have one of their own (the rest would only pass on)
        self._admitting = _overriding(self.layers, "admit")
        self._around = _overriding(self.layers, "around")
        self._gating = _overriding(self.layers, "allow_retry")
        self._settling = tuple(reversed(_overriding(self.layers, "settle")))
        self._recording = tuple(reversed(_overriding(self.layers, "record")))
        # puts back arguments the client stored outside the message (toolexec.payloads)
        self.resolve_arguments = resolve_arguments
        # the bytes a tool's result may take: a returned stream is read only that far
        self.result_limit = result_limit
        # each tool's body wrapped to that limit, made once per tool rather than per call
        self._bounded: dict[Callable[..., Any], tuple[int, Callable[..., Any]]] = {}

    def attempt(
        self,
        spec: ToolSpec,
        raw_arguments: Any,
        ctx: CallContext,
        attempt: int,
        *,
        admission: Batch | None = None,
        settlement: Batch | None = None,
    ) -> Verdict:
        """Validate, run once within the time left, classify, and decide what follows.

        The layers' Redis commands before the attempt go in ``admission``, sent
        once before the first ``around`` (with whatever the caller queued
        there); those after it go in ``settlement``, which the caller sends
        with its answer. Without them the executor sends its own batches.
        """
        own = settlement is None
        admission = admission if admission is not None else Batch()
        settlement = settlement if settlement is not None else Batch()
        try:
            return self._attempt(spec, raw_arguments, ctx, attempt, admission, settlement)
        finally:
            settlement.prepend(admission)  # never sent if no layer ran: goes first instead
            if own:
                settlement.execute()

    def _attempt(
        self,
        spec: ToolSpec,
        raw_arguments: Any,
        ctx: CallContext,
        attempt: int,
        admission: Batch,
        settlement: Batch,
    ) -> Verdict:
        now = self.clock.now()
        if now >= ctx.deadline:
            return Final(
                error_result(
                    ctx, deadline_info(ctx, None, attempt - 1), attempts=attempt - 1, now=now
                )
            )
        if self.resolve_arguments is not None:
            try:
                raw_arguments = self.resolve_arguments(raw_arguments)
            except ToolException as failure:
                return self._after_failure(spec, failure, ctx, attempt - 1, now)
        unencodable = text_problem(raw_arguments)  # a message from elsewhere than a client
        if unencodable is not None:
            invalid = InvalidArgumentsError(unencodable)
            return Final(error_result(ctx, error_info(invalid), attempts=attempt - 1, now=now))
        try:
            arguments = spec.arguments.model_validate(raw_arguments)
        except pydantic.ValidationError as exc:
            invalid = InvalidArgumentsError(
                describe_validation_error(exc, secret_names(spec.json_schema())),
                suggestion="Fix the fields named above and call the tool again; "
                "the schema is in the tool's definition.",
            )
            return Final(error_result(ctx, error_info(invalid), attempts=attempt - 1, now=now))
        current = self._start(spec, arguments, ctx, attempt, now)
        for layer in self._admitting:
            layer.admit(current, admission)
        admission.execute()
        verdict = self._run(current, arguments)
        for layer in self._recording:
            layer.record(current, verdict[1], verdict[0], settlement)
        return verdict[0]

    @staticmethod
    def _start(
        spec: ToolSpec, arguments: pydantic.BaseModel, ctx: CallContext, attempt: int, now: float
    ) -> Attempt:
        limit = min(spec.policy.timeout, ctx.deadline - now)
        return Attempt(spec, ctx, attempt, arguments.model_dump(mode="json"), limit)

    def _run(self, current: Attempt, arguments: pydantic.BaseModel) -> tuple[Verdict, Outcome]:
        spec, limit = current.spec, current.limit
        kwargs = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        outcome = compose(self._around, current, lambda: self._body(spec, kwargs, limit))
        return self._settle(current, outcome, self._verdict(current, outcome)), outcome

    def _verdict(self, current: Attempt, outcome: Outcome) -> Verdict:
        """The verdict on an attempt's outcome: a result, or a retry after a delay."""
        spec, attempt, limit = current.spec, current.number, current.limit
        end = self.clock.now()
        ctx = current.ctx.after_attempt(outcome.duration_s)
        if outcome.injected:
            ctx = replace(ctx, injected=True)
        attempts = attempt if outcome.ran else attempt - 1
        failure = outcome.failure
        if isinstance(failure, ThrottledError):
            return _throttled(failure, ctx, attempt, end)
        if isinstance(failure, _WAITABLE) and not outcome.ran:
            return self._wait_or_end(failure, ctx, attempt, end)
        if failure is None:
            return Final(
                ToolResult(
                    status="ok",
                    tool=ctx.tool,
                    call_id=ctx.call_id,
                    run_id=ctx.run_id,
                    data=outcome.data,
                    payload=outcome.payload,
                    injected=ctx.injected,
                    attempts=attempts,
                    elapsed_ms=_elapsed_ms(ctx, end),
                    timings=_timings(ctx, end),
                )
            )
        if isinstance(failure, ToolTimeoutError) and limit < spec.policy.timeout:
            return Final(
                error_result(ctx, deadline_info(ctx, failure, attempts), attempts=attempts, now=end)
            )
        return self._after_failure(spec, failure, ctx, attempts, end, current)

    def _settle(self, attempt: Attempt, outcome: Outcome, verdict: Verdict) -> Verdict:
        """Show the verdict to every layer's ``settle`` hook, innermost first."""
        for layer in self._settling:
            verdict = layer.settle(attempt, outcome, verdict)
        return verdict

    def _body(self, spec: ToolSpec, kwargs: dict[str, Any], limit: float) -> Outcome:
        """Run the tool itself and classify whatever it raised or returned."""
        start = self.clock.now()
        func = self._body_of(spec)
        try:
            data = _jsonable(self.runner.run(func, kwargs, limit), start)
        except ToolTimeoutError as exc:
            return Outcome(failure=exc, duration_s=self.clock.now() - start)
        except Exception as exc:
            return Outcome(
                failure=classify_exception(exc, self.clock.now()),
                duration_s=self.clock.now() - start,
            )
        return Outcome(data=data, duration_s=self.clock.now() - start)

    def _body_of(self, spec: ToolSpec) -> Callable[..., Any]:
        """``spec``'s function bounded to its result limit (kept while the limit holds)."""
        if self.result_limit is None:
            return spec.func
        most = self.result_limit(spec)
        kept = self._bounded.get(spec.func)
        if kept is None or kept[0] != most:
            kept = self._bounded[spec.func] = (most, bounded_body(spec.func, most))
        return kept[1]

    def _after_failure(
        self,
        spec: ToolSpec,
        failure: ToolException,
        ctx: CallContext,
        attempt: int,
        now: float,
        current: Attempt | None = None,
    ) -> Verdict:
        decision = decide(
            spec.policy.retry,
            attempt=attempt,
            error_type=failure.error_type,
            retry_after=getattr(failure, "retry_after", None),
            now=now,
            deadline=ctx.deadline,
            previous_delay=ctx.previous_delay,
            rng=self.rng,
        )
        refusal = self._gate(current, failure) if decision.retry else None
        if refusal is not None:
            return self._refused_retry(refusal, failure, decision.delay, ctx, attempt, now)
        if decision.retry:
            return Retry(
                decision.delay, failure, ctx.before_retry(decision.delay, _error_json(failure))
            )
        if decision.reason == "deadline":
            info = deadline_info(ctx, failure, attempt)
        else:
            info = with_last_error(error_info(failure), ctx)
        return Final(error_result(ctx, info, attempts=attempt, now=now))

    def _spread(self, wait: float) -> float:
        """A wait on a defence, spread over a quarter more so the waiters do not return at once."""
        return wait * (1.0 + 0.25 * self.rng.random())

    def _refused_retry(
        self,
        refusal: ToolException,
        failure: ToolException,
        delay: float,
        ctx: CallContext,
        attempt: int,
        now: float,
    ) -> Verdict:
        """A retry a layer refused: wait for it when the refusal allows and the deadline fits.

        The retry then comes back owing the budget (``CallContext.budget_for``):
        it asks again in its admission round trip, and runs only if granted.
        """
        wait = getattr(refusal, "wait_s", None)
        if wait is not None:
            delay = max(delay, self._spread(wait))
            if now + delay < ctx.deadline:
                carried = ctx.before_retry(delay, _error_json(failure))
                return Retry(delay, failure, carried.owing(attempt + 1, delay))
        return Final(error_result(ctx, error_info(refusal), attempts=attempt, now=now))

    def _wait_or_end(
        self, refusal: ToolException, ctx: CallContext, attempt: int, now: float
    ) -> Verdict:
        """A defence refused this attempt before it ran: wait in the queue, or end saying so.

        The wait (``toolexec.waits``) uses no attempt, like a rate limit's deferral.
        """
        wait = getattr(refusal, "wait_s", None)
        if wait is not None:
            delay = self._spread(wait)
            if now + delay < ctx.deadline:
                return Defer(delay, ctx.waiting(delay))
        info = with_last_error(error_info(refusal), ctx)
        return Final(error_result(ctx, info, attempts=attempt - 1, now=now))

    def _gate(self, current: Attempt | None, failure: ToolException) -> ToolException | None:
        """The first refusal of a retry the policy wants, asking layers outermost first.

        ``current`` is None when the attempt ended before the layers (its
        stored arguments could not be read): no layer has seen it to judge.
        """
        if current is None:
            return None
        for layer in self._gating:
            refusal = layer.allow_retry(current, failure)
            if refusal is not None:
                return refusal
        return None


def _overriding(layers: Sequence[Layer], hook: str) -> tuple[Layer, ...]:
    """The layers, in order, whose class has its own ``hook`` (not :class:`Layer`'s no-op).

    Every hook of every layer ran on every attempt; most layers override one or
    two of the five, and a call through the rest is a frame that only passes on.
    """
    default = getattr(Layer, hook)
    return tuple(layer for layer in layers if getattr(type(layer), hook) is not default)


#: Refusals of toolexec's own defences that a call may wait out (``toolexec.waits``).
_WAITABLE = (CircuitOpenError, RetryBudgetExhaustedError, AwaitingApprovalError)


def _throttled(failure: ThrottledError, ctx: CallContext, attempt: int, now: float) -> Verdict:
    """Wait in the queue for the reserved rate-limit slot, or end when none fits the deadline."""
    if failure.reserved and now + (failure.retry_after or 0.0) < ctx.deadline:
        return Defer(failure.retry_after or 0.0, ctx.deferred(attempt))
    return Final(error_result(ctx, error_info(failure), attempts=attempt - 1, now=now))


def _jsonable(value: Any, now: float) -> Any:
    """What a tool returned, as JSON; an httpx response is classified first."""
    httpx = sys.modules.get("httpx")  # not imported here: see classify._classify_httpx
    if httpx is not None and isinstance(value, httpx.Response):
        failure = classify_response(
            value.status_code, value.headers, value.text, str(value.request.url), now
        )
        if failure is not None:
            raise failure
        if "json" in value.headers.get("content-type", ""):
            return value.json()
        return value.text
    try:
        return to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise ToolException(
            f"the tool returned a {type(value).__name__}, which cannot be sent as JSON",
            suggestion="This is a bug in the tool; do not repeat the call.",
        ) from exc
