"""Rich results, resources, log lines and questions to the caller, through ``toolexec mcp``.

The official MCP client (streamable HTTP on loopback, the handshake-era protocol)
against a real front and a worker running ``examples/mcp_conformance.py``: every
answer below crossed the queue, and every question went worker → Redis → front →
client and back.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_support import mcp_http_process

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_conformance.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def url(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("mcp-rich")
    env = {**worker_env, "TOOLEXEC_DEFAULT_QUEUE": "mcp_rich"}
    worker = WorkerProcess(str(EXAMPLE), env, queues="mcp_rich", log_path=logs / "worker.log")
    worker.start(settings.redis_url or "", settings.key_prefix)
    try:
        with mcp_http_process(worker_env, logs / "front.log") as found:
            yield found
    finally:
        worker.stop()


def _run(url: str, body: Any, **options: Any) -> Any:
    async def main() -> Any:
        async with Client(url, mode="legacy", **options) as client:
            return await body(client)

    return anyio.run(main)


def test_rich_results_arrive_as_mcp_content_blocks(url: str) -> None:
    async def body(client: Client) -> Any:
        return await client.call_tool("test_multiple_content_types", {})

    result = _run(url, body)
    assert not result.is_error
    kinds = [block.type for block in result.content]
    assert kinds == ["text", "image", "resource"]
    image = result.content[1]
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(PNG_MAGIC)
    embedded = result.content[2]
    assert isinstance(embedded, types.EmbeddedResource)
    assert json.loads(embedded.resource.text) == {"test": "data", "value": 123}  # type: ignore[union-attr]


def test_resources_are_listed_and_read_through_the_workers(url: str) -> None:
    async def body(client: Client) -> Any:
        listed = await client.list_resources()
        templates = await client.list_resource_templates()
        text = await client.read_resource("test://static-text")
        binary = await client.read_resource("test://static-binary")
        templated = await client.read_resource("test://template/42/data")
        return listed, templates, text, binary, templated

    listed, templates, text, binary, templated = _run(url, body)
    uris = {r.uri for r in listed.resources}
    assert {"test://static-text", "test://static-binary", "test://watched-resource"} <= uris
    assert [t.uri_template for t in templates.resource_templates] == [
        "test://template/{id}/data",
        "toolexec://payload/{key}{?offset,limit}",  # stored payloads, always served
    ]
    assert text.contents[0].text == "This is the content of the static text resource."
    assert base64.b64decode(binary.contents[0].blob).startswith(PNG_MAGIC)
    assert json.loads(templated.contents[0].text)["id"] == "42"


def test_a_subscribed_session_hears_that_a_resource_changed(url: str) -> None:
    """A tool on a worker says the resource changed; the front tells the subscribed session."""
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.append(message.params.uri)

    async def body(client: Client) -> Any:
        await client.subscribe_resource("test://watched-resource")
        fronts = await client.call_tool("touch_watched_resource", {})
        with anyio.fail_after(10):
            while not heard:
                await anyio.sleep(0.05)
        await client.unsubscribe_resource("test://watched-resource")
        return fronts

    fronts = _run(url, body, message_handler=on_message)
    assert fronts.structured_content["data"] >= 1
    assert heard == ["test://watched-resource"]


def test_an_unknown_resource_and_an_unknown_tool_are_protocol_errors(url: str) -> None:
    async def body(client: Client) -> Any:
        errors = []
        for attempt in (
            lambda: client.read_resource("test://nothing-here"),
            lambda: client.call_tool("no_such_tool", {}),
        ):
            try:
                await attempt()
            except MCPError as exc:
                errors.append((exc.code, exc.message))
        return errors

    errors = _run(url, body)
    assert errors[0][0] == -32002
    assert errors[1][0] == types.INVALID_PARAMS and "no_such_tool" in errors[1][1]
    # the listed tools never include a resource's reader
    names = _run(url, lambda c: c.list_tools())
    assert not [t.name for t in names.tools if t.name.startswith("resource_")]


def test_a_tool_logs_to_its_caller_at_the_level_the_session_set(url: str) -> None:
    lines: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        lines.append(params)

    async def body(client: Client) -> Any:
        await client.call_tool("test_tool_with_logging", {})
        before = len(lines)
        await client.set_logging_level("warning")  # info lines are dropped from now on
        await client.call_tool("test_tool_with_logging", {})
        return before

    before = _run(url, body, logging_callback=on_log)
    assert [line.data for line in lines[:before]] == [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ]
    assert len(lines) == before


def test_a_tool_asks_its_callers_user_and_model(url: str) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@x"})

    async def on_sample(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        text = params.messages[0].content.text  # type: ignore[union-attr]
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(text=f"echo: {text}"),
            model="test-model",
        )

    async def body(client: Client) -> Any:
        elicited = await client.call_tool("test_elicitation", {"message": "who are you?"})
        sampled = await client.call_tool("test_sampling", {"prompt": "hello"})
        return elicited, sampled

    elicited, sampled = _run(url, body, elicitation_callback=on_elicit, sampling_callback=on_sample)
    assert asked[0].message == "who are you?"
    said = elicited.structured_content["data"]
    assert said == 'User response: action=accept, content={"username": "ada", "email": "a@x"}'
    assert sampled.structured_content["data"] == "LLM response: echo: hello"


def test_a_client_that_cannot_answer_gets_a_typed_refusal_at_once(url: str) -> None:
    async def body(client: Client) -> Any:
        return await client.call_tool("test_elicitation", {"message": "anyone?"})

    result = _run(url, body)  # no elicitation callback: the capability is not declared
    assert result.structured_content["data"].startswith("User response: action=refused,")


def _open_session(http: httpx.Client, url: str, version: str, name: str) -> dict[str, str]:
    """A session opened by hand at protocol ``version``: the headers of its next requests."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": version,
    }
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": name, "version": "1"},
        },
    }
    opened = http.post(url, json=init, headers=headers)
    headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    http.post(url, json=initialized, headers=headers)
    return headers


