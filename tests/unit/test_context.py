"""CallContext rides in every message: it must survive JSON and accumulate time honestly."""

from __future__ import annotations

import json

from toolexec.context import CallContext


def _ctx() -> CallContext:
    return CallContext(
        call_id="c-1",
        tool="get_weather",
        deadline=1_700_000_060.0,
        submitted_at=1_700_000_000.0,
        reply_to="toolexec:reply:c-1",
        run_id="r-1",
    )


def test_a_context_survives_a_json_round_trip() -> None:
    ctx = _ctx().after_attempt(0.25).before_retry(1.5)
    assert CallContext.from_json(json.loads(json.dumps(ctx.to_json()))) == ctx


def test_from_json_ignores_fields_it_does_not_know() -> None:
    """A newer client may add fields; an older worker must still read the message."""
    raw = _ctx().to_json() | {"added_in_a_later_version": True}
    assert CallContext.from_json(raw) == _ctx()


def test_from_json_fills_defaults_for_fields_a_sender_left_out() -> None:
    raw = {k: v for k, v in _ctx().to_json().items() if k not in {"run_s", "backoff_s"}}
    ctx = CallContext.from_json(raw)
    assert (ctx.run_s, ctx.backoff_s, ctx.previous_delay) == (0.0, 0.0, None)


def test_remaining_counts_down_to_the_deadline_and_below() -> None:
    ctx = _ctx()
    assert ctx.remaining(1_700_000_000.0) == 60.0
    assert ctx.remaining(1_700_000_070.0) == -10.0


def test_attempts_and_backoffs_accumulate_without_touching_the_original() -> None:
    first = _ctx()
    later = first.after_attempt(0.5).before_retry(2.0).after_attempt(0.25).before_retry(4.0)
    assert (later.run_s, later.backoff_s, later.previous_delay) == (0.75, 6.0, 4.0)
    assert (first.run_s, first.backoff_s, first.previous_delay) == (0.0, 0.0, None)
    assert later.deadline == first.deadline and later.call_id == first.call_id


def test_to_json_is_what_asdict_gave_and_shares_nothing_mutable() -> None:
    """The message is the same as before the fields were read one by one."""
    from dataclasses import asdict, replace

    from toolexec.context import Joined

    waiter = replace(_ctx(), call_id="c-2", reply_to="toolexec:reply:c-2")
    ctx = replace(
        _ctx().before_retry(0.5, {"type": "unavailable", "message": "503"}),
        fairness_key="tenant-a",
        priority=2,
        idempotency_key="k",
        budget_for=3,
    ).joining([waiter])
    raw = ctx.to_json()
    expected = asdict(ctx) | {"fallback": None, "joined": [asdict(Joined.of(waiter))]}
    assert json.dumps(raw, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert list(raw) == list(expected)  # the same order of fields, too
    raw["last_error"]["message"] = "changed"
    assert ctx.last_error == {"type": "unavailable", "message": "503"}
