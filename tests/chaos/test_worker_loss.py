"""Workers killed (SIGKILL) or stopped (SIGTERM) under load: every call still answered."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import redis
from rigs.chaos import (
    Fault,
    Rig,
    kill_worker,
    rolling_restart,
    run_fault,
    stop_worker,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(180)]


def test_read_only_calls_of_a_killed_worker_are_handed_over(two_workers: Rig) -> None:
    held: list[int] = []

    def kill_a_busy_worker(built: Rig) -> float:
        held.append(built.busy_on(0))  # what the killed worker was running
        return kill_worker(built)

    tally = run_fault(two_workers, Fault("worker-kill", kill_a_busy_worker, timeout=20))

    assert held and held[0] > 0, held  # the kill hit calls in flight: they had to be handed over
    assert tally.hung == 0, tally
    assert tally.in_flight_ok == (20, 20), tally
    assert tally.lost == 0, tally
    assert tally.typed_unexplained == 0, tally
    # handed over within seconds (the orphan watch: a read-only call holds no lease), long
    # before the broker's visibility timeout
    assert tally.slowest_in_flight_s is not None and tally.slowest_in_flight_s <= 15, tally


def test_sigterm_lets_the_calls_in_flight_finish(two_workers: Rig) -> None:
    held: list[int] = []

    def stop_a_busy_worker(built: Rig) -> float:
        held.append(built.busy_on(0))
        return stop_worker(built)

    tally = run_fault(two_workers, Fault("worker-sigterm", stop_a_busy_worker, timeout=30))

    assert held and held[0] > 0, held  # the stop had calls of its own to finish
    assert tally.in_flight_ok == (20, 20), tally
    assert tally.ok == tally.calls, tally


def test_a_rolling_restart_fails_no_call(two_workers: Rig) -> None:
    tally = rolling_restart(two_workers, threads=4, call_s=0.5, timeout=30)

    assert tally.calls > 0
    assert tally.ok == tally.calls, tally


def test_a_message_a_killed_worker_took_but_had_not_started_is_back_in_seconds(
    make_rig: Callable[..., AbstractContextManager[Rig]],
) -> None:
    """An ETA call sits in the worker's memory, unacknowledged and without a lease.

    Before toolexec.transport.orphans it came back only after the broker's visibility
    timeout (``max_timeout`` + 60 s); now a watcher restores it once the killed
    consumer's alive key expires.
    """
    with make_rig(workers=1) as built:
        client = built.tool_client
        prepared = client.preparer.prepare("chaos_sleep", {"seconds": 0.05}, None, 90, None, None)
        client.app.send_task(
            f"tools.{prepared.ctx.tool}",
            kwargs={"arguments": prepared.arguments, "context": prepared.ctx.to_json()},
            task_id=prepared.ctx.call_id,
            queue=prepared.queue,
            countdown=3,
            ignore_result=True,
        )
        broker = redis.Redis.from_url(built.redis_url)
        assert wait_until(lambda: broker.hlen("unacked") >= 1, 15)  # the worker holds it
        built.workers[0].kill()
        killed_at = time.monotonic()
        built.restart_worker(0)

        result = client.waiter.collect([prepared], None)[0]

        took = time.monotonic() - killed_at
        assert result.ok, result
        visibility = built.settings().visibility_timeout
        assert took < min(30.0, visibility / 2), (took, visibility)
