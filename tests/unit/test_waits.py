"""When a refused call waits for a defence: pure functions of numbers, no clock, no Redis."""

from __future__ import annotations

import pytest

from toolexec.policies import BreakerPolicy
from toolexec.waits import POLL_S, breaker_wait, budget_wait, failing_share


def budget(**changes: float) -> float | None:
    numbers = {
        "retries": 10.0,
        "failed": 0.0,
        "succeeded": 0.0,
        "frees_in": 9.0,
        "max_wait_s": 5.0,
        "waited_s": 0.0,
    }
    numbers.update(changes)
    return budget_wait(**numbers)


def test_retries_in_flight_are_waited_for_a_moment() -> None:
    """A burst's first retries have not answered yet: they may free their places soon."""
    assert budget() == POLL_S


def test_retries_that_work_are_waited_for() -> None:
    assert budget(failed=1, succeeded=30) == POLL_S


def test_retries_that_fail_end_the_call_at_once() -> None:
    """Most settled retries failed: an outage, and waiting would only delay the answer."""
    assert budget(failed=9, succeeded=1) is None
    assert budget(failed=5, succeeded=5) is None


def test_failed_retries_alone_are_waited_out_until_the_oldest_leaves_when_it_is_soon() -> None:
    """None in flight, most settled ones worked: the oldest failed one frees a place."""
    assert budget(retries=2, failed=2, succeeded=20, frees_in=1.5) == 1.5
    assert budget(retries=2, failed=2, succeeded=20, frees_in=8.0) is None


def test_each_look_waits_as_long_as_the_call_has_waited_so_far() -> None:
    """0.25, 0.25, 0.5, 1, 2 s: a hundred waiting calls do not flood the queue."""
    assert budget(waited_s=0.25) == POLL_S
    assert budget(waited_s=1.0) == 1.0
    assert breaker(state="half_open", waited_s=0.5) == 0.5


def test_a_call_waits_no_longer_than_max_wait_in_all() -> None:
    assert budget(waited_s=2.5) == 2.5
    assert budget(waited_s=2.6) is None
    assert budget(max_wait_s=0) is None


def test_a_budget_holding_no_retry_has_nothing_to_wait_for() -> None:
    """A zero floor and too few calls: no retry will ever free a place."""
    assert budget(retries=0, frees_in=0.0) is None


def test_the_failing_share_counts_settled_retries_only() -> None:
    assert failing_share(0, 0) is None
    assert failing_share(9, 1) == pytest.approx(0.9)


def breaker(**changes: object) -> float | None:
    numbers: dict[str, object] = {
        "state": "open",
        "retry_after": 1.5,
        "trips": 1,
        "max_wait_s": 2.0,
        "waited_s": 0.0,
    }
    numbers.update(changes)
    return breaker_wait(**numbers)  # type: ignore[arg-type]


def test_a_first_short_trip_is_waited_out_for_its_probe() -> None:
    assert breaker() == 1.5


def test_a_breaker_open_again_after_a_failed_probe_ends_the_call() -> None:
    """A second trip means a probe found the service still down: an outage."""
    assert breaker(trips=2) is None


def test_probes_in_flight_are_waited_for_a_moment_whatever_the_trip() -> None:
    assert breaker(state="half_open", retry_after=40.0, trips=3) == POLL_S


def test_an_isolated_or_unreachable_breaker_is_never_waited_for() -> None:
    assert breaker(retry_after=None) is None
    assert breaker(state=None) is None


def test_a_trip_longer_than_the_wait_allowed_ends_the_call() -> None:
    assert breaker(retry_after=2.5) is None
    assert breaker(waited_s=1.0) is None


def test_each_consecutive_trip_stays_open_longer_up_to_the_cap() -> None:
    policy = BreakerPolicy(open_s=2.0, open_factor=2.0, max_open_s=10.0)
    assert [policy.open_for(n) for n in (1, 2, 3, 4, 5)] == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert BreakerPolicy(open_s=30.0, max_open_s=10.0).open_for(3) == 30.0
    assert BreakerPolicy().open_for(1000) == 60.0
