"""The workers' per-minute counters in a real Redis, with a ManualClock: windows, leases, TTLs."""

from __future__ import annotations

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.keys import STATS_TTL_S, Keys, bucket_of
from toolexec.stores.stats import CallStats, running_attempt

START = 1_700_000_040.0  # on a minute boundary


@pytest.fixture
def minute_clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def stats(rdb: redis.Redis, keys: Keys, minute_clock: ManualClock) -> CallStats:
    return CallStats(rdb, keys, clock=minute_clock, lease_ttl_s=960)


def test_a_call_retried_once_then_failed_counts_two_attempts_one_retry_one_failure(
    stats: CallStats,
) -> None:
    stats.started("fetch", "c1", 1, START + 30)
    stats.retrying("fetch", "c1", 1, "unavailable")
    stats.started("fetch", "c1", 2, START + 30)
    stats.finished("fetch", "c1", 2, "not_found")
    stats.started("fetch", "c2", 1, START + 30)
    stats.finished("fetch", "c2", 1, None)

    seen = stats.window(5)["fetch"]

    assert (seen.calls, seen.ok, seen.attempts, seen.retries) == (2, 1, 3, 1)
    assert seen.failed == {"not_found": 1}
    assert seen.retried == {"unavailable": 1}
    assert seen.failure_rate == 0.5
    assert seen.retry_rate == pytest.approx(1 / 3)
    assert seen.in_flight == 0


def test_an_attempt_counts_as_in_flight_until_it_ends(stats: CallStats) -> None:
    stats.started("slow", "c1", 1, START + 30)
    stats.started("slow", "c2", 1, START + 30)
    assert stats.window(1)["slow"].in_flight == 2

    stats.finished("slow", "c1", 1, None)

    assert stats.window(1)["slow"].in_flight == 1


def test_an_attempt_of_a_dead_worker_stops_counting_when_its_lease_ends(
    stats: CallStats, rdb: redis.Redis, keys: Keys, minute_clock: ManualClock
) -> None:
    """Nobody removes it (the worker was SIGKILLed); the reader prunes it past its lease."""
    stats.started("slow", "c1", 1, START + 30)
    minute_clock.advance(31)

    assert "slow" not in stats.window(1)
    assert sum(rdb.zcard(keys.in_flight(b)) for b in range(keys.buckets)) == 0


def test_the_window_holds_only_the_last_minutes(
    stats: CallStats, minute_clock: ManualClock
) -> None:
    stats.started("fetch", "old", 1, START + 30)
    stats.finished("fetch", "old", 1, "timeout")
    minute_clock.advance(3 * 60)
    stats.started("fetch", "new", 1, minute_clock.now() + 30)
    stats.finished("fetch", "new", 1, None)

    assert stats.window(3)["fetch"].calls == 1
    assert stats.window(4)["fetch"].calls == 2
    assert stats.window(4)["fetch"].failed == {"timeout": 1}


def test_every_key_written_expires(stats: CallStats, rdb: redis.Redis, keys: Keys) -> None:
    """A minute's hash outlives the longest window; the running set outlives every lease."""
    stats.started("fetch", "c1", 1, START + 30)
    assert 900 < rdb.ttl(keys.in_flight(bucket_of("c1"))) <= 960

    stats.retrying("fetch", "c1", 1, "timeout")
    assert 0 < rdb.ttl(keys.stats(bucket_of("c1"))) <= STATS_TTL_S
    assert STATS_TTL_S >= 60 * 60 + 60


def test_tools_are_kept_apart_and_an_unknown_counter_is_ignored(
    stats: CallStats, rdb: redis.Redis, keys: Keys
) -> None:
    """A newer worker's extra counter must not break an older ``toolexec status``."""
    stats.started("a", "c1", 1, START + 30)
    stats.finished("a", "c1", 1, None)
    stats.started("b", "c2", 1, START + 30)
    rdb.hincrby(keys.stats(3), f"{int(START // 60)}|a|hedged", 4)

    seen = stats.window(1)

    assert sorted(seen) == ["a", "b"]
    assert (seen["a"].calls, seen["b"].calls, seen["b"].in_flight) == (1, 0, 1)
    assert seen["b"].failure_rate is None


