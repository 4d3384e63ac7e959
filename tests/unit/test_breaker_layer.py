"""A breaker counts calls, not attempts: a retried call that fails counts once (real Redis)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis

from toolexec.breaker import BreakerState, CircuitBreaker
from toolexec.breaker.layer import BreakerLayer
from toolexec.clock import ManualClock
from toolexec.context import CallContext
from toolexec.errors import ErrorType, UnavailableError
from toolexec.keys import Keys
from toolexec.layers import Defer, Final, Retry, Verdict
from toolexec.layers.retry_budget import RetryBudget, RetryBudgetLayer
from toolexec.pipeline.execution import Executor
from toolexec.pipeline.runner import Runner
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy
from toolexec.registry import Registry, ToolSpec, tool

TWO_CALLS = BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=30.0)


@pytest.fixture
def breaker(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(rdb, keys, clock=clock)


def _spec(
    registry: Registry, script: Iterator[bool], policy: BreakerPolicy = TWO_CALLS
) -> ToolSpec:
    """A tool that fails with 503 or succeeds, attempt by attempt, as ``script`` says."""

    @tool(registry=registry, timeout=5, max_attempts=4, backoff_base=0.01, breaker=policy)
    def flaky() -> str:
        """Fails or answers as scripted."""
        if next(script):
            return "fine"
        raise UnavailableError("HTTP 503 from the service")

    spec = registry.get("flaky")
    assert spec is not None
    return spec


def _call(executor: Executor, spec: ToolSpec, clock: ManualClock) -> tuple[Verdict, int]:
    """One call's whole life, as the task would drive it: attempts until a final verdict."""
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 300,
        submitted_at=clock.now(),
        reply_to="r",
    )
    number = 1
    while True:
        verdict = executor.attempt(spec, {}, ctx, number)
        if not isinstance(verdict, Retry):
            return verdict, number
        clock.advance(verdict.delay)
        ctx, number = verdict.context, number + 1


def _executor(breaker: CircuitBreaker, clock: ManualClock) -> Executor:
    return Executor(Runner(), clock, random.Random(7), layers=[BreakerLayer(breaker)])


def test_a_call_that_fails_all_its_attempts_counts_one_failure(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """Given max_attempts=4 and a breaker that opens after 2 failures, one failed call
    leaves it closed with one failure, and a second failed call opens it."""
    spec = _spec(registry, iter([False] * 8))
    executor = _executor(breaker, clock)

    first, attempts = _call(executor, spec, clock)
    after_one = breaker.snapshot("flaky")
    second, _ = _call(executor, spec, clock)

    assert attempts == 4
    assert isinstance(first, Final) and first.result.error is not None
    assert first.result.error.type == ErrorType.UNAVAILABLE
    assert after_one.state is BreakerState.CLOSED
    assert (after_one.calls, after_one.failures, after_one.consecutive) == (1, 1, 1)
    assert isinstance(second, Final) and second.result.attempts == 4
    assert breaker.snapshot("flaky").state is BreakerState.OPEN


def test_a_call_rescued_by_a_retry_counts_one_success(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    spec = _spec(registry, iter([False, False, True]))

    verdict, attempts = _call(_executor(breaker, clock), spec, clock)

    assert attempts == 3
    assert isinstance(verdict, Final) and verdict.result.ok
    view = breaker.snapshot("flaky")
    assert (view.calls, view.failures, view.consecutive) == (1, 0, 0)


def test_a_retried_call_that_meets_an_open_breaker_keeps_its_last_real_error(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """Given a 503 on attempt 1 and the breaker open by attempt 2, the model reads both."""
    spec = _spec(registry, iter([False] * 4))
    executor = _executor(breaker, clock)
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 300,
        submitted_at=clock.now(),
        reply_to="r",
    )
    first = executor.attempt(spec, {}, ctx, 1)
    assert isinstance(first, Retry)
    breaker.trip("flaky", 60)  # other calls opened it meanwhile

    clock.advance(first.delay)
    second = executor.attempt(spec, {}, CallContext.from_json(first.context.to_json()), 2)

    assert isinstance(second, Final) and second.result.error is not None
    error = second.result.error
    assert error.type == ErrorType.CIRCUIT_OPEN and error.retryable
    assert error.details["last_error"] == {
        "type": "unavailable",
        "message": "HTTP 503 from the service",
    }
    assert "last real error: unavailable: HTTP 503 from the service" in error.message
    seen = second.result.for_model()["error"]
    assert seen["details"]["last_error"]["type"] == "unavailable"
    assert second.result.attempts == 1  # the refused attempt never ran


def test_a_retry_that_starts_too_late_still_reports_the_error_before_it(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """Given a retry whose message waited past the deadline, the answer names the 503."""
    spec = _spec(registry, iter([False] * 4))
    executor = _executor(breaker, clock)
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 5,
        submitted_at=clock.now(),
        reply_to="r",
    )
    first = executor.attempt(spec, {}, ctx, 1)
    assert isinstance(first, Retry)

    clock.advance(10)  # the queue held the retry past the deadline
    late = executor.attempt(spec, {}, first.context, 2)

    assert isinstance(late, Final) and late.result.error is not None
    assert late.result.error.type == ErrorType.DEADLINE_EXCEEDED
    assert late.result.error.details["last_error"]["type"] == "unavailable"


#: Opens after two failed calls for 1 s, then 2 s; a refused call may wait 2 s.
SHORT = BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=1.0, max_wait_s=2.0)


def _open(breaker: CircuitBreaker, policy: BreakerPolicy) -> None:
    for _ in range(2):
        admission = breaker.acquire("flaky", policy)
        breaker.record("flaky", policy, admission, success=False, duration_s=0.1)
    assert breaker.snapshot("flaky").state is BreakerState.OPEN


def _fresh(spec: ToolSpec, clock: ManualClock) -> CallContext:
    return CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 30,
        submitted_at=clock.now(),
        reply_to="r",
    )


