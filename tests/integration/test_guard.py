"""Scripted models drive runs through a real worker under the run guard.

Each test plays a model: it sends the tool calls an assistant message would
carry (OpenAI ``tool_calls`` or Anthropic ``tool_use`` blocks) to
``client.run_tool_calls`` and reads the replies as the model would. The tools
are ``pause`` (answers with its argument, so the same call gives the same
answer) and ``crash`` from tests/tooldefs.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from integration_support import timed
from pydantic import TypeAdapter

from toolexec.adapters import Format
from toolexec.client import ToolClient
from toolexec.clock import ManualClock
from toolexec.errors import BrokerUnavailableError, ErrorType
from toolexec.guard.model import call_key
from toolexec.policies import RunBudget
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

Call = tuple[str, Any]
_ids = itertools.count()


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


def openai_message(calls: Sequence[Call]) -> dict[str, Any]:
    """The assistant message a chat-completions model returns for ``calls``."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{next(_ids)}",
                "type": "function",
                "function": {
                    "name": tool,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for tool, args in calls
        ],
    }


def anthropic_content(calls: Sequence[Call]) -> list[dict[str, Any]]:
    """The content of an assistant message from the Messages API for ``calls``."""
    text = [{"type": "text", "text": "Let me check."}]
    return text + [
        {"type": "tool_use", "id": f"toolu_{next(_ids)}", "name": tool, "input": args}
        for tool, args in calls
    ]


def turn(
    client: ToolClient, calls: Sequence[Call], format: Format = "openai", **kwargs: Any
) -> list[dict[str, Any]]:
    """One model turn: the calls go out, the replies come back (as the model reads them)."""
    given = openai_message(calls) if format == "openai" else anthropic_content(calls)
    replies = client.run_tool_calls(given, format=format, **kwargs)
    ids = (
        [c["id"] for c in given["tool_calls"]]
        if format == "openai"
        else [b["id"] for b in given if b["type"] == "tool_use"]
    )
    key = "tool_call_id" if format == "openai" else "tool_use_id"
    assert [r[key] for r in replies] == ids, "one reply per call, in the calls' order"
    return replies


def body(reply: dict[str, Any]) -> dict[str, Any]:
    content: dict[str, Any] = json.loads(reply["content"])
    return content


def error_type(reply: dict[str, Any]) -> str | None:
    error = body(reply).get("error")
    return None if error is None else str(error["type"])


def test_the_same_call_repeated_escalates_nudge_then_disable_then_abort(
    client: ToolClient,
) -> None:
    """Given a model that asks for pause(0) five turns in a row, the guard climbs its ladder."""
    rid = run_id()

    replies = [turn(client, [("pause", {"seconds": 0})], run_id=rid)[0] for _ in range(5)]

    first, second, nudge, disabled, aborted = map(body, replies)
    assert first == second == {"status": "ok", "data": 0}
    assert nudge["data"] == 0
    assert nudge["guard"]["verdict"] == "nudge"
    assert "You just made this same call" in nudge["guard"]["hint"]
    assert nudge["guard"]["previous_result"] == {"status": "ok", "data": 0}
    assert disabled["error"]["type"] == ErrorType.TOOL_DISABLED
    assert disabled["attempts"] == 0
    assert "crash" in disabled["error"]["suggestion"], "it names other tools to use instead"
    assert aborted["error"]["type"] == ErrorType.RUN_ABORTED
    summary = aborted["error"]["details"]["summary"]
    assert summary["stuck_on"]["tool"] == "pause"
    assert summary["completed_calls"] == [
        {
            "tool": "pause",
            "call": call_key("pause", {"seconds": 0}),
            "times": 3,
            "last_status": "ok",
        }
    ]
    assert summary["last_results"][-1]["result"] == {"status": "ok", "data": 0}


