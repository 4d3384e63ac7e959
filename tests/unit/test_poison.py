"""The pure decisions behind refusing poison messages and handing back unknown tasks."""

from __future__ import annotations

import random

import pytest

from toolexec.pipeline.poison import (
    HANDBACK_HEADER,
    MAX_HANDBACKS,
    GiveUp,
    HandBack,
    call_context,
    fingerprint,
    handback_count,
    message_problem,
    unknown_task_fate,
)

GOOD_HEADERS = {"id": "c1", "task": "tools.echo", "retries": 0, "timelimit": [None, None]}
GOOD_BODY = [[], {"arguments": {}, "context": {"deadline": 100.0}}, {"callbacks": None}]


def test_a_well_formed_message_has_no_problem() -> None:
    assert message_problem(GOOD_HEADERS, GOOD_BODY) is None
    assert message_problem(GOOD_HEADERS, [[], {}, None]) is None


@pytest.mark.parametrize(
    "body",
    [
        None,
        5,
        True,
        1.5,
        "x",
        [],
        [[]],
        [[], {}],
        [[], {}, {}, {}],
        {"a": 1},
        [5, {}, {}],
        [[], [], {}],
        [[], {1: 2}, {}],
        [[], {}, "x"],
    ],
)
def test_every_body_celery_would_choke_on_is_a_problem(body: object) -> None:
    assert message_problem(GOOD_HEADERS, body) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"id": None},
        {"id": ""},
        {"id": "a\nb"},
        {"id": "x" * 500},
        {"task": 5},
        {"retries": "1"},
        {"retries": -1},
        {"retries": True},
        {"eta": 5},
        {"expires": "a\rb"},
        {"timelimit": "10"},
        {"timelimit": [1, 2, 3]},
        {"timelimit": [float("nan"), None]},
    ],
)
def test_hostile_headers_are_a_problem(change: dict[str, object]) -> None:
    assert message_problem({**GOOD_HEADERS, **change}, GOOD_BODY) is not None


def test_a_problem_never_quotes_the_message() -> None:
    problem = message_problem({**GOOD_HEADERS, "id": "secret\n"}, GOOD_BODY)
    assert problem is not None and "secret" not in problem


def test_an_unknown_tool_is_handed_back_after_a_short_pause_then_given_up() -> None:
    rng = random.Random(7)
    fates = [unknown_task_fate("tools.x", n, None, 0.0, rng) for n in range(MAX_HANDBACKS + 1)]

    backs = [f for f in fates if isinstance(f, HandBack)]
    assert [b.count for b in backs] == list(range(1, MAX_HANDBACKS + 1))
    assert all(0.1 <= b.delay <= 0.5 for b in backs)
    assert len({b.delay for b in backs}) > 1  # not in step with other workers
    assert isinstance(fates[-1], GiveUp)


def test_no_hand_back_past_the_deadline_or_for_names_that_are_not_tools() -> None:
    assert isinstance(unknown_task_fate("tools.x", 0, {"deadline": 0.1}, now=0.0), GiveUp)
    assert isinstance(unknown_task_fate("tools.x", 0, {"deadline": 60.0}, now=0.0), HandBack)
    assert isinstance(unknown_task_fate("os.system", 0, None, now=0.0), GiveUp)
    assert isinstance(unknown_task_fate("tools.x", 0, {"deadline": float("inf")}, now=0), HandBack)


def test_a_forged_hand_back_count_counts_as_the_limit() -> None:
    assert handback_count({}) == 0
    assert handback_count({HANDBACK_HEADER: 2}) == 2
    assert handback_count({HANDBACK_HEADER: "0"}) == MAX_HANDBACKS
    assert handback_count({HANDBACK_HEADER: -5}) == MAX_HANDBACKS
    assert handback_count(None) == MAX_HANDBACKS


def test_the_context_is_read_only_from_a_well_formed_body() -> None:
    assert call_context(GOOD_BODY) == {"deadline": 100.0}
    assert call_context([[], {"context": 5}, {}]) is None
    assert call_context({"context": {}}) is None


def test_a_fingerprint_holds_size_and_digest_not_the_body() -> None:
    found = fingerprint(b"token=hunter2")
    assert found["size"] == 13
    assert "hunter2" not in str(found)
    assert fingerprint("token=hunter2") == found
