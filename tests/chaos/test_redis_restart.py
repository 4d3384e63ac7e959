"""Redis (broker and state, AOF on) SIGKILLed under calls in flight: none lost, none hung."""

from __future__ import annotations

import asyncio

import pytest
from rigs.chaos import Fault, Rig, require, restart_redis, run_fault, run_write_fault

from toolexec.results import ToolResult

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(180)]


def test_calls_in_flight_survive_a_redis_restart(two_workers: Rig) -> None:
    """Every call running when Redis died ends ``ok`` (the README: 20 of 20), none lost.

    The rig fails the test unless the 20 calls were running when Redis was killed.
    """
    tally = run_fault(two_workers, Fault("redis-restart", restart_redis(1, 1.0), timeout=30))

    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.in_flight_ok == (20, 20), tally
    assert tally.typed_unexplained == 0, tally  # only the trickle's refusals while it was down
    assert tally.recovery_s is not None and tally.recovery_s <= 5.0, tally


def test_workers_survive_three_redis_restarts_within_seconds(two_workers: Rig) -> None:
    """kombu's close path used to end the worker here ('NoneType' has no 'hostname')."""
    tally = run_fault(two_workers, Fault("redis-flaps", restart_redis(3, 0.5), timeout=30))

    assert all(w.process is not None and w.process.poll() is None for w in two_workers.workers)
    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.in_flight_ok == (20, 20), tally
    assert tally.typed_unexplained == 0, tally
    assert tally.recovery_s is not None and tally.recovery_s <= 5.0, tally


def test_a_side_effect_in_flight_happens_once_across_a_redis_restart(two_workers: Rig) -> None:
    """kombu puts unacknowledged messages back on reconnection: the copy must not run again."""
    tally = run_write_fault(
        two_workers, Fault("writes", restart_redis(1, 1.0), in_flight=10, timeout=30)
    )

    assert tally.ran_twice == 0, tally
    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.ok == tally.calls, tally


def test_async_waits_survive_a_redis_restart(two_workers: Rig) -> None:
    client = two_workers.tool_client

    async def calls() -> list[ToolResult]:
        pending = [
            asyncio.create_task(client.acall("chaos_sleep", {"seconds": 2}, timeout=30))
            for _ in range(6)
        ]
        await asyncio.to_thread(require, lambda: two_workers.busy() >= 6, 10, "6 calls running")
        await asyncio.to_thread(restart_redis(1, 1.0), two_workers)
        return list(await asyncio.gather(*pending))

    results = asyncio.run(calls())

    assert [r.status for r in results] == ["ok"] * 6
