"""Reading OpenAI / Anthropic tool calls and rendering the replies, checked against the SDKs' types.

The SDK checks need the ``openai`` and ``anthropic`` packages (``pip install -e
.[sdks]``); without them those tests skip and say so. The parsing tests with
plain dicts always run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from toolexec.adapters import ToolCall, parse_tool_calls
from toolexec.errors import ErrorType, UsageError
from toolexec.guard import GuardedResult, Ruling, RunState, plan_round, settle_round
from toolexec.policies import RunBudget
from toolexec.results import ToolResult

NO_OPENAI = (
    "the openai package is not installed: pip install -e '.[sdks]' to check against its types"
)
NO_ANTHROPIC = (
    "the anthropic package is not installed: pip install -e '.[sdks]' to check against its types"
)

OPENAI_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_weather",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    },
                    {
                        "id": "call_order",
                        "type": "function",
                        "function": {"name": "query_order", "arguments": '{"order_id": "A-1"}'},
                    },
                ],
            },
        }
    ],
}

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20},
    "content": [
        {"type": "text", "text": "Let me check both."},
        {
            "type": "tool_use",
            "id": "toolu_weather",
            "name": "get_weather",
            "input": {"city": "Oslo"},
        },
        {
            "type": "tool_use",
            "id": "toolu_order",
            "name": "query_order",
            "input": {"order_id": "A-1"},
        },
    ],
}

EXPECTED = [
    ToolCall("call_weather", "get_weather", {"city": "Oslo"}),
    ToolCall("call_order", "query_order", {"order_id": "A-1"}),
]


def openai_calls(*arguments: str) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{i}", "type": "function", "function": {"name": "t", "arguments": a}}
        for i, a in enumerate(arguments)
    ]


# -- parsing -----------------------------------------------------------------------


def test_openai_tool_calls_as_dicts_are_read_in_order() -> None:
    message = OPENAI_RESPONSE["choices"][0]["message"]
    assert parse_tool_calls(message["tool_calls"], "openai") == EXPECTED


@pytest.mark.parametrize("shape", ["response", "message", "list"])
def test_openai_sdk_objects_are_read_like_dicts(shape: str) -> None:
    chat = pytest.importorskip("openai.types.chat", reason=NO_OPENAI)
    response = chat.ChatCompletion.model_validate(OPENAI_RESPONSE)
    given = {
        "response": response,
        "message": response.choices[0].message,
        "list": response.choices[0].message.tool_calls,
    }[shape]
    assert parse_tool_calls(given, "openai") == EXPECTED


def test_anthropic_tool_use_blocks_are_read_and_other_blocks_skipped() -> None:
    calls = parse_tool_calls(ANTHROPIC_MESSAGE["content"], "anthropic")
    assert calls == [
        ToolCall("toolu_weather", "get_weather", {"city": "Oslo"}),
        ToolCall("toolu_order", "query_order", {"order_id": "A-1"}),
    ]


@pytest.mark.parametrize("shape", ["message", "list"])
def test_anthropic_sdk_objects_are_read_like_dicts(shape: str) -> None:
    types = pytest.importorskip("anthropic.types", reason=NO_ANTHROPIC)
    message = types.Message.model_validate(ANTHROPIC_MESSAGE)
    given = message if shape == "message" else message.content
    assert [c.id for c in parse_tool_calls(given, "anthropic")] == ["toolu_weather", "toolu_order"]


def test_arguments_that_are_not_a_json_object_are_kept_as_the_models_text() -> None:
    """The client then answers invalid_arguments, quoting what is wrong."""
    calls = parse_tool_calls(openai_calls('{"city": "Os', "[1, 2]", "", '{"a": 1}'), "openai")
    assert [c.arguments for c in calls] == ['{"city": "Os', "[1, 2]", {}, {"a": 1}]


def test_an_openai_custom_tool_call_is_marked_as_not_runnable() -> None:
    custom = {"id": "call_c", "type": "custom", "custom": {"name": "grep", "input": "foo"}}
    (call,) = parse_tool_calls([custom], "openai")
    assert call.tool == "grep" and call.problem is not None
    assert "custom (free-form) tool calls are not supported" in call.problem


def test_no_tool_calls_is_an_empty_round() -> None:
    assert parse_tool_calls(None, "openai") == []
    assert parse_tool_calls({"role": "assistant", "content": "done", "tool_calls": None}) == []
    assert parse_tool_calls([{"type": "text", "text": "done"}], "anthropic") == []


def test_unknown_shapes_and_formats_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="format must be 'openai' or 'anthropic'"):
        parse_tool_calls([], "gemini")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="as a dict or an OpenAI/Anthropic SDK object"):
        parse_tool_calls([42], "openai")
    with pytest.raises(UsageError, match="pass the tool calls as a list"):
        parse_tool_calls({"role": "assistant"}, "openai")


# -- rendering -----------------------------------------------------------------------


def play(state: RunState | None, budget: RunBudget) -> tuple[RunState, GuardedResult]:
    """One round of the same call, answered with the same data whenever it may run."""
    state, plan = plan_round(state, [("t", {"q": "x"})], run_id="r", budget=budget, now=0.0)
    results = [
        ToolResult(status="ok", tool="t", call_id="c", data={"q": "x"}) if d.ruling.runs else None
        for d in plan.decisions
    ]
    state, out = settle_round(state, plan, results, now=0.0)
    return state, out[0]


def every_verdict() -> list[GuardedResult]:
    """Real outcomes: a run that loops (run, nudge, disable, abort), one that runs out of steps."""
    state: RunState | None = None
    seen = []
    for _ in range(5):
        state, outcome = play(state, RunBudget())
        seen.append(outcome)
    short, _ = play(None, RunBudget(max_steps=1))
    seen.append(play(short, RunBudget(max_steps=1))[1])
    return seen


def test_the_scripted_run_covers_every_verdict() -> None:
    rulings = [o.ruling for o in every_verdict()]
    assert set(rulings) == {
        Ruling.RUN,
        Ruling.NUDGE,
        Ruling.DISABLE,
        Ruling.ABORT,
        Ruling.EXHAUSTED,
    }


def test_replies_carry_the_verdict_in_their_content_and_mark_refusals_as_errors() -> None:
    for outcome in every_verdict():
        message = outcome.to_openai_message("call_1")
        block = outcome.to_anthropic_block("toolu_1")
        body = json.loads(message["content"])
        assert json.loads(block["content"]) == body
        assert (body.get("guard") or {}).get("verdict") == (
            "nudge" if outcome.ruling is Ruling.NUDGE else None
        )
        refused = outcome.ruling in (Ruling.DISABLE, Ruling.ABORT, Ruling.EXHAUSTED)
        assert block.get("is_error", False) is refused
        if refused:
            assert body["error"]["type"] in {
                ErrorType.TOOL_DISABLED,
                ErrorType.RUN_ABORTED,
                ErrorType.RUN_BUDGET_EXHAUSTED,
            }


def test_openai_tool_messages_validate_against_the_sdks_own_types() -> None:
    chat = pytest.importorskip("openai.types.chat", reason=NO_OPENAI)
    strict = TypeAdapter(chat.ChatCompletionToolMessageParam)
    assistant = OPENAI_RESPONSE["choices"][0]["message"]
    for outcome in every_verdict():
        message = outcome.to_openai_message("call_weather")
        assert strict.validate_python(message) == message, "no field the SDK does not know"
        conversation = [{"role": "user", "content": "weather?"}, assistant, message]
        TypeAdapter(list[chat.ChatCompletionMessageParam]).validate_python(conversation)


def test_anthropic_tool_result_blocks_validate_against_the_sdks_own_types() -> None:
    types = pytest.importorskip("anthropic.types", reason=NO_ANTHROPIC)
    strict = TypeAdapter(types.ToolResultBlockParam)
    blocks = [o.to_anthropic_block(f"toolu_{i}") for i, o in enumerate(every_verdict())]
    for block in blocks:
        assert strict.validate_python(block) == block, "no field the SDK does not know"
    TypeAdapter(types.MessageParam).validate_python({"role": "user", "content": blocks})
