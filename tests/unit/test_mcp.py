"""The pure rules of toolexec's MCP front and proxy: mappings, decisions, classification."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import jsonschema
import mcp_types as types
import pydantic
import pytest
from mcp.shared.exceptions import MCPError

from toolexec.errors import ConfigurationError, ErrorType
from toolexec.mcp.classify import HttpStatus, classify_mcp_error, remote_side_effects
from toolexec.mcp.mapping import (
    JSON_SCHEMA_2020_12,
    RESULT_META,
    RUN_ID_META,
    TIMEOUT_META,
    annotations_for,
    call_timeout,
    cancelled_result,
    catalog_fingerprint,
    checked_run_id,
    model_body,
    output_schema,
    read_payload_arguments,
    run_id_for,
    to_call_result,
    to_tool,
)
from toolexec.mcp.remote import arguments_model
from toolexec.mcp.servers import RemoteServer
from toolexec.mcp.transports import check_bind, is_loopback, parse_listen
from toolexec.results import ErrorInfo, FallbackInfo, PayloadRef, ToolResult
from toolexec.settings import Settings
from toolexec.validation import describe_validation_error

ENTRY: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "policy": {"queue": "tools", "side_effects": False},
}


def test_a_read_only_tool_says_so_and_a_writer_is_destructive_and_idempotent() -> None:
    reader = annotations_for({"side_effects": False})
    assert reader.read_only_hint is True
    writer = annotations_for({"side_effects": True})
    assert (writer.read_only_hint, writer.destructive_hint, writer.idempotent_hint) == (
        False,
        True,
        True,
    )


def test_a_catalog_entry_becomes_a_tool_with_its_schema() -> None:
    tool = to_tool("get_weather", ENTRY)
    # the dialect is declared (MCP 2025-11-25, SEP-1613); the schema is otherwise the same
    assert tool.input_schema == {**ENTRY["parameters"], "$schema": JSON_SCHEMA_2020_12}
    assert tool.description == "The weather of a city."
    assert tool.output_schema is not None and "error" in tool.output_schema["properties"]


class Forecast(pydantic.BaseModel):
    city: str
    error: ErrorInfo | None = None  # a model of the tool's own named like toolexec's


def test_the_output_schema_holds_data_to_the_return_type_only_for_a_plain_success() -> None:
    returns = pydantic.TypeAdapter(list[Forecast]).json_schema()
    schema = output_schema(returns)
    validator = jsonschema.Draft202012Validator(schema)
    good = model_body(_result(status="ok", data=[{"city": "Paris"}]))
    bad = model_body(_result(status="ok", data=[{"town": "Paris"}]))
    assert validator.is_valid(good)
    assert not validator.is_valid(bad)
    info = ErrorInfo(type=ErrorType.TIMEOUT, message="slow")
    failed = model_body(_result(status="error", error=info))
    degraded = model_body(
        _result(
            status="ok",
            data="from another tool",
            degraded=True,
            source="other",
            fallback=FallbackInfo(primary_error=info),
        )
    )
    nudged = model_body(_result(status="ok", data=[{"city": "Oslo"}]), {"hint": "again?"})
    assert validator.is_valid(failed) and validator.is_valid(degraded)
    assert validator.is_valid(nudged)
    assert "returns.Forecast" in schema["$defs"]
    plain = jsonschema.Draft202012Validator(output_schema(None))
    assert plain.is_valid(model_body(_result(status="ok", data=[{"town": "Paris"}])))


def test_the_fingerprint_ignores_order_and_sees_a_new_tool_or_policy() -> None:
    one = catalog_fingerprint({"a": ENTRY, "b": ENTRY})
    assert one == catalog_fingerprint({"b": ENTRY, "a": ENTRY})
    assert one != catalog_fingerprint({"a": ENTRY})
    writer = {**ENTRY, "policy": {"queue": "tools", "side_effects": True}}
    assert one != catalog_fingerprint({"a": ENTRY, "b": writer})


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (None, "mcp-session"),
        ({RUN_ID_META: "run-7"}, "run-7"),
        ({RUN_ID_META: ""}, "mcp-session"),
        ({RUN_ID_META: 42}, "mcp-session"),
        ({RUN_ID_META: "x" * 201}, "mcp-session"),
        ({RUN_ID_META: "bad\nid"}, "mcp-session"),
    ],
)
def test_the_run_id_is_the_clients_when_usable(meta: dict[str, Any] | None, expected: str) -> None:
    assert run_id_for(meta, "mcp-session") == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, 60.0),
        (10, 10.0),
        (600, 60.0),
        (0, 60.0),
        (-5, 60.0),
        (float("nan"), 60.0),
        (float("inf"), 60.0),
        (True, 60.0),
        ("10", 60.0),
    ],
)
def test_the_deadline_is_the_servers_capped_by_the_clients_timeout(
    given: Any, expected: float
) -> None:
    meta = None if given is None else {TIMEOUT_META: given}
    assert call_timeout(meta, 60.0) == expected


def _result(**fields: Any) -> ToolResult:
    return ToolResult(tool="t", call_id="c", **fields)


@pytest.mark.parametrize("status", ["error", "unknown"])
def test_every_status_but_ok_is_an_error(status: str) -> None:
    info = ErrorInfo(type=ErrorType.UNAVAILABLE, message="down")
    mapped = to_call_result(_result(status=status, error=info))
    assert mapped.is_error is True


def test_the_text_is_the_openai_tool_message_content() -> None:
    result = _result(status="ok", data={"temp": 21})
    mapped = to_call_result(result)
    assert mapped.is_error is False
    block = mapped.content[0]
    assert isinstance(block, types.TextContent)
    assert block.text == result.to_openai_message("x")["content"]


def test_structured_content_is_what_the_model_reads_and_the_record_is_in_meta() -> None:
    """Before: structuredContent was the whole record (ids, timings, nulls), and clients
    such as pydantic-ai hand it to the model; about 583 bytes for an ok echo."""
    result = _result(status="ok", data={"temp": 21}, attempts=2, elapsed_ms=12.5)
    mapped = to_call_result(result)
    assert mapped.structured_content == {"status": "ok", "data": {"temp": 21}}
    assert mapped.meta is not None
    assert mapped.meta[RESULT_META] == result.model_dump(mode="json")
    info = ErrorInfo(
        type=ErrorType.NOT_FOUND, message="no such city", suggestion="Check the name."
    )
    failed = to_call_result(_result(status="error", error=info, attempts=1))
    assert failed.structured_content is not None
    assert failed.structured_content["error"] == {
        "type": "not_found",
        "message": "no such city",
        "suggestion": "Check the name.",
        "retryable": False,
    }
    assert "call_id" not in failed.structured_content
    assert "timings" not in failed.structured_content


def test_the_guards_nudge_is_in_the_text_and_the_structured_content() -> None:
    result = _result(status="ok", data=1)
    mapped = to_call_result(result, {"verdict": "nudge", "hint": "you asked this already"})
    block = mapped.content[0]
    assert isinstance(block, types.TextContent)
    assert json.loads(block.text)["guard"]["hint"] == "you asked this already"
    assert mapped.structured_content is not None
    assert mapped.structured_content["guard"]["verdict"] == "nudge"


def test_a_run_id_header_or_meta_names_the_run_when_usable() -> None:
    assert checked_run_id("run-7") == "run-7"
    assert checked_run_id("") is None and checked_run_id("a\nb") is None
    assert checked_run_id("x" * 201) is None and checked_run_id(7) is None


def test_a_degraded_or_offloaded_result_says_so_in_meta_and_text() -> None:
    primary = ErrorInfo(type=ErrorType.TIMEOUT, message="slow")
    degraded = _result(
        status="ok",
        data=1,
        degraded=True,
        source="cache",
        fallback=FallbackInfo(primary_error=primary),
    )
    mapped = to_call_result(degraded)
    assert mapped.meta is not None and mapped.meta["toolexec/degraded"] is True
    block = mapped.content[0]
    assert isinstance(block, types.TextContent) and json.loads(block.text)["degraded"] is True
    ref = PayloadRef(
        key="p1",
        store="redis",
        size_bytes=10,
        content_type="text/plain",
        sha256="0" * 64,
        unit="lines",
        count=3,
    )
    offloaded = to_call_result(_result(status="ok", data="preview", payload=ref))
    assert offloaded.structured_content is not None
    assert offloaded.structured_content["payload"]["key"] == "p1"
    assert offloaded.meta is not None
    assert offloaded.meta["toolexec/payload"] == {
        "key": "p1",
        "unit": "lines",
        "count": 3,
        "read_with": "read_payload",
    }


def test_a_cancelled_write_is_unknown_and_a_cancelled_read_an_error() -> None:
    write = cancelled_result(tool="t", call_id="c", run_id="r", side_effects=True, elapsed_s=2)
    read = cancelled_result(tool="t", call_id="c", run_id="r", side_effects=False, elapsed_s=2)
    assert write.status == "unknown" and read.status == "error"
    assert write.error is not None and write.error.type == ErrorType.DEADLINE_EXCEEDED
    assert write.error.retryable is False
    assert read.error is not None and read.error.retryable is True


# -- the proxy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "override", "expected"),
    [
        (None, None, True),  # MCP's defaults: not read-only, destructive
        (types.ToolAnnotations(read_only_hint=True), None, False),
        (types.ToolAnnotations(read_only_hint=False, destructive_hint=True), None, True),
        (types.ToolAnnotations(destructive_hint=False, idempotent_hint=True), None, False),
        (types.ToolAnnotations(destructive_hint=False, idempotent_hint=False), None, True),
        (types.ToolAnnotations(idempotent_hint=True), None, True),  # may still destroy
        (types.ToolAnnotations(read_only_hint=True), True, True),
        (None, False, False),
    ],
)
def test_side_effects_come_from_annotations_unless_overridden(
    annotations: types.ToolAnnotations | None, override: bool | None, expected: bool
) -> None:
    assert remote_side_effects(annotations, override) is expected


def _classify(exc: BaseException, status: int | None = None, *, listed: bool = True) -> Any:
    http = HttpStatus(status=status, headers={"Retry-After": "7"} if status else {})
    return classify_mcp_error(exc, http, listed=listed, url="http://r/mcp", now=0.0)


@pytest.mark.parametrize(
    ("exc", "status", "listed", "expected"),
    [
        (MCPError(-32603, "Server returned an error response"), 503, True, "unavailable"),
        (MCPError(-32603, "Server returned an error response"), 429, True, "rate_limited"),
        (MCPError(-32603, "Server returned an error response"), 401, True, "unauthorized"),
        (MCPError(-32603, "internal"), None, True, "unavailable"),
        (MCPError(-32600, "Session terminated"), 404, True, "connection_error"),
        (MCPError(-32602, "bad params"), None, True, "invalid_arguments"),
        (MCPError(-32602, "Unknown tool: x"), None, False, "unknown_tool"),
        (MCPError(-32601, "no tools"), None, True, "client_error"),
        (MCPError(-32001, "timed out"), None, True, "timeout"),
        (MCPError(-32000, "closed"), None, True, "connection_error"),
        (httpx2.ConnectError("refused"), None, True, "connection_error"),
        (httpx2.ReadTimeout("slow"), None, True, "timeout"),
        (TimeoutError(), None, True, "timeout"),
        (ConnectionResetError(), None, True, "connection_error"),
        (ExceptionGroup("g", [httpx2.ConnectError("x")]), None, True, "connection_error"),
    ],
)
def test_remote_failures_are_classified(
    exc: BaseException, status: int | None, listed: bool, expected: str
) -> None:
    assert _classify(exc, status, listed=listed).error_type == expected


def test_retry_after_of_a_429_is_kept() -> None:
    failure = _classify(MCPError(-32603, "x"), 429)
    assert failure.retryable and failure.retry_after == 7.0


def test_a_server_is_parsed_from_the_command_line() -> None:
    http = RemoteServer.parse("weather=http://127.0.0.1:9000/mcp")
    assert (http.name, http.url, http.command) == ("weather", "http://127.0.0.1:9000/mcp", ())
    stdio = RemoteServer.parse("files=stdio:python -m files_server --root '/tmp/a b'")
    assert stdio.command == ("python", "-m", "files_server", "--root", "/tmp/a b")
    for bad in ("weather", "weather=ftp://x", "we.ather=http://x", "=http://x"):
        with pytest.raises(ConfigurationError):
            RemoteServer.parse(bad)


def test_operator_settings_override_a_declared_server() -> None:
    server = RemoteServer("w", url="http://x", side_effects={"a": True})
    changed = server.configured({"timeout": 5, "queue": "q", "side_effects": {"b": False}})
    assert (changed.timeout, changed.queue) == (5, "q")
    assert changed.side_effects == {"a": True, "b": False}
    with pytest.raises(ConfigurationError):
        server.configured({"retries": 3})
    for bad in (
        {"timeout": "10"},
        {"timeout": 0},
        {"max_attempts": 0},
        {"max_attempts": 2.5},
        {"backoff_base": 5, "backoff_cap": 1},
        {"queue": 7},
        {"headers": {"Authorization": 1}},
        {"headers": "Bearer x"},
        {"side_effects": ["write"]},
        {"side_effects": {"write": "yes"}},
    ):
        with pytest.raises(ConfigurationError):
            server.configured(bad)
    secret = server.configured({"headers": {"Authorization": "Bearer s3cret"}})
    assert secret.headers == {"Authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(secret)


def test_the_tools_of_one_server_share_a_breaker() -> None:
    policy = RemoteServer("w", url="http://x", timeout=5).policy(side_effects=True)
    assert policy.breaker_key == "@mcp:w"
    assert policy.side_effects is True
    assert policy.breaker.probe_lease_s > policy.timeout


def test_remote_arguments_are_checked_against_the_schema_naming_the_field() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 2},
            "model_config": {"type": "integer"},  # a name pydantic reserves
        },
        "required": ["city"],
    }
    model, names = arguments_model("w.get", schema)
    assert model.model_json_schema() == schema
    ok = model.model_validate({"city": "Paris", "model_config": 3})
    assert ok.model_dump() == {"city": "Paris", "model_config": 3}
    assert {names[k]: getattr(ok, k) for k in type(ok).model_fields} == {
        "city": "Paris",
        "model_config": 3,
    }
    with pytest.raises(pydantic.ValidationError) as bad:
        model.model_validate({"city": "P", "model_config": "x", "extra": 1})
    words = describe_validation_error(bad.value)
    assert "city" in words and "model_config" in words and "extra" in words


# -- the HTTP transport's checks ----------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("example.com", False),
    ],
)
def test_loopback_is_recognised_without_resolving_names(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_listen_addresses_are_parsed_and_checked() -> None:
    assert parse_listen("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_listen("[::1]:8765") == ("::1", 8765)
    for bad in ("8765", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000", "h:x"):
        with pytest.raises(ConfigurationError):
            parse_listen(bad)


def test_a_bind_beyond_loopback_needs_a_token() -> None:
    check_bind("127.0.0.1", Settings())
    with pytest.raises(ConfigurationError, match="TOOLEXEC_MCP_TOKEN"):
        check_bind("0.0.0.0", Settings())
    check_bind("0.0.0.0", Settings(mcp_token="t"))


@pytest.mark.parametrize(
    ("key", "offset", "limit", "ok"),
    [
        ("p1", 0, 100, True),
        ("p1", 5, 1000, True),
        ("", 0, 10, False),
        ("k" * 513, 0, 10, False),
        (3, 0, 10, False),
        ("p1", -1, 10, False),
        ("p1", 0, 0, False),
        ("p1", 0, 1001, False),
        ("p1", True, 10, False),
        ("p1", 1.5, 10, False),
    ],
)
def test_read_payload_arguments_are_checked(key: Any, offset: Any, limit: Any, ok: bool) -> None:
    checked = read_payload_arguments({"key": key, "offset": offset, "limit": limit})
    assert (checked == (key, offset, limit)) is ok
    assert isinstance(checked, str) is not ok
