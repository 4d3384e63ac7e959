"""How a value becomes stored bytes, and how pages of it come back.

Text is stored as its UTF-8 bytes, so a fetched payload is the very text the
tool returned; arrays and objects as compact JSON. While encoding, a sparse
index of *marks* is kept: (unit number, byte offset) pairs roughly every
:data:`MARK_EVERY_BYTES`, always at the start of a line, item or key. A page
is then one ranged read between two marks, not a download of the whole value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolexec.results import PayloadUnit

__all__ = [
    "JSON_TYPE",
    "MARK_EVERY_BYTES",
    "TEXT_TYPE",
    "Encoded",
    "Index",
    "decode",
    "encode",
    "segment_bounds",
    "segment_digest",
    "span",
    "split_units",
]

TEXT_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"

#: A page read fetches at most about this much beyond what it returns.
MARK_EVERY_BYTES = 65_536

_dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass(frozen=True)
class Index:
    """What paging needs to know about a stored value; stored beside it as JSON."""

    unit: PayloadUnit
    count: int
    size_bytes: int
    content_type: str
    sha256: str
    marks: list[tuple[int, int]]  # (unit number, byte offset); the last is (count, end)
    #: :func:`segment_digest` of each stretch between :func:`segment_bounds`, so a page
    #: (always whole stretches) is verified without reading the rest. Empty in an
    #: index written before pages were verified.
    segments: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return _dump(self.__dict__).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Index:
        fields = json.loads(raw)
        fields["marks"] = [tuple(mark) for mark in fields["marks"]]
        return cls(**fields)


@dataclass(frozen=True)
class Encoded:
    """A value's stored form and the marks to page through it."""

    body: bytes
    content_type: str
    unit: PayloadUnit
    count: int
    marks: list[tuple[int, int]]


def encode(value: Any) -> Encoded:
    """Text as UTF-8 lines; a list as JSON items; anything else as a JSON object's keys."""
    if isinstance(value, str):
        return _encode_text(value)
    if isinstance(value, list):
        return _encode_entries(len(value), lambda a, b: _dump(value[a:b]), b"[", b"]", "items")
    if isinstance(value, dict):
        entries = list(value.items())
        return _encode_entries(
            len(entries), lambda a, b: _dump(dict(entries[a:b])), b"{", b"}", "keys"
        )
    body = _dump(value).encode()
    return Encoded(body, JSON_TYPE, "items", 1, [(0, 0), (1, len(body))])


def _encode_text(text: str) -> Encoded:
    body = text.encode()
    marks = [(0, 0)]
    line = pos = 0
    for boundary in range(MARK_EVERY_BYTES, len(body), MARK_EVERY_BYTES):
        newline = body.rfind(b"\n", pos, boundary)
        if newline < 0:  # one long line spans the whole stretch
            continue
        line += body.count(b"\n", pos, newline + 1)
        pos = newline + 1
        marks.append((line, pos))
    count = line + body.count(b"\n", pos) + (0 if not body or body.endswith(b"\n") else 1)
    marks.append((count, len(body)))
    return Encoded(body, TEXT_TYPE, "lines", count, marks)


def _encode_entries(
    count: int, render: Callable[[int, int], str], opener: bytes, closer: bytes, unit: PayloadUnit
) -> Encoded:
    """Entries rendered in runs by the C encoder, a mark at the start of each run.

    ``render(a, b)`` is entries ``a`` to ``b - 1`` in brackets. Runs double or
    halve in length to stay near :data:`MARK_EVERY_BYTES`, so marks are as
    sparse as promised and the encoder is called a few hundred times for
    100 000 items rather than once per item.
    """
    chunks = [opener]
    offset = len(opener)
    marks = [(0, offset)]
    start, step = 0, 1
    while start < count:
        if start:
            chunks.append(b",")
            offset += 1
            marks.append((start, offset))
        run = render(start, min(count, start + step))[1:-1].encode()
        chunks.append(run)
        offset += len(run)
        start += step
        if len(run) < MARK_EVERY_BYTES // 2:
            step *= 2
        elif len(run) > 2 * MARK_EVERY_BYTES:
            step = max(1, step // 2)
    chunks.append(closer)
    marks.append((count, offset))
    return Encoded(b"".join(chunks), JSON_TYPE, unit, count, marks)


def segment_bounds(marks: Sequence[tuple[int, int]], size: int) -> list[int]:
    """The byte offsets that cut a body into verifiable stretches: 0, every mark, the end."""
    return sorted({0, size, *(byte for _, byte in marks)})


def segment_digest(data: bytes | memoryview) -> str:
    """A stretch's digest: sha256 like the whole body's, cut to 128 bits to keep the index small."""
    return hashlib.sha256(data).hexdigest()[:32]


def decode(body: bytes, content_type: str) -> Any:
    """The value back from its stored bytes."""
    if content_type.startswith("text/"):
        return body.decode()
    return json.loads(body)


def span(marks: Sequence[tuple[int, int]], offset: int, limit: int) -> tuple[int, int, int]:
    """(first unit, start byte, end byte) of the smallest marked stretch holding the page."""
    first, start = marks[0]
    end = marks[-1][1]
    for number, byte in marks:
        if number <= offset:
            first, start = number, byte
        if number >= offset + limit:
            end = byte
            break
    return first, start, end


def split_units(segment: bytes, unit: PayloadUnit) -> list[Any]:
    """The whole lines, items or (key, value) pairs in a marked stretch."""
    if unit == "lines":
        lines = segment.split(b"\n")
        if segment.endswith(b"\n"):
            lines.pop()
        return [line.decode() for line in lines] if segment else []
    # entries sit between marks as "a,b,c," (or "a,b,c" before the closing bracket)
    inner = segment.rstrip(b",")
    if unit == "items":
        return list(json.loads(b"[" + inner + b"]"))
    return list(json.loads(b"{" + inner + b"}").items())