def _call(tool: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {}},
    }


def test_sse_streams_carry_ids_retry_and_resume_from_the_last_event(url: str) -> None:
    """A 2025-11-25 request gets a priming event (an id, ``retry:``); after it drops its
    stream, a GET with ``Last-Event-ID`` replays the call's answer."""
    with httpx.Client(timeout=30) as http:
        headers = _open_session(http, url, "2025-11-25", "resume-test")
        call = _call("test_tool_with_progress")
        first_id = None
        with http.stream("POST", url, json=call, headers=headers) as stream:
            lines = stream.iter_lines()
            for line in lines:
                if line.startswith("id:"):
                    first_id = line[3:].strip()
                if line.startswith("retry:"):
                    retry = int(line[6:].strip())
                    break
            # the client drops the stream here, before the answer
        assert first_id is not None and retry > 0
        resumed = {**headers, "Accept": "text/event-stream", "Last-Event-ID": first_id}
        answer = None
        with http.stream("GET", url, headers=resumed) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and line[5:].strip():
                    message = json.loads(line[5:])
                    if message.get("id") == 1:
                        answer = message
                        break
    assert answer is not None and "result" in answer
    assert not answer["result"].get("isError")


def _events_of(url: str, negotiate: str, declare: str) -> list[dict[str, str]]:
    """The SSE events (their ``id``, ``retry`` and ``data`` fields) of a call declaring
    ``declare`` in a session that negotiated ``negotiate``, up to the call's answer."""
    events: list[dict[str, str]] = []
    with httpx.Client(timeout=30) as http:
        headers = _open_session(http, url, negotiate, "priming-test")
        call = _call("test_simple_text")
        declared = {**headers, "MCP-Protocol-Version": declare}
        with http.stream("POST", url, json=call, headers=declared) as stream:
            event: dict[str, str] = {}
            for line in stream.iter_lines():
                if not line:  # the end of one event
                    events.append(event)
                    if '"id":1' in event.get("data", "").replace(" ", ""):
                        break
                    event = {}
                    continue
                field, _, value = line.partition(":")
                event[field] = event.get(field, "") + value.strip()
    return events


def test_a_2025_11_25_session_is_primed_whatever_a_request_declares(url: str) -> None:
    """The suite's polling request declares 2025-03-26 in a session that negotiated
    2025-11-25: its stream still opens with the priming event (toolexec.mcp.priming)."""
    events = _events_of(url, "2025-11-25", "2025-03-26")
    assert events[0]["id"] and not events[0]["data"] and int(events[0]["retry"]) > 0
    assert "result" in json.loads(events[-1]["data"])


def test_an_older_session_gets_no_priming_it_could_not_parse(url: str) -> None:
    events = _events_of(url, "2025-06-18", "2025-06-18")
    assert all(event.get("data") for event in events)  # no event with empty data
    assert not any("retry" in event for event in events)
    assert "result" in json.loads(events[-1]["data"])
