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
from toolexec.execution import Executor
from toolexec.keys import Keys
from toolexec.layers import Final, Retry, Verdict
from toolexec.policies import BreakerPolicy
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.runner import Runner

TWO_CALLS = BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=30.0)


@pytest.fixture
def breaker(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(rdb, keys, clock=clock)


def _spec(registry: Registry, script: Iterator[bool]) -> ToolSpec:
    """A tool that fails with 503 or succeeds, attempt by attempt, as ``script`` says."""

    @tool(registry=registry, timeout=5, max_attempts=4, backoff_base=0.01, breaker=TWO_CALLS)
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
