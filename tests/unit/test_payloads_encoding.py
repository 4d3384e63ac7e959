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
