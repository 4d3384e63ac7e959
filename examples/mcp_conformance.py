"""The fixtures of the official MCP conformance suite's server scenarios, as toolexec tools.

    toolexec worker --tools examples/mcp_conformance.py
    toolexec mcp --http 127.0.0.1:8765
    npx @modelcontextprotocol/conformance@0.1.16 server --url http://127.0.0.1:8765/mcp

Every fixture is written with toolexec's public API only: ``@tool``, rich
results from ``toolexec.content``, log lines, questions and sampling requests
to the caller from ``toolexec.caller``, and resources from
``toolexec.resources``. Each runs on a worker, behind the same defences as any
tool; the MCP front renders what it returns. The suite's scenarios and what
they expect are listed in docs/guides/mcp.md.
"""

from __future__ import annotations

import io
import json
import struct
import time
import wave
import zlib

from pydantic import BaseModel

from toolexec import (
    Audio,
    Content,
    Image,
    Resource,
    Text,
    ToolException,
    elicit,
    log,
    notify_updated,
    resource,
    sample,
    tool,
)


def _png_1x1_red() -> bytes:
    """A 1x1 red PNG, built here rather than stored as an opaque blob."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _wav_silence() -> bytes:
    """A tenth of a second of 8 kHz mono silence."""
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(1)
        clip.setframerate(8000)
        clip.writeframes(b"\x80" * 800)
    return out.getvalue()


PNG = _png_1x1_red()
WAV = _wav_silence()


@tool
def test_simple_text() -> str:
    """Answers with a line of text."""
    return "This is a simple text response for testing."


@tool
def test_image_content() -> Content:
    """Answers with an image (a 1x1 red PNG)."""
    return Content.of(Image.from_bytes(PNG, "image/png"))


@tool
def test_audio_content() -> Content:
    """Answers with a short WAV clip."""
    return Content.of(Audio.from_bytes(WAV, "audio/wav"))


@tool
def test_embedded_resource() -> Content:
    """Answers with an embedded text resource."""
    return Content.of(
        Resource(
            uri="test://embedded-resource",
            mimeType="text/plain",
            text="This is an embedded resource content.",
        )
    )


@tool
def test_multiple_content_types() -> Content:
    """Answers with text, an image and an embedded JSON resource."""
    return Content.of(
        Text(text="Multiple content types test:"),
        Image.from_bytes(PNG, "image/png"),
        Resource(
            uri="test://mixed-content-resource",
            mimeType="application/json",
            text=json.dumps({"test": "data", "value": 123}),
        ),
    )


@tool
def test_tool_with_logging() -> str:
    """Sends three log lines to its caller while it runs."""
    log("Tool execution started")
    time.sleep(0.05)
    log("Tool processing data")
    time.sleep(0.05)
    log("Tool execution completed")
    return "Tool with logging executed successfully"


@tool(max_attempts=1)
def test_error_handling() -> str:
    """Always fails: the model reads the error."""
    raise ToolException("This tool intentionally returns an error for testing")


@tool
def test_tool_with_progress() -> str:
    """Runs long enough for the front to report its progress three times."""
    time.sleep(1.0)
    return "Tool with progress executed successfully"


@tool
def test_reconnection() -> str:
    """Runs for a moment, long enough for a client to drop and resume its stream."""
    time.sleep(0.2)
    return "Reconnection test completed"


@tool(timeout=60.0)
def test_sampling(prompt: str) -> str:
    """Asks the caller's model to complete the prompt."""
    answer = sample(prompt, max_tokens=100)
    if not answer.accepted or answer.content is None:
        raise ToolException(f"sampling was not answered: {answer.action} ({answer.reason})")
    content = answer.content.get("content") or {}
    return f"LLM response: {content.get('text', '') if isinstance(content, dict) else content}"


@tool(timeout=60.0)
def test_elicitation(message: str) -> str:
    """Asks the caller's user for a username and an email address."""
    answer = elicit(
        message,
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    return f"User response: action={answer.action}, content={json.dumps(answer.content)}"


@tool(timeout=60.0)
def test_elicitation_sep1034_defaults() -> str:
    """Asks with a default for every primitive type (SEP-1034)."""
    answer = elicit(
        "Please review and update the form fields with defaults",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verified", "default": True},
            },
        },
    )
    return f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"


@tool(timeout=60.0)
def test_elicitation_sep1330_enums() -> str:
    """Asks with each of the five enum forms (SEP-1330)."""
    titled = [("value1", "First Option"), ("value2", "Second Option"), ("value3", "Third")]
    answer = elicit(
        "Please select options from the enum fields",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {
                    "type": "string",
                    "oneOf": [{"const": v, "title": t} for v, t in titled],
                },
                "legacyEnum": {
                    "type": "string",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "items": {"anyOf": [{"const": v, "title": t} for v, t in titled]},
                },
            },
        },
    )
    return f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"


@tool
def touch_watched_resource() -> int:
    """Not a suite fixture: says test://watched-resource changed (resources/updated)."""
    return notify_updated("test://watched-resource")


class address(BaseModel):
    street: str | None = None
    city: str | None = None


@tool
def json_schema_2020_12_tool(name: str | None = None, address: address | None = None) -> str:
    """Tool with JSON Schema 2020-12 features: $defs, $ref, additionalProperties."""
    return f"name={name}, address={address.model_dump() if address else None}"


@resource(
    "test://static-text",
    name="static-text",
    description="A static text resource",
    mime_type="text/plain",
)
def static_text() -> str:
    return "This is the content of the static text resource."


@resource(
    "test://static-binary",
    name="static-binary",
    description="A static binary resource (a 1x1 PNG)",
    mime_type="image/png",
)
def static_binary() -> Resource:
    return Resource.from_bytes("test://static-binary", PNG, "image/png")


@resource(
    "test://watched-resource",
    name="watched-resource",
    description="A resource clients may subscribe to",
)
def watched_resource() -> str:
    return "Watched resource content"


@resource(
    "test://template/{id}/data",
    name="template-data",
    description="Data for one id",
    mime_type="application/json",
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})
