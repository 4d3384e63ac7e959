"""Rich tool results: images, audio, embedded resources and text, mixed in one answer.

A tool's answer travels as JSON (worker → Redis → caller), so a rich result is
a JSON document of its own shape: ``{"$content": [block, ...]}``, each block in
MCP's content-block shape (``type`` text, image, audio or resource). The MCP
front (``toolexec.mcp.mapping``) renders the blocks as MCP content; the
Anthropic adapter renders images as image blocks; OpenAI's chat tool messages
take text only, so there the blocks are described in text (the image itself is
not sent). A large image goes through the payload store like any large result
(``toolexec.payloads``): the caller then reads it back page by page.

Usage in a tool::

    from toolexec.content import Content, Image, Text

    @tool
    def chart(series: list[float]) -> Content:
        return Content.of(Text(text="the chart:"), Image.from_bytes(png, "image/png"))
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CONTENT_KEY",
    "Audio",
    "Block",
    "Content",
    "Image",
    "Resource",
    "Text",
    "anthropic_content",
    "blocks_of",
    "describe",
    "text_of",
]

#: The key that marks a rich result in a ToolResult's ``data``.
CONTENT_KEY = "$content"


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)


class Text(_Block):
    """Plain text, as the model reads it."""

    type: Literal["text"] = "text"
    text: str


class _Binary(_Block):
    data: str = Field(description="base64 of the bytes")
    mime_type: str = Field(alias="mimeType")

    @classmethod
    def from_bytes(cls, data: bytes, mime_type: str) -> Any:
        """The block for ``data`` (raw bytes) of the given MIME type, e.g. ``image/png``."""
        return cls(data=base64.b64encode(data).decode("ascii"), mimeType=mime_type)

    def to_bytes(self) -> bytes:
        return base64.b64decode(self.data)


class Image(_Binary):
    """An image, base64 in JSON; build one with :meth:`from_bytes`."""

    type: Literal["image"] = "image"


class Audio(_Binary):
    """A sound clip, base64 in JSON; build one with :meth:`from_bytes`."""

    type: Literal["audio"] = "audio"


class Resource(_Block):
    """An embedded resource: a document with its URI, as text or as bytes (base64 ``blob``)."""

    type: Literal["resource"] = "resource"
    uri: str
    mime_type: str = Field(default="text/plain", alias="mimeType")
    text: str | None = None
    blob: str | None = None

    @classmethod
    def from_bytes(cls, uri: str, data: bytes, mime_type: str) -> Resource:
        return cls(uri=uri, mimeType=mime_type, blob=base64.b64encode(data).decode("ascii"))


Block = Text | Image | Audio | Resource


class Content(BaseModel):
    """A rich answer: its blocks, in order. Return it from a tool."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    blocks: list[Block] = Field(alias="$content")  # CONTENT_KEY

    @classmethod
    def of(cls, *blocks: Block) -> Content:
        return cls(**{CONTENT_KEY: list(blocks)})


def blocks_of(data: Any) -> list[dict[str, Any]] | None:
    """The content blocks of a result's ``data``, or None when it is not a rich result.

    The data came through Redis, possibly from a worker of another version, so
    each block is checked for its type before anything renders it.
    """
    if not isinstance(data, Mapping) or set(data) != {CONTENT_KEY}:
        return None
    raw = data[CONTENT_KEY]
    if not isinstance(raw, list):
        return None
    known = {"text", "image", "audio", "resource"}
    if not all(isinstance(b, Mapping) and b.get("type") in known for b in raw):
        return None
    return [dict(b) for b in raw]


def _size(block: Mapping[str, Any]) -> int:
    data = block.get("data") or block.get("blob") or ""
    return len(data) * 3 // 4


def describe(block: Mapping[str, Any]) -> str:
    """A block as text, for an API whose tool messages carry text only (OpenAI's)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "resource" and block.get("text") is not None:
        return f"[resource {block.get('uri')} ({block.get('mimeType')})]\n{block.get('text')}"
    where = f" {block.get('uri')}" if kind == "resource" else ""
    return (
        f"[{kind}{where}: {block.get('mimeType')}, {_size(block)} bytes; not shown: this "
        "API's tool results carry text only]"
    )


def anthropic_content(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A rich result as a Messages API ``tool_result``'s content: text and image blocks.

    Anthropic takes images (base64, with their media type) inside a tool result;
    audio and binary resources it does not, so they are described in text.
    """
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "image":
            source = {"type": "base64", "media_type": block.get("mimeType"), "data": block["data"]}
            out.append({"type": "image", "source": source})
        else:
            out.append({"type": "text", "text": describe(block)})
    return out


def text_of(blocks: list[dict[str, Any]]) -> str:
    """A rich result as one text, each block described (OpenAI's tool messages)."""
    return "\n".join(describe(block) for block in blocks)
