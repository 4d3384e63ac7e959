"""A ToolResult renders as what each model API expects, and shows a model only what it needs."""

from __future__ import annotations

import json
from typing import Any

from toolexec.errors import ErrorType
from toolexec.results import ErrorInfo, Timings, ToolResult

IDS: dict[str, Any] = {"tool": "get_weather", "call_id": "c-1", "run_id": "r-1"}


def _ok(data: Any = None, **extra: Any) -> ToolResult:
    return ToolResult(status="ok", data=data, attempts=1, **IDS, **extra)


def _error(**extra: Any) -> ToolResult:
    info = ErrorInfo(
        type=ErrorType.RATE_LIMITED,
        message="HTTP 429 from http://svc.test",
        suggestion="Wait before calling again.",
        retryable=True,
        retry_after=12.0,
        details=extra.pop("details", {}),
    )
    return ToolResult(status="error", error=info, attempts=3, **IDS, **extra)


def test_an_ok_result_shows_the_model_only_its_data() -> None:
    result = _ok({"temp": 21}, elapsed_ms=12.5, timings=Timings(run_ms=10.0))
    assert result.ok
    assert result.for_model() == {"status": "ok", "data": {"temp": 21}}


def test_an_error_shows_type_message_suggestion_and_attempts_but_no_ids() -> None:
    body = _error().for_model()
    assert body == {
        "status": "error",
        "error": {
            "type": "rate_limited",
            "message": "HTTP 429 from http://svc.test",
            "suggestion": "Wait before calling again.",
            "retryable": True,
            "retry_after": 12.0,
        },
        "attempts": 3,
    }
    assert not _error().ok


def test_an_error_leaves_out_empty_fields_and_keeps_details() -> None:
    info = ErrorInfo(type=ErrorType.NOT_FOUND, message="no such city", details={"status_code": 404})
    body = ToolResult(status="error", error=info, **IDS).for_model()
    assert body["error"] == {
        "type": "not_found",
        "message": "no such city",
        "retryable": False,
        "details": {"status_code": 404},
    }
    assert "data" not in body


def test_a_degraded_result_says_so_and_names_its_source() -> None:
    result = _ok({"temp": 19}, degraded=True, source="cache")
    assert result.for_model() == {
        "status": "ok",
        "data": {"temp": 19},
        "degraded": True,
        "source": "cache",
        "attempts": 1,
    }


def test_openai_message_shape() -> None:
    result = _ok({"temp": 21})
    message = result.to_openai_message("call_abc")
    assert set(message) == {"role", "tool_call_id", "content"}
    assert message["role"] == "tool"
    assert message["tool_call_id"] == "call_abc"
    assert isinstance(message["content"], str)
    assert json.loads(message["content"]) == result.for_model()


def test_openai_message_of_an_error_carries_the_error_in_its_content() -> None:
    content = json.loads(_error().to_openai_message("call_abc")["content"])
    assert content["status"] == "error" and content["error"]["type"] == "rate_limited"


def test_anthropic_block_of_a_success_has_no_is_error() -> None:
    result = _ok([1, 2])
    block = result.to_anthropic_block("toolu_1")
    assert block == {"type": "tool_result", "tool_use_id": "toolu_1", "content": result.content()}
    assert json.loads(block["content"]) == {"status": "ok", "data": [1, 2]}


def test_anthropic_block_of_an_error_is_flagged() -> None:
    block = _error().to_anthropic_block("toolu_2")
    assert block["is_error"] is True
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_2"
    assert json.loads(block["content"])["error"]["retry_after"] == 12.0


def test_anthropic_block_of_an_unknown_outcome_is_flagged() -> None:
    info = ErrorInfo(type=ErrorType.DEADLINE_EXCEEDED, message="no reply in time")
    result = ToolResult(status="unknown", error=info, **IDS)
    assert result.to_anthropic_block("toolu_3")["is_error"] is True


def test_content_keeps_non_ascii_text_readable() -> None:
    assert "Zürich" in _ok({"city": "Zürich"}).content()


def test_a_result_survives_a_json_round_trip() -> None:
    """Results travel between worker and client as JSON, never pickle."""
    original = _error(details={"status_code": 429}, timings=Timings(queued_ms=3.0, run_ms=4.5))
    again = ToolResult.model_validate_json(original.model_dump_json())
    assert again == original
    assert again.error is not None and again.error.type is ErrorType.RATE_LIMITED
