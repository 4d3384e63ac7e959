"""Lanes in use (fairness keys, priorities) while a worker is SIGKILLed or Redis restarts.

Every call carries a fairness key or a priority, and more calls than the free
slots wait in the queue's lanes when the fault lands (the rig refuses to run
the fault otherwise), so a call is in the queue, a lane, an inbox or kombu's
unacknowledged record at that moment: 0 lost, 0 hung, every one of them ok.
"""

from __future__ import annotations

import pytest
from rigs.chaos import Fault, Rig, kill_worker, restart_redis, run_fault

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(240)]

#: Three tenants, a batch and an urgent lane, and the default lane beside them.
LANES = (
    {"fairness_key": "tenant-a"},
    {"fairness_key": "tenant-b", "priority": 2},
    {"priority": 5},
    {"fairness_key": "tenant-c", "priority": 1},
    {},
)


def test_lanes_lose_no_call_when_a_busy_worker_is_killed(two_workers: Rig) -> None:
    def kill_a_busy_worker(built: Rig) -> float:
        return kill_worker(built)

    fault = Fault("worker-kill-lanes", kill_a_busy_worker, timeout=40, lanes=LANES, queued=30)
    tally = run_fault(two_workers, fault)

    assert tally.hung == 0, tally
    assert tally.lost == 0, tally
    assert tally.in_flight_ok == (50, 50), tally
    assert tally.typed_unexplained == 0, tally


def test_lanes_lose_no_call_in_a_redis_restart(two_workers: Rig) -> None:
    fault = Fault("redis-restart-lanes", restart_redis(1, 1.0), timeout=40, lanes=LANES, queued=30)
    tally = run_fault(two_workers, fault)

    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.in_flight_ok == (50, 50), tally
    assert tally.typed_unexplained == 0, tally
