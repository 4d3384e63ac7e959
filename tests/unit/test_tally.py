"""A worker's success-side sums (toolexec.stores.tally) in a real Redis: what waits, what goes at
once.

Each test drives the flush itself (no thread) with a ManualClock, and reads
Redis through the same readers ``toolexec status`` and the breaker CLI use.
"""

from __future__ import annotations

import pytest
import redis
from counting_support import Counted, Watched, ports_of

from toolexec.breaker import CircuitBreaker
from toolexec.breaker.views import Admission, BreakerState
from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.layers.batch import Batch
from toolexec.layers.retry_budget import RetryBudget
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy
from toolexec.stores.stats import CallStats
from toolexec.stores.tally import Tally

START = 1_700_000_040.0  # on a minute boundary


@pytest.fixture
def minute_clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def tally(rdb: redis.Redis, minute_clock: ManualClock) -> Tally:
    return Tally(rdb, clock=minute_clock)


@pytest.fixture
def stats(rdb: redis.Redis, keys: Keys, minute_clock: ManualClock, tally: Tally) -> CallStats:
    return CallStats(rdb, keys, clock=minute_clock, tally=tally)


def test_successes_reach_redis_at_the_flush_all_at_once(
    counted: Counted, keys: Keys, minute_clock: ManualClock
) -> None:
    # the tally's own connection, watched apart: the session's server is shared with
    # other tests' workers, whose scripts a server-wide count would include
    client = redis_client(counted.url)
    watched = Watched(counted.url)
    tally = Tally(client, clock=minute_clock)
    stats = CallStats(client, keys, clock=minute_clock, tally=tally)
    try:
        stats.finished("warm", "w", 1, None)  # the script loaded on the server (NOSCRIPT once)
        tally.flush()
        for n in range(5):
            stats.started("fetch", f"c{n}", 1, START + 30)
            stats.finished("fetch", f"c{n}", 1, None)

        assert "fetch" not in stats.window(1)  # nothing written on the calls' path
        start = watched.mark(client)
        tally.flush()
        end = watched.mark(client)
        # the five calls' counts (spread over the buckets by call id) are one script
        sent = watched.sent_between(start + 1, end, ports_of(counted.observer, counted.name))
        assert sent == ["EVALSHA"]

        seen = stats.window(1)["fetch"]
        assert (seen.calls, seen.ok, seen.attempts, seen.in_flight) == (5, 5, 5, 0)
    finally:
        watched.close()
        client.close()


def test_a_failure_is_written_at_once_with_the_successes_before_it(
    stats: CallStats, tally: Tally
) -> None:
    stats.finished("fetch", "c1", 1, None)
    stats.finished("fetch", "c2", 1, "unavailable")

    seen = stats.window(1)["fetch"]  # no flush: the failure took the pending success along
    assert (seen.calls, seen.ok, dict(seen.failed)) == (2, 1, {"unavailable": 1})
    tally.flush()
    assert stats.window(1)["fetch"].calls == 2  # and it is not counted again


def test_only_an_attempt_that_outlives_a_flush_is_listed_as_running(
    stats: CallStats, tally: Tally, rdb: redis.Redis
) -> None:
    stats.started("slow", "short", 1, START + 30)
    stats.finished("slow", "short", 1, None)
    stats.started("slow", "long", 1, START + 30)
    tally.flush()
    assert stats.window(1)["slow"].in_flight == 1

    batch = Batch()
    stats.finished("slow", "long", 1, None, batch)  # its settlement removes it
    batch.execute()
    assert stats.window(1)["slow"].in_flight == 0


def test_a_flush_lost_with_redis_is_sent_again_and_counted_once(
    keys: Keys, minute_clock: ManualClock, rdb: redis.Redis
) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    lost = Tally(dead, clock=minute_clock)
    stats = CallStats(dead, keys, clock=minute_clock, tally=lost)
    stats.finished("fetch", "c1", 1, None)
    lost.flush()  # held, not raised
    lost.redis = rdb
    # the script was queued on the dead client: point the held entry at the live one
    for resend in lost._resend:
        for entry in resend.batch._held:
            entry.client = rdb
    lost.flush()
    lost.flush()
    seen = CallStats(rdb, keys, clock=minute_clock).window(1)["fetch"]
    assert seen.calls == 1


def test_a_breakers_successes_count_as_many_calls_in_one_record(
    rdb: redis.Redis, keys: Keys, minute_clock: ManualClock, tally: Tally
) -> None:
    breakers = CircuitBreaker(rdb, keys, clock=minute_clock)
    policy = BreakerPolicy(failure_rate=0.5, window_size=10, min_calls=4, consecutive_failures=3)
    closed = Admission(name="svc", allowed=True, state=BreakerState.CLOSED)
    batch = Batch()
    for _ in range(2):
        breakers.record_into(batch, "svc", policy, closed, success=False, duration_s=0.1)
    breakers.record_into(batch, "svc", policy, closed, success=True, duration_s=0.0, successes=6)
    batch.execute()

    view = breakers.snapshot("svc")
    assert (view.calls, view.failures, view.consecutive) == (8, 2, 0), view
    assert view.state is BreakerState.CLOSED


def test_a_ratio_budget_counts_summed_calls(rdb: redis.Redis, keys: Keys) -> None:
    budget = RetryBudget(rdb, keys)
    policy = RetryBudgetPolicy(ratio=0.1, min_retries=1)
    batch = Batch()
    budget.record_into(
        batch, "svc", policy, first_attempt=True, failed=False, write=("w1", 2e9), amount=40
    )
    batch.execute()

    assert budget.peek("svc", policy).calls == 40
    assert budget.peek("svc", policy).allowance == pytest.approx(4.0)
