"""How a value becomes stored bytes, and how pages of it come back.

Text is stored as its UTF-8 bytes, so a fetched payload is the very text the
tool returned; arrays and objects as compact JSON. While encoding, a sparse
index of *marks* is kept: (unit number, byte offset) pairs roughly every
:data:`MARK_EVERY_BYTES`, always at the start of a line, item or key. A page
is then one ranged read between two marks, not a download of the whole value.

Encoding takes an optional byte ``limit`` and stops with :class:`TooLarge` as
soon as the body is sure to pass it (a text longer in characters than the
limit is refused before it is encoded at all), so a result far past its limit
costs next to nothing. Every step is linear in the body's size: a 300 MB text
of one line used to be rescanned from its start at every mark boundary
(35 s before ``result_too_large``).
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
    "TooLarge",
    "decode",
    "encode",
    "segment_bounds",
    "segment_digest",
    "span",
    "split_units",
    "text_marks",
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


class TooLarge(Exception):
    """Encoding stopped because the body passes the limit; it is at least ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"at least {size:,} bytes")
        self.size = size


def _check(size: int, limit: int | None) -> None:
    if limit is not None and size > limit:
        raise TooLarge(size)


def encode(value: Any, limit: int | None = None) -> Encoded:
    """Text as UTF-8 lines; a list as JSON items; anything else as a JSON object's keys.

    Raises :class:`TooLarge`, before encoding the rest, once the body passes ``limit``.
    """
    if isinstance(value, str):
        return _encode_text(value, limit)
    if isinstance(value, list):
        return _encode_entries(
            len(value), lambda a, b: _dump(value[a:b]), b"[", b"]", "items", limit
        )
    if isinstance(value, dict):
        entries = list(value.items())
        return _encode_entries(
            len(entries), lambda a, b: _dump(dict(entries[a:b])), b"{", b"}", "keys", limit
        )
    body = _dump(value).encode()
    _check(len(body), limit)
    return Encoded(body, JSON_TYPE, "items", 1, [(0, 0), (1, len(body))])


def _encode_text(text: str, limit: int | None) -> Encoded:
    _check(len(text), limit)  # each character is at least one byte of UTF-8
    body = text.encode()
    _check(len(body), limit)
    marks, count = text_marks(body, MARK_EVERY_BYTES)
    return Encoded(body, TEXT_TYPE, "lines", count, marks)


def text_marks(body: bytes, every: int) -> tuple[list[tuple[int, int]], int]:
    """The marks of a UTF-8 text (a line start at or before each ``every`` bytes) and its
    line count, reading each byte at most twice.

    The search for a boundary's newline looks back only to the previous boundary:
    any newline before that was found at the previous step (so ``pos`` is past it).
    Searching back to ``pos`` instead rescanned a long line from its start at every
    boundary, quadratic in the line's length.
    """
    marks = [(0, 0)]
    line = pos = 0
    for boundary in range(every, len(body), every):
        newline = body.rfind(b"\n", max(pos, boundary - every), boundary)
        if newline < 0:  # one long line spans the whole stretch
            continue
        line += body.count(b"\n", pos, newline + 1)
        pos = newline + 1
        marks.append((line, pos))
    count = line + body.count(b"\n", pos) + (0 if not body or body.endswith(b"\n") else 1)
    marks.append((count, len(body)))
    return marks, count


def _encode_entries(
    count: int,
    render: Callable[[int, int], str],
    opener: bytes,
    closer: bytes,
    unit: PayloadUnit,
    limit: int | None = None,
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
        _check(offset + len(closer), limit)
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
