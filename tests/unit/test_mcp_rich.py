"""The pure parts of rich results, resources, the caller relay and SSE resumption."""

from __future__ import annotations

import asyncio
import base64
import json

import mcp_types as types
import pytest
from mcp.server.streamable_http import EventMessage
from pydantic_core import to_jsonable_python

from toolexec.content import Audio, Content, Image, Resource, Text, anthropic_content, blocks_of
from toolexec.mcp.events import MemoryEventStore
from toolexec.mcp.mapping import (
    payload_page_of,
    read_resource_result,
    render_blocks,
    resource_target,
    to_call_result,
    to_resource,
    to_template,
)
from toolexec.mcp.relay import can_answer, level_allows
from toolexec.resources import match_uri
from toolexec.results import ToolResult

PNG = b"\x89PNG\r\n\x1a\nfake"


def _rich() -> object:
    content = Content.of(
        Text(text="a chart:"),
        Image.from_bytes(PNG, "image/png"),
        Audio.from_bytes(b"RIFF", "audio/wav"),
        Resource(uri="doc://a", mimeType="text/plain", text="hello"),
    )
    return to_jsonable_python(content)  # what a worker sends


def test_a_rich_result_travels_as_json_and_is_recognised() -> None:
    data = _rich()
    blocks = blocks_of(data)
    assert blocks is not None
    assert [b["type"] for b in blocks] == ["text", "image", "audio", "resource"]
    assert base64.b64decode(blocks[1]["data"]) == PNG and blocks[1]["mimeType"] == "image/png"
    # a plain dict that merely resembles one is not rendered
    assert blocks_of({"$content": [{"type": "script"}]}) is None
    assert blocks_of({"$content": [], "other": 1}) is None


def test_mcp_renders_each_block_in_order() -> None:
    result = ToolResult(status="ok", tool="chart", call_id="c", data=_rich())
    rendered = to_call_result(result)
    assert [b.type for b in rendered.content] == ["text", "image", "audio", "resource"]
    image = rendered.content[1]
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    embedded = rendered.content[3]
    assert isinstance(embedded, types.EmbeddedResource)
    assert embedded.resource.uri == "doc://a"
    # an error is never rendered as content blocks, whatever its data
    failed = ToolResult(status="error", tool="chart", call_id="c", data=_rich())
    assert [b.type for b in to_call_result(failed).content] == ["text"]
    assert render_blocks([{"type": "text", "text": "x"}])[0].type == "text"


def test_anthropic_gets_image_blocks_and_openai_text_only() -> None:
    result = ToolResult(status="ok", tool="chart", call_id="c", data=_rich())
    block = result.to_anthropic_block("tu_1")
    kinds = [part["type"] for part in block["content"]]
    assert kinds == ["text", "image", "text", "text"]
    assert block["content"][1]["source"]["media_type"] == "image/png"
    message = result.to_openai_message("call_1")
    body = json.loads(message["content"])
    assert "a chart:" in body["data"] and "[image: image/png" in body["data"]
    assert base64.b64encode(PNG).decode() not in message["content"]  # no base64 for the model
    assert (
        anthropic_content([{"type": "audio", "data": "", "mimeType": "audio/wav"}])[0]["type"]
        == "text"
    )


def test_uri_templates_match_one_segment_per_placeholder() -> None:
    assert match_uri("test://template/{id}/data", "test://template/123/data") == {"id": "123"}
    assert match_uri("test://template/{id}/data", "test://template/1/2/data") is None
    assert match_uri("a://{x}.{y}", "a://1.2") == {"x": "1", "y": "2"}


ENTRIES = {
    "r_text": {"resource": {"uri": "test://static-text", "name": "t", "mimeType": "text/plain"}},
    "r_tmpl": {"resource": {"uri": "test://{id}", "name": "tm", "mimeType": "application/json"}},
}


def test_a_resource_uri_finds_its_reader_exact_uris_first() -> None:
    assert resource_target(ENTRIES, "test://static-text") == ("r_text", {}, "text/plain")
    assert resource_target(ENTRIES, "test://7") == ("r_tmpl", {"id": "7"}, "application/json")
    assert resource_target(ENTRIES, "other://x") is None
    assert to_resource(ENTRIES["r_text"]) is not None and to_template(ENTRIES["r_text"]) is None
    assert to_template(ENTRIES["r_tmpl"]) is not None and to_resource(ENTRIES["r_tmpl"]) is None


def test_a_readers_answer_becomes_text_or_blob_contents() -> None:
    text = read_resource_result("test://a", "text/plain", "hi")
    assert text.contents[0].text == "hi"  # type: ignore[union-attr]
    blob = to_jsonable_python(Resource.from_bytes("test://b", PNG, "image/png"))
    read = read_resource_result("test://b", "image/png", blob)
    assert base64.b64decode(read.contents[0].blob) == PNG  # type: ignore[union-attr]
    assert read.contents[0].mime_type == "image/png"


def test_log_levels_and_what_a_client_can_answer() -> None:
    assert level_allows(None, "debug")
    assert level_allows("warning", "error") and not level_allows("warning", "info")
    assert can_answer(types.ClientCapabilities()) is None
    found = can_answer(types.ClientCapabilities(elicitation=types.ElicitationCapability()))
    assert found == {"elicitation": True, "sampling": False}


def test_the_event_store_replays_one_stream_after_an_id() -> None:
    store = MemoryEventStore(max_events=4)
    message = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/progress")

    async def scenario() -> tuple[list[str], str | None, str | None]:
        prime = await store.store_event("s1", None)
        await store.store_event("s2", message)
        await store.store_event("s1", message)
        sent: list[str] = []

        async def send(event: EventMessage) -> None:
            sent.append(str(event.event_id))

        stream = await store.replay_events_after(prime, send)
        for _ in range(4):  # the oldest events are forgotten
            await store.store_event("s3", message)
        gone = await store.replay_events_after(prime, send)
        return sent, stream, gone

    sent, stream, gone = asyncio.run(scenario())
    assert sent == ["3"] and stream == "s1" and gone is None


@pytest.mark.parametrize("bad", ["x", "", "999"])
def test_an_unknown_last_event_id_replays_nothing(bad: str) -> None:
    async def send(event: EventMessage) -> None:
        raise AssertionError("nothing to replay")

    assert asyncio.run(MemoryEventStore().replay_events_after(bad, send)) is None


def test_a_payload_uri_names_a_key_and_a_checked_page() -> None:
    assert payload_page_of("test://static-text") is None
    assert payload_page_of("toolexec://payload/abc") == ("abc", 0, 100)
    assert payload_page_of("toolexec://payload/abc?offset=10&limit=3") == ("abc", 10, 3)
    assert isinstance(payload_page_of("toolexec://payload/abc?limit=5000"), str)
    assert isinstance(payload_page_of("toolexec://payload/abc?offset=-1"), str)
    assert isinstance(payload_page_of("toolexec://payload/"), str)