def test_an_a_b_cycle_is_detected_in_anthropic_tool_use_blocks(client: ToolClient) -> None:
    """Given a model alternating two calls, the fourth is nudged as a cycle, then refused."""
    rid = run_id()
    a, b = ("pause", {"seconds": 0}), ("pause", {"seconds": 0.01})
    budget = RunBudget(repeat_threshold=5)

    replies = [
        turn(client, [call], "anthropic", run_id=rid, budget=budget)[0]
        for call in (a, b, a, b, a, b)
    ]

    assert [error_type(r) for r in replies] == [
        None,
        None,
        None,
        None,
        ErrorType.TOOL_DISABLED,
        ErrorType.RUN_ABORTED,
    ]
    assert body(replies[3])["guard"]["pattern"] == "cycle"
    assert [r.get("is_error", False) for r in replies] == [False] * 4 + [True] * 2
    stuck = body(replies[5])["error"]["details"]["summary"]["stuck_on"]
    assert stuck["pattern"] == "cycle"


def test_a_round_with_progress_resets_the_ladder(client: ToolClient) -> None:
    """Given a nudged call, when the model learns something new, the same call is only nudged."""
    rid = run_id()
    for _ in range(3):
        last = turn(client, [("pause", {"seconds": 0})], run_id=rid)[0]
    assert body(last)["guard"]["verdict"] == "nudge"

    fresh = turn(client, [("pause", {"seconds": 0.02})], run_id=rid)[0]
    again = turn(client, [("pause", {"seconds": 0})], run_id=rid)[0]

    assert body(fresh) == {"status": "ok", "data": 0.02}
    assert error_type(again) is None, "not disabled: progress reset the ladder"
    assert body(again)["guard"]["verdict"] == "nudge"


def test_max_steps_stops_the_run_and_no_later_call_reaches_the_broker(
    client: ToolClient, client_without_broker: ToolClient
) -> None:
    """Given a budget of 2 steps, the third turn is refused whole, even from another client."""
    rid = run_id()
    budget = RunBudget(max_steps=2)
    turn(client, [("pause", {"seconds": 0})], run_id=rid, budget=budget)
    turn(client, [("pause", {"seconds": 0.01}), ("crash", {"message": "x"})], run_id=rid)

    spent = turn(client, [("pause", {"seconds": 0.02}), ("crash", {"message": "y"})], run_id=rid)
    later = turn(client_without_broker, [("pause", {"seconds": 0.03})], run_id=rid)

    assert [error_type(r) for r in spent + later] == [ErrorType.RUN_BUDGET_EXHAUSTED] * 3
    details = body(spent[0])["error"]["details"]
    assert (details["budget"], details["used"], details["limit"]) == ("max_steps", 2, 2)
    assert [c["last_status"] for c in details["summary"]["completed_calls"]] == [
        "ok",
        "ok",
        "error",
    ]


def test_max_wall_time_bounds_each_call_and_then_stops_the_run(client: ToolClient) -> None:
    """Given 30 s of wall time on an injected clock, the remaining time is the calls' deadline."""
    clock = ManualClock()
    guard = client.run_guard(run_id(), RunBudget(max_wall_s=30), clock=clock)
    turn(client, [("pause", {"seconds": 0})], guard=guard)

    clock.advance(29.5)  # half a second of the run left
    (late,), took = timed(turn, client, [("pause", {"seconds": 3})], guard=guard)
    clock.advance(1)
    (spent,) = turn(client, [("pause", {"seconds": 0})], guard=guard)

    assert error_type(late) in {ErrorType.DEADLINE_EXCEEDED, ErrorType.TIMEOUT}
    assert took < 2.5, "the 3 s call was cut at the run's remaining 0.5 s (plus reply grace)"
    assert error_type(spent) == ErrorType.RUN_BUDGET_EXHAUSTED
    assert body(spent)["error"]["details"]["budget"] == "max_wall_s"


