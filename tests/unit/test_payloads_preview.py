"""Previews: structure-aware, plainly partial, and never over the token budget."""

from __future__ import annotations

from typing import Any

import pytest

from toolexec.payloads.encoding import encode
from toolexec.payloads.preview import build_preview, shrink
from toolexec.payloads.tokens import (
    BYTES_PER_TOKEN,
    MIN_TOKEN_BUDGET,
    estimate_tokens,
    json_bytes,
)
from toolexec.results import PayloadRef

KEY = "0123456789abcdef" * 2  # as long as a real key (uuid4 hex)


def ref_for(value: Any, key: str = KEY) -> PayloadRef:
    encoded = encode(value)
    return PayloadRef(
        key=key,
        store="redis",
        size_bytes=len(encoded.body),
        content_type=encoded.content_type,
        sha256="0" * 64,
        expires_at=None,
        unit=encoded.unit,
        count=encoded.count,
    )


def preview_of(value: Any, budget: int = 600) -> dict[str, Any]:
    return build_preview(value, ref_for(value), budget)


TEXT = "".join(f"row {i:06d} {'data ' * 8}\n" for i in range(100_000))


def log_line(i: int) -> str:
    event = f"ERROR disk full on /dev/sd{i}" if i % 997 == 0 and i else "INFO ok"
    return f"12:00:{i % 60:02d} {event}\n"


LOG = "".join(log_line(i) for i in range(20_000))
SHAPES = {
    "text": TEXT,
    "one huge line": "q" * 1_000_000,
    "unicode text": "".join(f"строка {i} ✓ 漢字\n" for i in range(20_000)),
    "log": LOG,
    "array of objects": [{"id": i, "title": f"title {i}" * 3} for i in range(10_000)],
    "array of huge strings": ["s" * 100_000 for _ in range(10)],
    "nested object": {"rows": [{"a": i} for i in range(10_000)], "meta": {"q": "x" * 9_000}},
    "wide object": {f"key_{i}": "v" * 200 for i in range(2_000)},
}


def test_tokens_are_about_four_bytes_each_rounded_up() -> None:
    assert BYTES_PER_TOKEN == 4
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 4_000)] == [0, 1, 1, 2, 1_000]


@pytest.mark.parametrize("budget", [MIN_TOKEN_BUDGET, 600, 2_000])
@pytest.mark.parametrize("value", SHAPES.values(), ids=SHAPES.keys())
def test_a_preview_never_exceeds_its_budget(value: Any, budget: int) -> None:
    preview = preview_of(value, budget)
    assert estimate_tokens(json_bytes(preview)) <= budget


@pytest.mark.parametrize("value", SHAPES.values(), ids=SHAPES.keys())
def test_a_preview_says_it_is_partial_and_how_to_read_on(value: Any) -> None:
    preview = preview_of(value)
    assert preview["partial"] is True
    assert preview["payload_key"] == KEY
    assert "PARTIAL PREVIEW" in preview["note"]
    assert f"read_payload(key='{KEY}'" in preview["note"]


def test_a_larger_budget_shows_more() -> None:
    small, large = preview_of(TEXT, 200), preview_of(TEXT, 2_000)
    assert len(large["text"]) > 3 * len(small["text"])


def test_text_keeps_head_and_tail_and_counts_what_it_omits() -> None:
    lines = preview_of(TEXT)["text"].split("\n")
    marker = next(i for i, line in enumerate(lines) if "omitted" in line)
    head, tail = lines[:marker], lines[marker + 1 :]
    assert head == [f"row {i:06d} {'data ' * 8}" for i in range(len(head))]
    assert tail == [f"row {i:06d} {'data ' * 8}" for i in range(100_000 - len(tail), 100_000)]
    assert lines[marker] == f"… {100_000 - len(head) - len(tail):,} lines omitted …"
    assert len(head) - len(tail) in (0, 1)


def test_a_text_of_one_huge_line_shows_its_start_cut() -> None:
    text = preview_of("q" * 1_000_000)["text"]
    assert text.startswith("q" * 80) and text.endswith("more chars]")


def test_a_log_lists_its_error_lines_first_with_line_numbers() -> None:
    preview = preview_of(LOG)
    errors = preview["warnings_and_errors"]
    assert errors[0] == "line 998: 12:00:37 ERROR disk full on /dev/sd997"
    assert list(preview)[-2:] == ["warnings_and_errors", "text"]
    assert "about 20 WARN/ERROR lines" in preview["note"]


def test_a_text_that_is_not_a_log_has_no_error_section() -> None:
    text = "".join(
        f"an ERROR in prose, line {i}\n" if i == 5 else f"prose {i}\n" for i in range(9_000)
    )
    assert "warnings_and_errors" not in preview_of(text)


def test_an_array_shows_its_first_items_and_total() -> None:
    items = SHAPES["array of objects"]
    preview = preview_of(items)
    assert preview["total_items"] == 10_000
    assert preview["items"] == items[: len(preview["items"])]
    assert len(preview["items"]) >= 10
    assert f"items 0-{len(preview['items']) - 1} are shown" in preview["note"]


def test_an_array_of_huge_items_shows_them_cut_rather_than_none() -> None:
    preview = preview_of(SHAPES["array of huge strings"])
    assert len(preview["items"]) >= 1
    assert preview["items"][0].endswith("more chars]")
    assert "long values cut" in preview["note"]


def test_an_object_keeps_its_keys_and_cuts_long_values() -> None:
    preview = preview_of(SHAPES["nested object"])
    shown = preview["object"]
    assert list(shown) == ["rows", "meta"]
    assert shown["rows"][:2] == [{"a": 0}, {"a": 1}]
    assert shown["rows"][-1] == "… 9,995 more items"
    assert shown["meta"]["q"].endswith("more chars]")


def test_a_wide_object_shows_as_many_keys_as_fit() -> None:
    preview = preview_of(SHAPES["wide object"])
    assert preview["total_keys"] == 2_000
    assert 0 < len(preview["object"]) < 2_000
    assert f"the first {len(preview['object'])} keys are shown" in preview["note"]


def test_shrink_folds_deep_values_and_leaves_small_ones_alone() -> None:
    small = {"a": [1, 2], "b": "short"}
    assert shrink(small) == small
    deep = {"l1": {"l2": {"l3": {"l4": {"l5": 1}}}}}
    assert shrink(deep) == {"l1": {"l2": {"l3": {"l4": "{… 1 keys}"}}}}
