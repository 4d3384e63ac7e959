"""Executor.attempt: one attempt of one call, from raw arguments to Final or Retry.

The real Runner runs small tools from a private registry; time is a
ManualClock and randomness a seeded generator, so every verdict is exact.
Only the time-limit tests use real time, because they test the Runner's limit.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from toolexec.clock import ManualClock
from toolexec.context import CallContext
from toolexec.errors import ErrorType, RateLimitedError, UnavailableError
from toolexec.pipeline.execution import Executor, Final, Retry, Verdict
from toolexec.pipeline.runner import Runner
from toolexec.policies import Jitter, RetryPolicy
from toolexec.registry import Registry, ToolSpec, tool

SEED = 42


class Counter:
    """How many times a tool body ran."""

    def __init__(self) -> None:
        self.calls = 0

    def hit(self) -> None:
        self.calls += 1


@pytest.fixture
def executor(clock: ManualClock) -> Executor:
    return Executor(runner=Runner(), clock=clock, rng=random.Random(SEED))


def _ctx(
    clock: ManualClock, spec: ToolSpec, *, deadline_in: float = 60.0, **kw: Any
) -> CallContext:
    return CallContext(
        call_id="c-1",
        tool=spec.name,
        deadline=clock.now() + deadline_in,
        submitted_at=clock.now(),
        reply_to="reply-1",
        run_id="run-1",
        **kw,
    )


def _register(registry: Registry, func: Callable[..., Any], **policy: Any) -> ToolSpec:
    tool(registry=registry, **policy)(func)
    spec = registry.get(func.__name__)
    assert spec is not None
    return spec


def _final(verdict: Verdict) -> Final:
    assert isinstance(verdict, Final), verdict
    return verdict


def _retry(verdict: Verdict) -> Retry:
    assert isinstance(verdict, Retry), verdict
    return verdict


def _failing(error: Exception, counter: Counter) -> Callable[[], None]:
    def flaky() -> None:
        counter.hit()
        raise error

    return flaky


def test_a_successful_attempt_is_final_and_ok(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    def add(a: int, b: int = 10) -> dict[str, int]:
        return {"sum": a + b}

    spec = _register(registry, add)
    result = _final(executor.attempt(spec, {"a": "5"}, _ctx(clock, spec), attempt=2)).result
    assert result.ok and result.data == {"sum": 15}
    assert result.attempts == 2
    assert (result.tool, result.call_id, result.run_id) == ("add", "c-1", "run-1")
    assert result.error is None


def test_timings_split_queue_run_and_backoff(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """The tool moves the clock itself: its run time is measured, the rest was queueing."""

    def slow() -> str:
        clock.advance(1.5)
        return "done"

    spec = _register(registry, slow)
    ctx = _ctx(clock, spec).before_retry(0.5)
    clock.advance(2.0)
    result = _final(executor.attempt(spec, {}, ctx, attempt=2)).result
    assert result.elapsed_ms == 3500.0
    assert (result.timings.queued_ms, result.timings.run_ms, result.timings.backoff_ms) == (
        1500.0,
        1500.0,
        500.0,
    )


def test_invalid_arguments_end_the_call_before_the_body_runs(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    counter = Counter()

    def search(query: str, limit: int = 5) -> list[str]:
        counter.hit()
        return []

    spec = _register(registry, search)
    verdict = executor.attempt(spec, {"limit": "lots", "page": 2}, _ctx(clock, spec), attempt=1)
    result = _final(verdict).result
    assert counter.calls == 0
    assert result.status == "error" and result.attempts == 0
    assert result.error is not None and result.error.type is ErrorType.INVALID_ARGUMENTS
    assert not result.error.retryable
    for named in ("query: required but missing", "limit:", '"lots"', "page: not an argument"):
        assert named in result.error.message


def test_a_lone_surrogate_from_a_message_is_invalid_arguments_before_the_body_runs(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """A message from elsewhere than a client can carry what a client refuses."""
    counter = Counter()

    def search(query: str, headers: dict[str, str] | None = None) -> list[str]:
        counter.hit()
        return []

    spec = _register(registry, search)
    raw = {"query": "a\ud800b", "headers": {"Authorization": "Bearer s3cr3t-t0ken"}}
    verdict = executor.attempt(spec, raw, _ctx(clock, spec), attempt=1)
    result = _final(verdict).result
    assert counter.calls == 0
    assert result.error is not None and result.error.type is ErrorType.INVALID_ARGUMENTS
    assert "query holds a lone UTF-16 surrogate" in result.error.message
    assert "s3cr3t" not in result.model_dump_json()


def test_a_transient_failure_with_attempts_left_is_retried_within_the_policy_bounds(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    counter = Counter()
    policy = RetryPolicy(max_attempts=3, base=2.0, cap=30.0, jitter=Jitter.FULL)
    spec = _register(registry, _failing(UnavailableError("down"), counter), retry=policy)
    retry = _retry(executor.attempt(spec, {}, _ctx(clock, spec), attempt=2))
    assert counter.calls == 1
    assert retry.delay == policy.backoff(2, None, random.Random(SEED))
    assert 0.0 <= retry.delay <= policy.exponential(2)
    assert retry.error.error_type is ErrorType.UNAVAILABLE
    assert retry.context.previous_delay == retry.delay
    assert retry.context.backoff_s == retry.delay


def test_the_previous_delay_travels_into_the_next_decision(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """Decorrelated jitter grows from the last delay, which only the context remembers."""
    policy = RetryPolicy(max_attempts=5, base=1.0, cap=100.0, jitter=Jitter.DECORRELATED)
    spec = _register(registry, _failing(UnavailableError("down"), Counter()), retry=policy)
    ctx = _ctx(clock, spec, deadline_in=600.0, previous_delay=20.0, backoff_s=20.0)
    retry = _retry(executor.attempt(spec, {}, ctx, attempt=3))
    assert retry.delay == policy.backoff(3, 20.0, random.Random(SEED))
    assert 1.0 <= retry.delay <= 60.0
    assert retry.context.backoff_s == 20.0 + retry.delay


def test_the_last_attempt_ends_with_the_tools_error(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    counter = Counter()
    error = UnavailableError("still down", details={"status_code": 503})
    spec = _register(registry, _failing(error, counter), max_attempts=3)
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=3)).result
    assert counter.calls == 1
    assert result.status == "error" and result.attempts == 3
    assert result.error is not None
    assert result.error.type is ErrorType.UNAVAILABLE and result.error.retryable
    assert result.error.message == "still down"
    assert result.error.details == {"status_code": 503}


def test_a_permanent_failure_is_not_retried_even_with_attempts_left(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    spec = _register(registry, _failing(RuntimeError("bug"), Counter()), max_attempts=5)
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)).result
    assert result.error is not None and result.error.type is ErrorType.TOOL_ERROR
    assert result.attempts == 1


def test_a_call_past_its_deadline_ends_before_the_body_runs(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    counter = Counter()
    spec = _register(registry, _failing(UnavailableError("unused"), counter))
    ctx = _ctx(clock, spec, deadline_in=30.0)
    clock.advance(30.0)
    result = _final(executor.attempt(spec, {}, ctx, attempt=2)).result
    assert counter.calls == 0
    assert result.error is not None and result.error.type is ErrorType.DEADLINE_EXCEEDED
    assert result.attempts == 1
    assert "before attempt 2" in result.error.message
    assert result.elapsed_ms == 30_000.0


def test_a_retry_that_would_overrun_the_deadline_ends_with_the_last_error(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    policy = RetryPolicy(base=5.0, jitter=Jitter.NONE)
    spec = _register(registry, _failing(UnavailableError("busy"), Counter()), retry=policy)
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec, deadline_in=4.0), 1)).result
    assert result.error is not None
    assert result.error.type is ErrorType.DEADLINE_EXCEEDED
    assert result.error.details == {"last_error": {"type": "unavailable", "message": "busy"}}
    assert result.error.retryable
    assert result.attempts == 1


def test_retry_after_is_a_floor_on_the_delay(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    policy = RetryPolicy(base=0.1, cap=1.0)
    error = RateLimitedError("slow down", retry_after=12.5)
    spec = _register(registry, _failing(error, Counter()), retry=policy)
    retry = _retry(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1))
    assert retry.delay == 12.5


def test_retry_after_beyond_the_deadline_ends_the_call_and_is_reported(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    error = RateLimitedError("slow down", retry_after=90.0)
    spec = _register(registry, _failing(error, Counter()))
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec, deadline_in=60.0), 1)).result
    assert result.error is not None
    assert result.error.type is ErrorType.DEADLINE_EXCEEDED
    assert result.error.retry_after == 90.0


def _serving(status: int, **kw: Any) -> Callable[[], httpx.Response]:
    """A tool that calls a service through httpx and hands back the raw response."""

    def call_service() -> httpx.Response:
        transport = httpx.MockTransport(lambda request: httpx.Response(status, **kw))
        with httpx.Client(transport=transport) as client:
            return client.get("http://svc.test/data")

    return call_service


def test_a_returned_503_response_is_classified_and_retried(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    spec = _register(registry, _serving(503, text="overloaded", headers={"Retry-After": "3"}))
    retry = _retry(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1))
    assert isinstance(retry.error, UnavailableError)
    assert retry.error.details == {"status_code": 503}
    assert "http://svc.test/data" in retry.error.message
    assert retry.delay >= 3.0


def test_a_returned_404_response_is_final(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    spec = _register(registry, _serving(404))
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)).result
    assert result.error is not None and result.error.type is ErrorType.NOT_FOUND


@pytest.mark.parametrize(
    ("kw", "data"),
    [({"json": {"temp": 21}}, {"temp": 21}), ({"text": "plain words"}, "plain words")],
)
def test_a_returned_200_response_becomes_its_body(
    executor: Executor, registry: Registry, clock: ManualClock, kw: dict[str, Any], data: Any
) -> None:
    spec = _register(registry, _serving(200, **kw))
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)).result
    assert result.ok and result.data == data


def test_a_result_that_is_not_json_is_a_tool_error(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    def leaky() -> object:
        return threading.Lock()

    spec = _register(registry, leaky)
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)).result
    assert result.error is not None and result.error.type is ErrorType.TOOL_ERROR
    assert "cannot be sent as JSON" in result.error.message
    assert not result.error.retryable


def test_a_sync_tool_that_overruns_its_timeout_times_out_on_time(
    registry: Registry, clock: ManualClock
) -> None:
    runner = Runner()
    executor = Executor(runner=runner, clock=clock, rng=random.Random(SEED))

    def sleepy() -> str:
        time.sleep(0.5)
        return "late"

    spec = _register(registry, sleepy, timeout=0.05, max_attempts=1)
    started = time.monotonic()
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)).result
    assert time.monotonic() - started < 0.4
    assert result.error is not None and result.error.type is ErrorType.TIMEOUT
    assert result.error.details == {"limit_s": 0.05}
    assert runner.abandoned == 1


def test_a_timeout_with_attempts_left_is_retried(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    def sleepy_again() -> None:
        time.sleep(0.5)

    spec = _register(registry, sleepy_again, timeout=0.05, max_attempts=2)
    retry = _retry(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1))
    assert retry.error.error_type is ErrorType.TIMEOUT


def test_a_limit_cut_short_by_the_deadline_is_deadline_exceeded(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    """The tool would have had 30 s, but the call had only 0.05 s left."""

    def sleepy_too() -> None:
        time.sleep(0.5)

    spec = _register(registry, sleepy_too, timeout=30.0)
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec, deadline_in=0.05), 1)).result
    assert result.error is not None and result.error.type is ErrorType.DEADLINE_EXCEEDED
    assert result.error.details["last_error"]["type"] == "timeout"


def test_an_async_tool_is_cancelled_at_its_limit(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    cancelled = threading.Event()

    async def dawdle() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    spec = _register(registry, dawdle, timeout=0.05, max_attempts=1)
    started = time.monotonic()
    result = _final(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)).result
    assert time.monotonic() - started < 1.0
    assert result.error is not None and result.error.type is ErrorType.TIMEOUT
    assert cancelled.wait(1.0), "the coroutine was left running"


def test_an_async_tool_returns_its_value(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    async def fetch_async(n: int) -> list[int]:
        await asyncio.sleep(0)
        return list(range(n))

    spec = _register(registry, fetch_async)
    result = _final(executor.attempt(spec, {"n": 3}, _ctx(clock, spec), attempt=1)).result
    assert result.ok and result.data == [0, 1, 2]


def test_an_async_tools_exception_is_classified(
    executor: Executor, registry: Registry, clock: ManualClock
) -> None:
    async def refuse() -> None:
        raise ConnectionRefusedError("nobody home")

    spec = _register(registry, refuse)
    retry = _retry(executor.attempt(spec, {}, _ctx(clock, spec), attempt=1))
    assert retry.error.error_type is ErrorType.CONNECTION_ERROR