def test_the_guard_survives_a_client_restart_mid_run(settings: Settings, worker: object) -> None:
    """Given a run nudged through one client, a new client process picks the run up from Redis."""
    rid = run_id()
    with ToolClient(settings) as before:
        for _ in range(3):
            nudged = turn(before, [("pause", {"seconds": 0})], run_id=rid)[0]
    assert body(nudged)["guard"]["verdict"] == "nudge"

    with ToolClient(settings) as after:
        disabled = turn(after, [("pause", {"seconds": 0})], run_id=rid)[0]
        aborted = turn(after, [("pause", {"seconds": 0})], run_id=rid)[0]
        view = after.run_guard(rid).view()

    assert error_type(disabled) == ErrorType.TOOL_DISABLED
    assert error_type(aborted) == ErrorType.RUN_ABORTED
    assert (view.rounds, view.ended) == (5, ErrorType.RUN_ABORTED)


def test_parallel_calls_come_back_in_order_and_the_conversation_validates_with_the_sdk(
    client: ToolClient,
) -> None:
    """Given a mixed turn, each reply answers its call, and OpenAI's types accept them all."""
    chat = pytest.importorskip(
        "openai.types.chat", reason="the openai package is not installed (pip install -e '.[sdks]')"
    )
    calls: list[Call] = [
        ("pause", {"seconds": 0.4}),
        ("pause", {"seconds": 0.4}),
        ("crash", {"message": "boom"}),
        ("no_such_tool", {}),
        ("pause", '{"seconds": '),
    ]
    message = openai_message(calls)

    replies, took = timed(client.run_tool_calls, message, run_id=run_id())

    assert [error_type(r) for r in replies] == [
        None,
        None,
        ErrorType.TOOL_ERROR,
        ErrorType.UNKNOWN_TOOL,
        ErrorType.INVALID_ARGUMENTS,
    ]
    assert took < 0.8 * 2, "the two pauses ran in parallel"
    conversation = [{"role": "user", "content": "go"}, message, *replies]
    TypeAdapter(list[chat.ChatCompletionMessageParam]).validate_python(conversation)


def test_anthropic_replies_form_a_user_message_the_sdk_accepts(client: ToolClient) -> None:
    types = pytest.importorskip(
        "anthropic.types",
        reason="the anthropic package is not installed (pip install -e '.[sdks]')",
    )
    content = anthropic_content([("pause", {"seconds": 0}), ("crash", {"message": "x"})])
    message = types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )

    blocks = client.run_tool_calls(message, format="anthropic", run_id=run_id())

    assert [b.get("is_error", False) for b in blocks] == [False, True]
    TypeAdapter(types.MessageParam).validate_python({"role": "user", "content": blocks})


def test_the_asyncio_form_runs_a_turn_under_the_same_guard(client: ToolClient) -> None:
    rid = run_id()

    async def three_turns() -> list[dict[str, Any]]:
        return [
            (await client.arun_tool_calls(openai_message([("pause", {"seconds": 0})]), run_id=rid))[
                0
            ]
            for _ in range(3)
        ]

    replies = asyncio.run(three_turns())
    assert body(replies[2])["guard"]["verdict"] == "nudge"


def test_without_a_run_id_the_calls_just_run(client: ToolClient) -> None:
    replies = [turn(client, [("pause", {"seconds": 0})])[0] for _ in range(5)]
    assert [body(r) for r in replies] == [{"status": "ok", "data": 0}] * 5


def test_a_turn_the_broker_refuses_is_not_counted_against_the_run(
    client: ToolClient, client_without_broker: ToolClient
) -> None:
    """Given a broker that is down, the turn raises, and once it is back nothing was counted."""
    rid = run_id()
    turn(client, [("pause", {"seconds": 0})], run_id=rid)
    for _ in range(3):
        with pytest.raises(BrokerUnavailableError):
            turn(client_without_broker, [("pause", {"seconds": 0})], run_id=rid)

    view = client.run_guard(rid).view()
    again = turn(client, [("pause", {"seconds": 0})], run_id=rid)[0]

    assert view.rounds == 1
    assert body(again) == {"status": "ok", "data": 0}, "two calls so far: no nudge yet"
