"""Shared rate limits on a real Redis with a ManualClock, and the Defer verdict they lead to."""

from __future__ import annotations

import logging
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.connection import fail_fast_client
from toolexec.context import CallContext
from toolexec.errors import ConfigurationError, ErrorType
from toolexec.keys import Keys
from toolexec.layers.ratelimit import RateLimiter, RateLimitLayer
from toolexec.pipeline.execution import Defer, Executor, Final
from toolexec.pipeline.runner import Runner
from toolexec.policies import RateLimitPolicy
from toolexec.registry import Registry, ToolSpec, tool

NAME = "search"
#: 10 calls a second, 3 at once.
TEN_PER_S = RateLimitPolicy(rate=10, burst=3)
DEAD_URL = "unix:///nonexistent/toolexec-test.sock"


def about(expected: object) -> object:
    """Equal to within 10 µs: times near 1.7e9 s carry float noise of a few tenths of a µs."""
    return pytest.approx(expected, abs=1e-5)


@pytest.fixture
def limiter(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> RateLimiter:
    return RateLimiter(rdb, keys, clock=clock)


def waits(limiter: RateLimiter, n: int, max_wait: float = 60.0) -> list[float]:
    """The waits of ``n`` reservations, to 0.1 ms (epoch seconds in floats carry noise at 1 µs)."""
    return [round(limiter.reserve(NAME, TEN_PER_S, max_wait).wait, 4) for _ in range(n)]


# -- the limiter -----------------------------------------------------------------


def test_a_burst_goes_at_once_and_the_rest_get_slots_at_the_rate(limiter: RateLimiter) -> None:
    assert waits(limiter, 6) == [0.0, 0.0, 0.0, 0.1, 0.2, 0.3]


def test_an_idle_limit_refills_up_to_its_burst_only(
    limiter: RateLimiter, clock: ManualClock
) -> None:
    waits(limiter, 3)
    clock.advance(60.0)
    assert waits(limiter, 4) == [0.0, 0.0, 0.0, 0.1]


def test_capacity_returns_at_the_rate(limiter: RateLimiter, clock: ManualClock) -> None:
    waits(limiter, 3)
    clock.advance(0.1)
    assert waits(limiter, 2) == [0.0, 0.1]


def test_a_call_that_cannot_wait_for_its_slot_reserves_nothing(limiter: RateLimiter) -> None:
    """Otherwise every call past its deadline would push the queue further out."""
    waits(limiter, 3)
    slot = limiter.reserve(NAME, TEN_PER_S, max_wait=0.05)
    assert not slot.reserved and slot.wait == about(0.1)
    assert waits(limiter, 1) == [0.1]


def test_two_workers_share_one_limit(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> None:
    first, second = RateLimiter(rdb, keys, clock=clock), RateLimiter(rdb, keys, clock=clock)
    assert waits(first, 2) + waits(second, 2) == [0.0, 0.0, 0.0, 0.1]


def test_racing_callers_each_get_a_slot_of_their_own(limiter: RateLimiter) -> None:
    """One Lua script per reservation: 40 threads at once get 40 distinct slots."""
    barrier = threading.Barrier(40)

    def reserve() -> float:
        barrier.wait()
        return round(limiter.reserve(NAME, TEN_PER_S, 60.0).wait, 4)

    with ThreadPoolExecutor(40) as pool:
        got = sorted(pool.map(lambda _: reserve(), range(40)))
    assert got == [0.0] * 3 + [round(0.1 * k, 4) for k in range(1, 38)]


def test_the_key_expires_once_the_limit_is_idle(
    limiter: RateLimiter, rdb: redis.Redis, keys: Keys
) -> None:
    """Five calls at 10/s make the limit busy for 0.5 s; a second's grace follows."""
    waits(limiter, 5)
    ttl_ms = rdb.pttl(keys.rate_limit(NAME))
    assert 1000 < ttl_ms <= 500 + 1000


def test_an_unreachable_redis_lets_calls_through_and_warns(
    keys: Keys, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    dead = RateLimiter(fail_fast_client(DEAD_URL), keys, clock=clock)
    with caplog.at_level(logging.WARNING, logger="toolexec.stores.failopen"):
        assert dead.reserve(NAME, TEN_PER_S, 10.0).now
        assert dead.reserve(NAME, TEN_PER_S, 10.0).now
    assert sum("rate limits cannot reach Redis" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    "fields", [{"rate": 0}, {"rate": -1}, {"rate": float("inf")}, {"rate": 1, "burst": 0}]
)
def test_a_nonsensical_limit_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        RateLimitPolicy(**fields)  # type: ignore[arg-type]


# -- the layer and the executor ----------------------------------------------------


class Counter:
    def __init__(self) -> None:
        self.calls = 0


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def spec(registry: Registry, counter: Counter) -> ToolSpec:
    @tool(registry=registry, rate_limit=RateLimitPolicy(rate=2, burst=1))
    def lookup() -> str:
        counter.calls += 1
        return "found"

    found = registry.get("lookup")
    assert found is not None
    return found


@pytest.fixture
def executor(limiter: RateLimiter, clock: ManualClock) -> Executor:
    return Executor(
        runner=Runner(), clock=clock, rng=random.Random(1), layers=[RateLimitLayer(limiter)]
    )


def _ctx(clock: ManualClock, deadline_in: float = 30.0) -> CallContext:
    return CallContext(
        call_id=uuid.uuid4().hex,
        tool="lookup",
        deadline=clock.now() + deadline_in,
        submitted_at=clock.now(),
        reply_to="r",
    )


def test_a_call_within_the_limit_runs(
    executor: Executor, spec: ToolSpec, clock: ManualClock, counter: Counter
) -> None:
    verdict = executor.attempt(spec, {}, _ctx(clock), 1)
    assert isinstance(verdict, Final) and verdict.result.ok and counter.calls == 1


def test_a_call_over_the_limit_is_deferred_to_its_slot_without_using_an_attempt(
    executor: Executor, spec: ToolSpec, clock: ManualClock, counter: Counter
) -> None:
    executor.attempt(spec, {}, _ctx(clock), 1)
    verdict = executor.attempt(spec, {}, _ctx(clock), 1)
    assert isinstance(verdict, Defer)
    assert verdict.delay == about(0.5)
    assert (verdict.context.deferrals, verdict.context.slot_for) == (1, 1)
    assert counter.calls == 1


def test_the_deferred_attempt_runs_in_its_reserved_slot_without_asking_again(
    executor: Executor, spec: ToolSpec, clock: ManualClock, counter: Counter
) -> None:
    """Three calls at once: the third's slot is 1 s away, not 0.5 s after the second's turn."""
    executor.attempt(spec, {}, _ctx(clock), 1)
    second = executor.attempt(spec, {}, _ctx(clock), 1)
    third = executor.attempt(spec, {}, _ctx(clock), 1)
    assert isinstance(second, Defer) and isinstance(third, Defer)
    assert (second.delay, third.delay) == about((0.5, 1.0))
    clock.advance(second.delay)
    rerun = executor.attempt(spec, {}, second.context, 1)
    assert isinstance(rerun, Final) and rerun.result.ok and rerun.result.attempts == 1
    assert counter.calls == 2


def test_a_later_attempt_of_a_deferred_call_takes_a_new_slot(
    executor: Executor, spec: ToolSpec, clock: ManualClock
) -> None:
    executor.attempt(spec, {}, _ctx(clock), 1)
    ctx = replace(_ctx(clock), deferrals=1, slot_for=1)
    assert isinstance(executor.attempt(spec, {}, ctx, 2), Defer)


def test_a_call_whose_slot_is_past_its_deadline_ends_rate_limited(
    executor: Executor, spec: ToolSpec, clock: ManualClock, counter: Counter
) -> None:
    executor.attempt(spec, {}, _ctx(clock), 1)
    verdict = executor.attempt(spec, {}, _ctx(clock, deadline_in=0.2), 1)
    assert isinstance(verdict, Final)
    result = verdict.result
    assert result.error is not None and result.error.type is ErrorType.RATE_LIMITED
    assert result.error.retryable and result.error.retry_after == about(0.5)
    assert result.error.details["shared"] is True
    assert result.attempts == 0 and counter.calls == 1


def test_settings_override_a_tools_own_limit(
    limiter: RateLimiter, spec: ToolSpec, clock: ManualClock
) -> None:
    layer = RateLimitLayer(limiter, {"lookup": RateLimitPolicy(rate=100, burst=5)})
    executor = Executor(runner=Runner(), clock=clock, layers=[layer])
    verdicts = [executor.attempt(spec, {}, _ctx(clock), 1) for _ in range(6)]
    assert [type(v).__name__ for v in verdicts] == ["Final"] * 5 + ["Defer"]


def test_a_tool_without_a_limit_never_asks_redis(
    limiter: RateLimiter, registry: Registry, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    @tool(registry=registry)
    def free() -> int:
        return 1

    spec = registry.get("free")
    assert spec is not None
    executor = Executor(runner=Runner(), clock=clock, layers=[RateLimitLayer(limiter)])
    for _ in range(5):
        assert isinstance(executor.attempt(spec, {}, _ctx(clock), 1), Final)
    assert not rdb.exists(keys.rate_limit("free"))
