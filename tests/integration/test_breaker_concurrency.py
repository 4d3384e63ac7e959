"""Breakers under contention: many threads and several processes' worth of clients on one Redis.

Each thread plays a worker: its own acquire and record, its own connection
from the pool, all started together by a barrier. No mocks, no sleeping: the
ManualClock stands still while the threads race, so the only thing that can
vary between runs is the interleaving, and the assertions hold for all of them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
import redis

from toolexec.breaker import Admission, BreakerState, CircuitBreaker, Transition
from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.policies import BreakerPolicy

T = TypeVar("T")
NAME = "http_request@api.example.com"


@pytest.fixture
def keys() -> Keys:
    return Keys(f"t-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url, max_connections=64)
    yield client
    client.close()


def together(threads: int, work: Callable[[], T]) -> list[T]:
    """``work`` in ``threads`` threads released at the same instant."""
    barrier = threading.Barrier(threads)

    def run() -> T:
        barrier.wait()
        return work()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: run(), range(threads)))


def listening(breaker: CircuitBreaker) -> list[Transition]:
    seen: list[Transition] = []
    breaker.add_listener(seen.append)
    return seen


def test_fifty_threads_failing_around_the_threshold_open_it_exactly_once(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    # given a breaker that opens at the 25th consecutive failure, and 50 admitted calls
    breaker = CircuitBreaker(rdb, keys, clock=clock)
    events = listening(breaker)
    policy = BreakerPolicy(consecutive_failures=25, failure_rate=None, window_size=100)
    admissions = [breaker.acquire(NAME, policy) for _ in range(50)]
    pending = iter(admissions)
    lock = threading.Lock()

    def fail_one() -> Transition | None:
        with lock:
            admission = next(pending)
        return breaker.record(NAME, policy, admission, success=False, duration_s=0.1)

    # when all 50 record their failure at once
    transitions = [t for t in together(50, fail_one) if t is not None]

    # then exactly one record opened it, and exactly one event was reported
    assert len(transitions) == 1 and events == transitions
    assert (transitions[0].from_state, transitions[0].to_state) == ("closed", "open")
    view = breaker.snapshot(NAME)
    assert view.state is BreakerState.OPEN and view.consecutive == 25


def test_fifty_threads_around_a_failure_rate_threshold_open_it_exactly_once(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    # given a rate breaker (50% of at least 20 calls over the last 40) and 50 calls, 30 failing
    breaker = CircuitBreaker(rdb, keys, clock=clock)
    events = listening(breaker)
    policy = BreakerPolicy(
        consecutive_failures=None, failure_rate=0.5, window_size=40, min_calls=20
    )
    outcomes = iter([i % 5 >= 3 for i in range(50)])
    lock = threading.Lock()

    def one_call() -> Transition | None:
        admission = breaker.acquire(NAME, policy)
        with lock:
            ok = next(outcomes)
        if not admission.allowed:
            return None
        return breaker.record(NAME, policy, admission, success=ok, duration_s=0.1)

    # when they all run at once
    transitions = [t for t in together(50, one_call) if t is not None]

    # then it opened exactly once: at most once because the check and the move are one
    # script; at least once because any 40 of these 50 outcomes hold >= 20 failures
    assert len(transitions) == 1 and events == transitions
    assert transitions[0].reason == "failure_rate"
    assert transitions[0].failures / transitions[0].calls >= 0.5


def test_half_open_with_k2_admits_exactly_two_of_twenty_concurrent_callers(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    # given an open breaker whose open time has just passed
    breaker = CircuitBreaker(rdb, keys, clock=clock)
    policy = BreakerPolicy(consecutive_failures=1, failure_rate=None, half_open_probes=2)
    breaker.record(NAME, policy, breaker.acquire(NAME, policy), success=False, duration_s=1)
    clock.advance(policy.open_s)
    events = listening(breaker)

    # when 20 callers acquire at once
    admissions: list[Admission] = together(20, lambda: breaker.acquire(NAME, policy))

    # then exactly two hold probe permits, one moved it to half-open, and 18 were refused
    probes = [a for a in admissions if a.allowed]
    assert len(probes) == 2 and all(a.probe for a in probes)
    assert len({a.permit for a in probes}) == 2
    assert [e.to_state for e in events] == ["half_open"]
    assert breaker.snapshot(NAME).probes_in_flight == 2


def test_failures_seen_by_one_worker_open_the_breaker_for_another(
    redis_url: str, keys: Keys, clock: ManualClock
) -> None:
    # given two workers, each with its own connection and breaker object
    one, two = redis_client(redis_url), redis_client(redis_url)
    worker_a = CircuitBreaker(one, keys, clock=clock)
    worker_b = CircuitBreaker(two, keys, clock=clock)
    policy = BreakerPolicy(consecutive_failures=3, failure_rate=None)

    # when worker A sees three failures
    for _ in range(3):
        worker_a.record(NAME, policy, worker_a.acquire(NAME, policy), success=False, duration_s=0.1)

    # then worker B is refused without running anything
    refused = worker_b.acquire(NAME, policy)
    assert not refused.allowed and refused.retry_after == policy.open_s
    one.close()
    two.close()


def test_without_a_clock_the_scripts_use_redis_time(rdb: redis.Redis, keys: Keys) -> None:
    # given a production breaker (no clock injected)
    breaker = CircuitBreaker(rdb, keys)
    policy = BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=30.0)

    # when it opens and refuses a call
    for _ in range(2):
        breaker.record(NAME, policy, breaker.acquire(NAME, policy), success=False, duration_s=1)
    seconds, micros = rdb.time()
    refused = breaker.acquire(NAME, policy)
    tripped = breaker.trip("other", 100.0)

    # then open-until and retry-after are measured on the server's clock
    server_now = seconds + micros / 1e6
    view = breaker.snapshot(NAME)
    assert view.open_until is not None and view.at is not None
    assert view.open_until == pytest.approx(server_now + 30.0, abs=1.0)
    assert view.at == pytest.approx(server_now, abs=1.0)
    assert refused.retry_after is not None and 29.0 < refused.retry_after <= 30.0
    assert tripped.open_until == pytest.approx(server_now + 100.0, abs=1.0)
