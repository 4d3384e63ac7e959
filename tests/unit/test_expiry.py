"""Which queued messages nobody waits for (toolexec.pipeline.expiry): pure decisions on
envelopes."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from toolexec.pipeline.expiry import LOG_EVERY, DropCounter, abandoned, stale_run

NOW = 1_000_000.0
GRACE = 2.0


def envelope(deadline: Any, **headers: Any) -> bytes:
    """A kombu Redis envelope of a protocol-2 call whose context has ``deadline``."""
    body = [[], {"arguments": {}, "context": {"call_id": "c", "deadline": deadline}}, {}]
    return json.dumps(
        {
            "body": base64.b64encode(json.dumps(body).encode()).decode(),
            "headers": {"id": "c", "task": "tools.t", **headers},
            "properties": {"body_encoding": "base64", "delivery_tag": "t"},
        }
    ).encode()


@pytest.mark.parametrize(
    ("deadline", "gone"),
    [
        (NOW - GRACE - 0.001, True),
        (NOW - GRACE, False),  # the caller reads until deadline + grace: still listening
        (NOW + 5, False),
        (float("nan"), False),
        (float("-inf"), False),
        ("0", False),
        (True, False),
        (None, False),
    ],
)
def test_abandoned_only_once_the_caller_stopped_waiting(deadline: Any, gone: bool) -> None:
    assert abandoned({"deadline": deadline}, NOW, GRACE) is gone
    assert abandoned(None, NOW, GRACE) is False


def test_the_stale_run_is_the_tail_up_to_the_first_live_message() -> None:
    old = [envelope(NOW - 60 - i) for i in range(3)]
    live = envelope(NOW + 30)
    queue = [envelope(NOW - 60), live, *old]  # the tail (last) is taken next

    assert stale_run(queue, NOW, GRACE) == old[::-1]
    assert stale_run([*old, live], NOW, GRACE) == []


@pytest.mark.parametrize(
    "odd",
    [
        b"not json {",
        b"[]",
        json.dumps({"headers": {}, "properties": {}, "body": "x"}).encode(),
        envelope(NOW - 60, eta="2026-01-01T00:00:00"),  # a scheduled retry: judged one by one
        envelope(NOW - 60, expires="2026-01-01T00:00:00"),
        envelope(NOW - 60).replace(b'"base64"', b'"rot13"'),
    ],
)
def test_anything_but_a_plain_stale_call_ends_the_run(odd: bytes) -> None:
    stale = envelope(NOW - 60)

    assert stale_run([stale, odd], NOW, GRACE) == []
    assert stale_run([odd, stale], NOW, GRACE) == [stale]


def test_drops_are_logged_once_per_thousand() -> None:
    counter = DropCounter()

    assert counter.add()  # the first
    assert not any(counter.add() for _ in range(LOG_EVERY - 2))
    assert counter.add()  # the thousandth
    assert counter.add(5000) and counter.dropped == LOG_EVERY + 5000
    assert not counter.add(0)
