"""Stored form of payloads and paging between marks: every page is an exact slice."""

from __future__ import annotations

from typing import Any

import pytest

from toolexec.payloads.encoding import (
    JSON_TYPE,
    MARK_EVERY_BYTES,
    TEXT_TYPE,
    decode,
    encode,
    span,
    split_units,
)


def units_of(value: Any) -> list[Any]:
    """What paging should return, computed the obvious way."""
    if isinstance(value, str):
        lines = value.split("\n")
        if value.endswith("\n") or not value:
            lines.pop()
        return lines
    if isinstance(value, dict):
        return list(value.items())
    return list(value)


def page(value: Any, offset: int, limit: int) -> list[Any]:
    encoded = encode(value)
    first, start, end = span(encoded.marks, offset, limit)
    return split_units(encoded.body[start:end], encoded.unit)[
        offset - first : offset - first + limit
    ]


LONG_TEXT = "".join(f"line {i} {'é' * (i % 7)}\n" for i in range(40_000))
VALUES = {
    "empty text": "",
    "one line without newline": "just this",
    "blank lines": "\n\n\n",
    "no trailing newline": "a\nb\nc",
    "long multibyte text": LONG_TEXT,
    "one huge line then short ones": "x" * (3 * MARK_EVERY_BYTES) + "\nshort\nend\n",
    "empty array": [],
    "array of numbers": list(range(50_000)),
    "array of big items": [{"blob": "b" * 30_000, "n": i} for i in range(20)],
    "object": {f"k{i}": {"v": i, "s": "z" * (i % 50)} for i in range(5_000)},
}


@pytest.mark.parametrize("value", VALUES.values(), ids=VALUES.keys())
def test_decode_gives_back_the_value(value: Any) -> None:
    encoded = encode(value)
    assert decode(encoded.body, encoded.content_type) == value
    assert encoded.count == len(units_of(value))


@pytest.mark.parametrize("value", VALUES.values(), ids=VALUES.keys())
def test_every_page_is_the_same_slice_as_the_whole(value: Any) -> None:
    expected = units_of(value)
    for offset in {0, 1, 2, len(expected) // 3, len(expected) - 1, len(expected) + 5}:
        for limit in (1, 7, 1_000):
            assert page(value, max(offset, 0), limit) == expected[max(offset, 0) : offset + limit]


def test_text_is_stored_as_its_own_utf8_bytes() -> None:
    encoded = encode("héllo\nwörld\n")
    assert encoded.body == "héllo\nwörld\n".encode()
    assert (encoded.content_type, encoded.unit, encoded.count) == (TEXT_TYPE, "lines", 2)


def test_arrays_are_compact_json_and_marks_are_sparse() -> None:
    """Marks every ~64 KB: a 1 MB array has tens of marks, not one per item."""
    value = list(range(200_000))
    encoded = encode(value)
    assert encoded.body == ("[" + ",".join(map(str, value)) + "]").encode()
    assert encoded.content_type == JSON_TYPE
    assert 5 < len(encoded.marks) < 3 * len(encoded.body) // MARK_EVERY_BYTES + 30


def test_a_page_reads_little_more_than_it_returns() -> None:
    encoded = encode(LONG_TEXT)
    _, start, end = span(encoded.marks, 20_000, 10)
    assert end - start <= 2 * MARK_EVERY_BYTES + 1_000


def test_consecutive_pages_cover_the_value_exactly_once() -> None:
    value = list(range(12_345))
    pages = [page(value, offset, 1_000) for offset in range(0, 12_345, 1_000)]
    assert [item for chunk in pages for item in chunk] == value


class CountingBytes(bytes):
    """Bytes that count how many bytes the marks' searches look at."""

    scanned = 0

    def rfind(self, sub: Any, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        self.scanned += end - start
        return super().rfind(sub, start, end)

    def count(self, sub: Any, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        self.scanned += (len(self) if end is None else end) - start
        return super().count(sub, start, end)


@pytest.mark.parametrize("newline_every", [None, 1, 100, 200_000])
def test_marks_read_each_byte_at_most_twice(newline_every: int | None) -> None:
    """Issue 22, item 6: one 300 MB line took 35 s; the search rescanned it from its start."""
    from toolexec.payloads.encoding import text_marks

    size, every = 400_000, 64
    raw = bytearray(b"x" * size)
    if newline_every:
        stride = slice(newline_every - 1, None, newline_every)
        raw[stride] = b"\n" * len(raw[stride])
    body = CountingBytes(bytes(raw))

    marks, count = text_marks(body, every)

    # the search from the last line start read up to 1 250 000 000 bytes of one long line here
    assert body.scanned <= 2 * size + every
    assert count == len(units_of(bytes(raw).decode())) and marks[-1] == (count, size)


def test_marks_with_small_strides_match_a_plain_search() -> None:
    """The shortened search finds the same line starts as a search from the last mark."""
    from toolexec.payloads.encoding import text_marks

    text = "".join(("y" * (i * 37 % 500)) + "\n" for i in range(3000)) + "tail"
    body = text.encode()
    every = 256

    marks, count = text_marks(body, every)

    expected, line, pos = [(0, 0)], 0, 0
    for boundary in range(every, len(body), every):
        newline = body.rfind(b"\n", pos, boundary)
        if newline >= 0:
            line += body.count(b"\n", pos, newline + 1)
            pos = newline + 1
            expected.append((line, pos))
    assert marks[:-1] == expected
    assert count == len(units_of(text)) and marks[-1] == (count, len(body))


@pytest.mark.parametrize(
    "value",
    ["é" * 3000, "x" * 5001, list(range(5000)), {f"k{i}": i for i in range(2000)}, "z" * 10],
)
def test_encoding_stops_at_the_limit(value: Any) -> None:
    from toolexec.payloads.encoding import TooLarge

    whole = len(encode(value).body)
    limit = 5000

    if whole <= limit:
        assert len(encode(value, limit).body) == whole
        return
    with pytest.raises(TooLarge) as stop:
        encode(value, limit)
    assert limit < stop.value.size <= whole


def test_a_text_longer_than_the_limit_is_refused_without_encoding_it() -> None:
    """Characters alone prove a text too large: nothing of 300 MB is ever encoded."""
    from toolexec.payloads.encoding import TooLarge

    class Unencodable(str):
        def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
            raise AssertionError("encoded a text that could only be refused")

    with pytest.raises(TooLarge) as stop:
        encode(Unencodable("x" * 10_001), 10_000)
    assert stop.value.size == 10_001
