"""One canonical form of arguments: the same request always gets the same key, others never do."""

from __future__ import annotations

import math

import pytest

from toolexec.normalize import FLOAT_DIGITS, arguments_hash, canonical_json, normalize


def test_key_order_and_whitespace_do_not_change_the_form() -> None:
    assert canonical_json({"b": 1, "a": {"y": 2, "x": 3}}) == '{"a":{"x":3,"y":2},"b":1}'
    assert arguments_hash("t", {"b": 1, "a": 2}) == arguments_hash("t", {"a": 2, "b": 1})


def test_floats_written_differently_are_the_same_number() -> None:
    """``0.1`` and ``0.10`` are one value; so are ``1.0`` and ``1``."""
    assert canonical_json({"a": 0.1}) == canonical_json({"a": 0.10})
    assert canonical_json({"a": 1.0}) == canonical_json({"a": 1}) == '{"a":1}'
    assert arguments_hash("t", {"a": 0.1}) == arguments_hash("t", {"a": 0.10})


def test_float_noise_beyond_the_fixed_precision_is_ignored_but_real_differences_count() -> None:
    assert canonical_json(0.1 + 0.2) == canonical_json(0.3)
    assert canonical_json(0.3) != canonical_json(0.31)
    assert canonical_json(1 + 10 ** -(FLOAT_DIGITS - 2)) != canonical_json(1.0)


def test_path_like_strings_are_normalised() -> None:
    """``./data/a.csv`` and ``data//a.csv`` name the same file."""
    assert canonical_json({"p": "./data/a.csv"}) == canonical_json({"p": "data//a.csv"})
    assert normalize("/srv//x/../y/") == "/srv/y"
    assert normalize("//etc/passwd") == "/etc/passwd"
    assert arguments_hash("read", {"p": "./data/a.csv"}) == arguments_hash(
        "read", {"p": "data//a.csv"}
    )
    assert canonical_json({"p": "data/a.csv"}) != canonical_json({"p": "data/b.csv"})


def test_urls_and_text_that_only_contain_slashes_are_left_alone() -> None:
    assert normalize("https://api.example.com//v1/./x") == "https://api.example.com//v1/./x"
    assert normalize("a/b\nc//d") == "a/b\nc//d"
    assert normalize("plain words") == "plain words"


def test_nested_values_are_normalised_all_the_way_down() -> None:
    left = {"rows": [{"w": 0.10, "f": "./a//b"}], "t": (1, 2.0)}
    right = {"t": [1, 2], "rows": [{"f": "a/b", "w": 0.1}]}
    assert canonical_json(left) == canonical_json(right)


def test_non_finite_floats_get_stable_keys_distinct_from_each_other() -> None:
    forms = {canonical_json(x) for x in (math.nan, math.inf, -math.inf, 0.0)}
    assert len(forms) == 4
    assert canonical_json(math.nan) == canonical_json(float("nan"))


def test_booleans_stay_distinct_from_numbers() -> None:
    assert canonical_json({"a": True}) != canonical_json({"a": 1})


@pytest.mark.parametrize(
    ("tool_a", "tool_b", "args_a", "args_b"),
    [
        ("send", "send", {"to": "a"}, {"to": "b"}),
        ("send", "post", {"to": "a"}, {"to": "a"}),
        ("send", "send", {"n": 1}, {"n": "1"}),
    ],
)
def test_different_requests_get_different_hashes(
    tool_a: str, tool_b: str, args_a: dict[str, object], args_b: dict[str, object]
) -> None:
    assert arguments_hash(tool_a, args_a) != arguments_hash(tool_b, args_b)
