"""Workers killed (SIGKILL) or stopped (SIGTERM) under load: every call still answered."""

from __future__ import annotations

import pytest

from toolexec.chaos import Fault, Rig, kill_worker, rolling_restart, run_fault, stop_worker

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(180)]


def test_read_only_calls_of_a_killed_worker_are_handed_over(two_workers: Rig) -> None:
    tally = run_fault(two_workers, Fault("worker-kill", kill_worker, timeout=20))

    assert tally.hung == 0, tally
    assert tally.in_flight_ok is not None and tally.in_flight_ok[0] == tally.in_flight_ok[1], tally
    # Known gap (README, Reliability): a short call the killed worker had taken but not yet
    # leased waits for the broker's visibility timeout; about one run in four loses one.
    assert tally.lost <= 1, tally
    # handed over within about a lease, long before the broker's visibility timeout
    assert tally.slowest_in_flight_s is not None and tally.slowest_in_flight_s <= 15, tally


def test_sigterm_lets_the_calls_in_flight_finish(two_workers: Rig) -> None:
    tally = run_fault(two_workers, Fault("worker-sigterm", stop_worker, timeout=30))

    assert tally.in_flight_ok is not None and tally.in_flight_ok[0] == tally.in_flight_ok[1], tally
    assert tally.ok == tally.calls, tally


def test_a_rolling_restart_fails_no_call(two_workers: Rig) -> None:
    tally = rolling_restart(two_workers, threads=4, call_s=0.5, timeout=30)

    assert tally.calls > 0
    assert tally.ok == tally.calls, tally