def test_a_call_that_meets_a_first_short_trip_waits_for_its_probe(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """A blip opened it: the call waits in the queue (using no attempt), becomes the
    probe, and its success closes the breaker for everyone."""
    spec = _spec(registry, iter([True]), SHORT)
    executor = _executor(breaker, clock)
    _open(breaker, SHORT)

    waiting = executor.attempt(spec, {}, _fresh(spec, clock), 1)
    assert isinstance(waiting, Defer)
    assert 1.0 <= waiting.delay <= 1.25
    assert waiting.context.deferrals == 1 and waiting.context.waited_s == waiting.delay

    clock.advance(waiting.delay)
    probed = executor.attempt(spec, {}, waiting.context, 1)
    assert isinstance(probed, Final) and probed.result.ok and probed.result.attempts == 1
    assert breaker.snapshot("flaky").state is BreakerState.CLOSED


def test_a_call_that_meets_a_breaker_reopened_by_a_failed_probe_ends_at_once(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """A probe found the service still down: an outage, said at once with its numbers."""
    spec = _spec(registry, iter([False] * 4), SHORT)
    executor = _executor(breaker, clock)
    _open(breaker, SHORT)
    clock.advance(1.0)
    probe = breaker.acquire("flaky", SHORT)
    breaker.record("flaky", SHORT, probe, success=False, duration_s=0.1)

    verdict = executor.attempt(spec, {}, _fresh(spec, clock), 1)
    assert isinstance(verdict, Final) and verdict.result.error is not None
    error = verdict.result.error
    assert error.type == ErrorType.CIRCUIT_OPEN and error.retry_after == pytest.approx(2.0)
    assert error.details["trips"] == 2 and error.details["defence"] == "circuit_breaker"
    assert "trip 2" in error.message and "in 2.0 s" in error.message
    assert verdict.result.attempts == 0


def test_a_wait_that_would_pass_the_deadline_ends_the_call_now(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock
) -> None:
    spec = _spec(registry, iter([True]), SHORT)
    executor = _executor(breaker, clock)
    _open(breaker, SHORT)
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 0.5,
        submitted_at=clock.now(),
        reply_to="r",
    )
    verdict = executor.attempt(spec, {}, ctx, 1)
    assert isinstance(verdict, Final) and verdict.result.error is not None
    assert verdict.result.error.type == ErrorType.CIRCUIT_OPEN


def test_refusals_of_the_budget_count_only_as_the_services_last_real_error(
    registry: Registry, breaker: CircuitBreaker, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    """A call the budget ends after its wait counts once, with the 503 its attempt met;
    the refusal itself adds nothing, and a call still waiting counts nothing yet."""

    @tool(
        registry=registry,
        timeout=5,
        max_attempts=3,
        backoff_base=0.01,
        breaker=BreakerPolicy(consecutive_failures=5, failure_rate=None),
        retry_budget=RetryBudgetPolicy(min_retries=1),
    )
    def down() -> str:
        """Always 503."""
        raise UnavailableError("HTTP 503 from the service")

    spec = registry.get("down")
    assert spec is not None
    layers = [BreakerLayer(breaker), RetryBudgetLayer(RetryBudget(rdb, keys, clock=clock))]
    executor = Executor(Runner(), clock, random.Random(7), layers=layers)

    a = executor.attempt(spec, {}, _fresh(spec, clock), 1)
    b = executor.attempt(spec, {}, _fresh(spec, clock), 1)
    assert isinstance(a, Retry) and isinstance(b, Retry) and b.context.budget_for == 2
    assert breaker.snapshot("down").calls == 0  # both calls go on: nothing counted yet

    a_ends = executor.attempt(spec, {}, a.context, 2)  # its retry fails; no budget for more
    assert isinstance(a_ends, Final) and a_ends.result.error is not None
    assert a_ends.result.error.type == ErrorType.RETRY_BUDGET_EXHAUSTED
    b_ends = executor.attempt(spec, {}, b.context, 2)  # owed: refused before it runs
    assert isinstance(b_ends, Final) and b_ends.result.error is not None
    assert b_ends.result.error.type == ErrorType.RETRY_BUDGET_EXHAUSTED
    assert b_ends.result.attempts == 1
    assert "HTTP 503 from the service" in b_ends.result.error.message

    view = breaker.snapshot("down")
    assert (view.calls, view.failures, view.consecutive) == (2, 2, 2)
