"""The retry budget in the executor: a layer feeds it, the retry decision spends it.

A real Executor runs small tools from a private registry with a
RetryBudgetLayer on a real Redis; time is a ManualClock, so each verdict is
exact.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.errors import ErrorType, NotFoundError, UnavailableError
from toolexec.keys import Keys
from toolexec.layers.retry_budget import RetryBudget, RetryBudgetLayer
from toolexec.pipeline.execution import Defer, Executor, Final, Retry, Verdict
from toolexec.pipeline.runner import Runner
from toolexec.policies import RetryBudgetPolicy
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.waits import POLL_S

#: One retry per window whatever the traffic, then 10% of the calls.
ONE_FLOOR = RetryBudgetPolicy(ratio=0.1, window_s=10.0, min_retries=1)


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url)
    yield client
    client.close()


@pytest.fixture
def budget(rdb: redis.Redis, clock: ManualClock) -> RetryBudget:
    return RetryBudget(rdb, Keys(f"t-{uuid.uuid4().hex[:10]}"), clock=clock)


@pytest.fixture
def executor(budget: RetryBudget, clock: ManualClock) -> Executor:
    layer = RetryBudgetLayer(budget)
    return Executor(runner=Runner(), clock=clock, rng=random.Random(7), layers=[layer])


def _spec(registry: Registry, func: Callable[..., Any], **policy: Any) -> ToolSpec:
    tool(registry=registry, backoff_base=0.01, backoff_cap=0.01, **policy)(func)
    spec = registry.get(func.__name__)
    assert spec is not None
    return spec


def _context(clock: ManualClock, spec: ToolSpec) -> CallContext:
    return CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 60,
        submitted_at=clock.now(),
        reply_to="r",
    )


def _attempt(
    executor: Executor,
    spec: ToolSpec,
    clock: ManualClock,
    number: int = 1,
    ctx: CallContext | None = None,
) -> Verdict:
    return executor.attempt(spec, {}, ctx or _context(clock, spec), number)


def _down() -> None:
    raise UnavailableError("503 from upstream")


def test_a_retry_within_the_budget_goes_ahead(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    spec = _spec(registry, _down, max_attempts=3, retry_budget=ONE_FLOOR)
    assert isinstance(_attempt(executor, spec, clock), Retry)


def test_a_budget_spent_on_failing_retries_ends_a_transient_failure_at_once(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """The first call takes the window's one retry, which fails too: an outage, so the
    second call ends at once with the budget's error, its numbers and the real error.

    (Before retries that work paid their way, the second call ended so even while the
    first call's retry was still in flight: the blip of issue 24.)"""
    spec = _spec(registry, _down, max_attempts=3, retry_budget=ONE_FLOOR)
    first = _attempt(executor, spec, clock)
    assert isinstance(first, Retry)
    second_of_first = _attempt(executor, spec, clock, 2, first.context)
    assert isinstance(second_of_first, Final)  # its own next retry is refused too
    verdict = _attempt(executor, spec, clock)
    assert isinstance(verdict, Final)
    result = verdict.result
    assert result.error is not None
    assert result.error.type is ErrorType.RETRY_BUDGET_EXHAUSTED
    assert result.error.retryable and result.error.suggestion
    assert "503 from upstream" in result.error.message
    assert "toolexec's retry budget" in result.error.message
    assert "100% of those settled failing" in result.error.message
    assert result.error.details["last_error"] == {
        "type": "unavailable",
        "message": "503 from upstream",
    }
    assert result.error.details["budget"] == "_down"
    assert result.error.details["defence"] == "retry_budget"
    assert result.error.details["failing_share"] == 1.0
    assert result.error.retry_after == pytest.approx(ONE_FLOOR.window_s)
    assert result.attempts == 1


def test_a_retry_refused_while_granted_ones_are_in_flight_waits_for_budget(
    executor: Executor, registry: Registry, clock: ManualClock, budget: RetryBudget
) -> None:
    """A blip: the window's retry is in flight, so the next call waits instead of failing,
    and its retry runs once the first one has worked and given its place back."""
    replies = iter(["503", "503", "ok", "ok"])

    def blip() -> str:
        if next(replies) == "503":
            raise UnavailableError("503 from upstream")
        return "ok"

    spec = _spec(registry, blip, max_attempts=3, retry_budget=ONE_FLOOR)
    first = _attempt(executor, spec, clock)
    second = _attempt(executor, spec, clock)
    assert isinstance(first, Retry) and first.context.budget_for is None
    assert isinstance(second, Retry) and second.context.budget_for == 2
    assert second.delay >= POLL_S and second.context.waited_s == second.delay

    clock.advance(second.delay)
    waiting = _attempt(executor, spec, clock, 2, second.context)
    assert isinstance(waiting, Defer)  # the first call's retry has not answered yet
    assert waiting.context.slot_for is None and waiting.context.budget_for == 2

    done = _attempt(executor, spec, clock, 2, first.context)
    assert isinstance(done, Final) and done.result.ok
    clock.advance(waiting.delay)
    retried = _attempt(executor, spec, clock, 2, waiting.context)
    assert isinstance(retried, Final) and retried.result.ok
    view = budget.peek("blip", ONE_FLOOR)
    assert (view.retries, view.succeeded, view.failed) == (0, 2, 0)


def test_a_wait_for_budget_ends_when_the_deadline_or_max_wait_would_pass(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    spec = _spec(registry, _down, max_attempts=3, retry_budget=replace(ONE_FLOOR, max_wait_s=0.0))
    assert isinstance(_attempt(executor, spec, clock), Retry)
    verdict = _attempt(executor, spec, clock)
    assert isinstance(verdict, Final) and verdict.result.error is not None
    assert verdict.result.error.type is ErrorType.RETRY_BUDGET_EXHAUSTED


def test_a_failure_that_would_not_be_retried_spends_nothing(
    executor: Executor, registry: Registry, clock: ManualClock, budget: RetryBudget
) -> None:
    def missing() -> None:
        raise NotFoundError("no such city")

    spec = _spec(registry, missing, max_attempts=3, retry_budget=ONE_FLOOR)
    verdict = _attempt(executor, spec, clock)
    assert isinstance(verdict, Final) and verdict.result.error is not None
    assert verdict.result.error.type is ErrorType.NOT_FOUND
    assert budget.peek("missing", ONE_FLOOR).retries == 0


def test_the_last_allowed_attempt_spends_nothing(
    executor: Executor, registry: Registry, clock: ManualClock, budget: RetryBudget
) -> None:
    spec = _spec(registry, _down, max_attempts=2, retry_budget=ONE_FLOOR)
    verdict = _attempt(executor, spec, clock, number=2)
    assert isinstance(verdict, Final) and verdict.result.error is not None
    assert verdict.result.error.type is ErrorType.UNAVAILABLE
    assert budget.peek("_down", ONE_FLOOR).retries == 0


def test_successful_calls_grow_the_budget(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """Every call counts, failed or not: after 30 good ones, the 3rd failing call is the
    33rd and may take a 3rd retry (3 <= 3.3); the 4th, the 34th, may not (4 > 3.4) yet."""
    healthy = True

    def sometimes() -> str:
        if healthy:
            return "ok"
        raise UnavailableError("503")

    spec = _spec(registry, sometimes, max_attempts=3, retry_budget=ONE_FLOOR)
    for _ in range(30):
        assert isinstance(_attempt(executor, spec, clock), Final)
    healthy = False
    verdicts = [_attempt(executor, spec, clock) for _ in range(5)]
    assert [type(v).__name__ for v in verdicts] == ["Retry"] * 5
    # the 4th and 5th were refused: with the granted three in flight, they wait for budget
    assert [v.context.budget_for for v in verdicts if isinstance(v, Retry)] == [
        None,
        None,
        None,
        2,
        2,
    ]


def test_a_tool_that_cannot_retry_never_touches_redis(
    executor: Executor,
    registry: Registry,
    clock: ManualClock,
    budget: RetryBudget,
    rdb: redis.Redis,
) -> None:
    spec = _spec(registry, _down, max_attempts=1, retry_budget=ONE_FLOOR)
    _attempt(executor, spec, clock)
    assert not rdb.exists(budget.keys.budget("_down"))


def test_a_token_budget_is_drained_by_failures_through_the_layer(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """4 tokens: failures take 1 each; at 2 (half) retries stop."""
    tokens = RetryBudgetPolicy(kind="tokens", max_tokens=4, token_ratio=0.5)
    spec = _spec(registry, _down, max_attempts=5, retry_budget=tokens)
    verdicts = [_attempt(executor, spec, clock) for _ in range(3)]
    assert [type(v).__name__ for v in verdicts] == ["Retry", "Final", "Final"]


def test_a_disabled_budget_leaves_retries_to_the_policy(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    off = RetryBudgetPolicy(enabled=False)
    spec = _spec(registry, _down, max_attempts=3, retry_budget=off)
    assert all(isinstance(_attempt(executor, spec, clock), Retry) for _ in range(30))
