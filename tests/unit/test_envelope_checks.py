"""The pure checks a worker applies to what the broker hands it (issue 22, items 1, 4 and 9)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from toolexec.pipeline.poison import (
    MAX_RETRIES_HEADER,
    MAX_TIMELIMIT_S,
    envelope_problem,
    eta_problem,
    message_problem,
    short_hash,
)

NOW = 1_800_000_000.0


def _envelope(**over: Any) -> dict[str, Any]:
    body = base64.b64encode(json.dumps([[], {}, {}]).encode()).decode()
    envelope: dict[str, Any] = {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "tools.echo", "id": "c1"},
        "properties": {
            "delivery_tag": "3f8c1a9e-1111-2222-3333-444455556666",
            "delivery_info": {"exchange": "", "routing_key": "tools"},
            "body_encoding": "base64",
            "priority": 0,
        },
    }
    envelope.update(over)
    return envelope


def _properties(**over: Any) -> dict[str, Any]:
    return {**_envelope()["properties"], **over}


def test_a_kombu_envelope_has_no_problem() -> None:
    assert envelope_problem(_envelope()) is None
    assert envelope_problem(_envelope(body="")) is None
    assert envelope_problem(_envelope(headers=None)) is None


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (None, "not a transport envelope"),
        ([], "not a transport envelope"),
        (5, "not a transport envelope"),
        ({}, "properties"),
        (_envelope(properties="x"), "properties"),
        (_envelope(properties=_properties(delivery_info=5)), "delivery_info"),
        (_envelope(properties=_properties(delivery_info={})), "routing key"),
        (_envelope(properties=_properties(delivery_tag=["a"])), "delivery tag"),
        (_envelope(properties=_properties(delivery_tag="a\nb")), "delivery tag"),
        (_envelope(properties=_properties(body_encoding="rot13")), "body_encoding"),
        (_envelope(properties=_properties(priority=[1])), "priority"),
        (_envelope(body="%%% not base64 %%%x"), "not base64"),
        (_envelope(body=5), "not text"),
        (_envelope(headers=["task"]), "headers"),
        (_envelope(headers="task"), "headers"),
        (_envelope(headers={"task": ["tools.echo"], "id": "c1"}), "task header"),
        (_envelope(headers={"task": {"a": 1}, "id": "c1"}), "task header"),
        (_envelope(**{"content-type": ["application/json"]}), "content-type"),
    ],
)
def test_an_envelope_kombu_would_raise_on_is_refused_with_a_reason(
    payload: Any, words: str
) -> None:
    problem = envelope_problem(payload)
    assert problem is not None and words in problem


def test_retries_and_time_limits_from_a_header_are_bounded() -> None:
    good = [[], {"context": {"deadline": NOW + 30, "deferrals": 2}}, {}]
    headers = {"id": "c1", "task": "tools.echo"}
    assert message_problem({**headers, "retries": MAX_RETRIES_HEADER}, good) is None
    assert "retries" in str(message_problem({**headers, "retries": 10**30}, good))
    assert "retries" in str(message_problem({**headers, "retries": MAX_RETRIES_HEADER + 1}, good))
    assert message_problem({**headers, "timelimit": [MAX_TIMELIMIT_S, None]}, good) is None
    assert "timelimit" in str(message_problem({**headers, "timelimit": [1e12, None]}, good))
    many = [[], {"context": {"deadline": NOW + 30, "deferrals": 10**30}}, {}]
    assert "deferrals" in str(message_problem(headers, many))


def _eta(seconds: float) -> str:
    return (datetime.fromtimestamp(NOW, UTC) + timedelta(seconds=seconds)).isoformat()


def _call(deadline_in: float) -> list[Any]:
    return [[], {"context": {"deadline": NOW + deadline_in}}, {}]


def test_an_eta_within_the_deadline_is_held() -> None:
    assert eta_problem({"eta": _eta(5)}, _call(30), NOW, 900, 0, 10) is None
    assert eta_problem({"eta": _eta(-5)}, _call(30), NOW, 900, 10, 10) is None  # due: runs now
    assert eta_problem({}, _call(30), NOW, 900, 10, 10) is None


def test_an_eta_beyond_the_deadline_or_the_horizon_is_refused() -> None:
    far = {"eta": "2999-01-01T00:00:00+00:00"}
    assert "deadline" in str(eta_problem(far, _call(30), NOW, 900, 0, 10))
    assert "deadline" in str(eta_problem({"eta": _eta(31.5)}, _call(30), NOW, 900, 0, 10))
    assert "horizon" in str(eta_problem(far, [[], {}, {}], NOW, 900, 0, 10))
    assert eta_problem({"eta": _eta(600)}, [[], {}, {}], NOW, 900, 0, 10) is None
    assert "ISO 8601" in str(eta_problem({"eta": "soon"}, _call(30), NOW, 900, 0, 10))


def test_a_worker_holding_its_bound_of_scheduled_messages_refuses_one_more() -> None:
    assert eta_problem({"eta": _eta(5)}, _call(30), NOW, 900, 9, 10) is None
    assert "bound" in str(eta_problem({"eta": _eta(5)}, _call(30), NOW, 900, 10, 10))


def test_the_short_hash_is_the_head_of_the_dead_letters_sha256() -> None:
    assert short_hash(b"abc") == "ba7816bf8f01"
    assert short_hash("abc") == short_hash(b"abc")
