from __future__ import annotations

import base64
import json

import click
import pytest

from toolexec.ops.health import Evidence, Limits, judge, oldest_age
from toolexec.worker.consumer import Beat

NOW = 1_000_000.0


def beat(polled_ago: float = 0.5, active: int = 0, concurrency: int = 4) -> Beat:
    return Beat("w@h", 123, NOW - polled_ago, concurrency, active, ("tools",))


def evidence(b: Beat, *, broker_up: bool = True, waiting: float | None = None,
             heartbeat: float | None = 5.0) -> Evidence:  # fmt: skip
    return Evidence(b, NOW, broker_up, waiting, heartbeat)


def test_a_fresh_idle_worker_with_an_empty_queue_is_healthy() -> None:
    assert judge(evidence(beat()), Limits()) is None


def test_a_consumer_silent_past_the_limit_is_stalled_while_the_broker_answers() -> None:
    reason = judge(evidence(beat(polled_ago=45)), Limits(stall_s=30))
    assert reason is not None and "not polled for 45 s" in reason


def test_a_silent_consumer_is_not_blamed_while_the_broker_is_down() -> None:
    assert judge(evidence(beat(polled_ago=45), broker_up=False), Limits(stall_s=30)) is None


def test_an_old_message_counts_only_while_slots_are_idle() -> None:
    limits = Limits(queue_age_s=60)
    assert "waited 90 s" in (judge(evidence(beat(active=1), waiting=90), limits) or "")
    assert judge(evidence(beat(active=4), waiting=90), limits) is None  # busy, not stuck
    assert judge(evidence(beat(active=1), waiting=30), limits) is None


def test_a_missing_heartbeat_is_a_stall_and_an_unknown_one_is_not() -> None:
    assert "no heartbeat for 120 s" in (judge(evidence(beat(), heartbeat=120), Limits()) or "")
    assert judge(evidence(beat(), heartbeat=None), Limits()) is None


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_limits_must_be_positive_finite_seconds(value: float) -> None:
    with pytest.raises(click.BadParameter):
        Limits(stall_s=value)


def _message(context: object) -> str:
    body = json.dumps([[], {"arguments": {}, "context": context}, {}]).encode()
    return json.dumps({"body": base64.b64encode(body).decode(), "headers": {}})


def test_the_age_of_a_waiting_call_comes_from_its_submission_time() -> None:
    assert oldest_age(_message({"submitted_at": NOW - 12.5}), NOW) == 12.5
    assert oldest_age(_message({"submitted_at": NOW + 3}), NOW) == 0.0  # clock skew: not negative


@pytest.mark.parametrize(
    "raw",
    [None, "not json", json.dumps({"body": "!!"}), _message({}), _message({"submitted_at": "nan"})],
)
def test_a_message_without_a_usable_submission_time_has_no_age(raw: str | None) -> None:
    assert oldest_age(raw, NOW) is None
