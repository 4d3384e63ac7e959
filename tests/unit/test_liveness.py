"""Who counts as alive: beats, a clean leave, and the client's cached answer."""

from __future__ import annotations

import redis

from toolexec.clock import ManualClock
from toolexec.errors import ErrorType
from toolexec.keys import WORKER_FORGET_S, Keys
from toolexec.stores import liveness


def test_a_beat_makes_a_worker_serve_its_queues_until_three_beats_are_missed(
    rdb: redis.Redis, keys: Keys
) -> None:
    """Given a beat at t, the worker serves its queues until t + the alive window, not after."""
    liveness.beat(rdb, keys, "w1@h", ["tools", "slow"], now=1000.0)

    assert liveness.serving(rdb, keys, "tools", now=1000.0) == 1
    assert liveness.serving(rdb, keys, "slow", now=1000.0 + liveness.ALIVE_WINDOW_S) == 1
    assert liveness.serving(rdb, keys, "other", now=1000.0) == 0
    assert liveness.serving(rdb, keys, "tools", now=1000.1 + liveness.ALIVE_WINDOW_S) == 0
    assert liveness.workers_alive(rdb, keys, now=1001.0) == [("w1@h", 1000.0)]


def test_a_worker_that_leaves_is_gone_at_once(rdb: redis.Redis, keys: Keys) -> None:
    """Given two live workers, the one that leaves stops counting before its window ends."""
    liveness.beat(rdb, keys, "w1@h", ["tools"], now=1000.0)
    liveness.beat(rdb, keys, "w2@h", ["tools"], now=1000.0)

    liveness.leave(rdb, keys, "w1@h", ["tools"])

    assert liveness.serving(rdb, keys, "tools", now=1000.0) == 1
    assert [name for name, _ in liveness.workers_alive(rdb, keys, now=1000.0)] == ["w2@h"]


def test_a_beat_forgets_workers_silent_for_an_hour(rdb: redis.Redis, keys: Keys) -> None:
    liveness.beat(rdb, keys, "dead@h", ["tools"], now=1000.0)
    liveness.beat(rdb, keys, "w2@h", ["tools"], now=1001.0 + WORKER_FORGET_S)

    assert rdb.zrange(keys.queue_workers("tools"), 0, -1) == ["w2@h"]
    assert rdb.zrange(keys.workers(), 0, -1) == ["w2@h"]


def test_live_queues_asks_redis_again_only_while_nobody_served(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    """Given a served queue, the answer is kept a second; an unserved one is asked every time."""
    queues = liveness.LiveQueues(rdb, keys, clock)
    assert queues.served("tools") is False

    liveness.beat(rdb, keys, "w1@h", ["tools"], now=clock.now())
    assert queues.served("tools") is True  # asked again: nobody served it before

    liveness.leave(rdb, keys, "w1@h", ["tools"])
    assert queues.served("tools") is True  # within RECHECK_S the confirmed answer stands
    clock.advance(liveness.RECHECK_S + 0.01)
    assert queues.served("tools") is False


def test_no_worker_is_a_retryable_error_that_names_the_queue() -> None:
    info = liveness.no_worker_info("slow")

    assert info.type == ErrorType.NO_WORKER
    assert info.retryable is True
    assert "'slow'" in info.message and "not made" in info.message