def test_a_window_longer_than_the_counters_live_is_refused(stats: CallStats) -> None:
    with pytest.raises(ValueError, match="between 1 and 62"):
        stats.window(63)


def test_a_withdrawn_attempt_stops_running_and_counts_as_nothing(stats: CallStats) -> None:
    """Deferred by a rate limit or answered by another worker: not an attempt, not a call."""
    stats.started("fetch", "c1", 1, START + 30)
    stats.withdrawn("fetch", "c1", 1)

    assert "fetch" not in stats.window(1)


def test_the_running_attempt_of_a_call_is_found_until_it_ends(
    stats: CallStats, rdb: redis.Redis, keys: Keys
) -> None:
    """What ``toolexec mcp`` reports as progress: attempt 2 runs, then nothing runs."""
    assert running_attempt(rdb, keys, "call-a") is None
    stats.started("fetch", "call-a", 1, lease_until=1e12)
    stats.started("fetch", "call-b", 1, lease_until=1e12)
    assert running_attempt(rdb, keys, "call-a") == 1
    stats.retrying("fetch", "call-a", 1, "unavailable")
    assert running_attempt(rdb, keys, "call-a") is None  # in backoff
    stats.started("fetch", "call-a", 2, lease_until=1e12)
    assert running_attempt(rdb, keys, "call-a") == 2
    stats.finished("fetch", "call-a", 2, None)
    assert running_attempt(rdb, keys, "call-a") is None
    assert running_attempt(rdb, keys, "call-b") == 1


def test_minutes_past_the_longest_window_are_pruned_and_keys_stay_per_bucket(
    stats: CallStats, rdb: redis.Redis, keys: Keys, minute_clock: ManualClock
) -> None:
    """The key count is the buckets', from the first minute: no key per minute piles up."""
    for minute in range(70):  # one call's bucket, one end a minute for 70 minutes
        stats.finished("fetch", "c1", minute + 1, None)
        minute_clock.advance(60)
    stats.finished("fetch", "c1", 71, None)

    fields = [name for name in rdb.hkeys(keys.stats(bucket_of("c1"))) if name != "pruned"]
    minutes = {int(name.split("|", 1)[0]) for name in fields}
    assert (min(minutes), max(minutes)) == (int(START // 60) + 9, int(START // 60) + 70)
    assert rdb.keys(f"{keys.prefix}:stats:*") == [keys.stats(bucket_of("c1"))]
    assert stats.window(62)["fetch"].calls == 62


def test_a_call_its_fallback_answered_counts_as_a_degraded_call_of_the_tool_called(
    stats: CallStats,
) -> None:
    """search 1 retried, search 2 handed to the chain, search_lite answered: one search call
    (ok, degraded), two search attempts of which one retry, one search_lite attempt; each
    end sent twice (held writes after a blip) still counts once."""
    for _ in range(2):
        stats.retrying("search", "c1", 1, "unavailable", keep_until=START + 60)
        stats.handed_on("search", "c1", 2, keep_until=START + 60)
        stats.handed_on("search_lite", "c1", 1, keep_until=START + 60)
        stats.finished(
            "search",
            "c1",
            1,
            None,
            keep_until=START + 60,
            call_of="search",
            degraded=True,
            chained=True,
        )

    seen = stats.window(5)

    search, lite = seen["search"], seen["search_lite"]
    assert (search.calls, search.ok, search.degraded, search.attempts, search.retries) == (
        1,
        1,
        1,
        2,
        1,
    )
    assert search.degraded_rate == 1.0 and search.retry_rate == 0.5
    assert (lite.calls, lite.attempts) == (0, 1)
