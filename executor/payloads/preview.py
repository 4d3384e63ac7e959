"""What the model sees instead of a value too large for its context: a partial view.

Each preview is a JSON object that says plainly that it is partial, how big
the whole is, and how to read on (``read_payload`` with the payload's key),
with as much of the value as fits the token budget, chosen by its shape:

- text: the first and last lines, with ``… N lines omitted …`` between;
- log-like text (most lines carry a level): WARN/ERROR lines first, then
  head and tail;
- a JSON array: the first items and the total count;
- a JSON object: every key it can, with long values cut.

How much fits is found by bisection on the exact JSON size of the preview,
so the result is never over the budget (:mod:`toolexec.payloads.tokens`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolexec.payloads.tokens import budget_bytes, json_bytes
from toolexec.results import PayloadRef

__all__ = ["build_preview", "shrink"]

Preview = dict[str, Any]

_LEVEL = re.compile(r"\b(?:FATAL|CRITICAL|ERROR|WARN(?:ING)?|INFO|DEBUG|TRACE)\b")
_PROBLEM = re.compile(r"\b(?:FATAL|CRITICAL|ERROR|WARN(?:ING)?)\b")
_LOG_SHARE = 0.3  # of the first lines carrying a level, to call a text a log
_PROBLEM_WORDS = ("FATAL", "CRITICAL", "ERROR", "WARN")
_MAX_PROBLEMS = 200  # WARN/ERROR lines gathered for a log's preview
_PROBLEM_SHARE = 0.6  # of the budget a log's WARN/ERROR lines may take


@dataclass(frozen=True)
class _Cut:
    """How hard values are cut: longest string, items kept per list, depth."""

    chars: int
    items: int
    depth: int


_CUTS = (_Cut(300, 5, 4), _Cut(80, 2, 2), _Cut(24, 0, 1))


def build_preview(value: Any, ref: PayloadRef, budget_tokens: int) -> Preview:
    """The largest preview of ``value`` whose JSON stays within ``budget_tokens``."""
    limit = budget_bytes(budget_tokens)
    if isinstance(value, str):
        return _text_preview(value, ref, limit)
    if isinstance(value, list):
        return _array_preview(value, ref, limit)
    if isinstance(value, dict):
        return _object_preview(value, ref, limit)
    return _skeleton(ref, "nothing of it is shown")


def _skeleton(ref: PayloadRef, shown: str) -> Preview:
    return {
        "partial": True,
        "note": (
            f"PARTIAL PREVIEW of a stored result of {ref.size_bytes:,} bytes "
            f"({ref.count:,} {ref.unit}); {shown}. To read more, call "
            f"read_payload(key={ref.key!r}, offset=N, limit=M): {ref.unit} N to N+M-1, "
            "counted from 0."
        ),
        "payload_key": ref.key,
        f"total_{ref.unit}": ref.count,
    }


def _largest(build: Callable[[int], Preview], most: int, limit: int) -> int:
    """The largest n in [0, most] whose ``build(n)`` fits ``limit`` bytes (0 if none)."""
    low, high = 0, most
    while low < high:
        mid = (low + high + 1) // 2
        if json_bytes(build(mid)) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


# -- text ------------------------------------------------------------------


def _cut_text(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    return f"{text[:chars]}… [{len(text) - chars:,} more chars]"


def _edge_lines(text: str, count: int, limit: int) -> tuple[list[str], list[str]]:
    """The first and last lines of ``text``, as many as could ever fit ``limit`` bytes.

    Only a window at each end is split, so a 50 MB text costs no more than a
    small one; a line cut by the window is dropped unless it is the only one.
    """
    window = 2 * limit
    cut = len(text) > window
    head = text[:window].split("\n")
    if cut and len(head) > 1:
        head.pop()
    tail = text[-window:].split("\n")
    if text.endswith("\n"):
        tail.pop()
    if cut and len(tail) > 1:
        tail = tail[1:]
    chars = max(80, limit // 6)
    return [_cut_text(line, chars) for line in head[:count]], [
        _cut_text(line, chars) for line in tail[-count:]
    ]


def _head_and_tail(head: Sequence[str], tail: Sequence[str], count: int, n: int) -> list[str]:
    if n >= count:
        return list(head[:count])
    first, last = (n + 1) // 2, n // 2
    shown = list(head[:first])
    shown.append(f"… {count - first - last:,} lines omitted …")
    if last:
        shown.extend(tail[-last:])
    return shown


def _shown_lines(count: int, n: int) -> str:
    if n >= count:
        return "all lines are shown, long ones cut"
    first, last = (n + 1) // 2, n // 2
    if last == 0:
        return f"lines 1-{first} are shown" if first else "no line fits"
    return f"lines 1-{first} and {count - last + 1:,}-{count:,} are shown"


def _text_preview(text: str, ref: PayloadRef, limit: int) -> Preview:
    head, tail = _edge_lines(text, ref.count, limit)
    problems: list[str] = []
    total_problems = 0
    if _is_log(head):
        problems, total_problems = _problem_lines(text)

    def build(k: int, n: int) -> Preview:
        shown = _shown_lines(ref.count, n)
        preview = _skeleton(ref, shown)
        if problems:
            preview["note"] += f" It looks like a log: about {total_problems:,} WARN/ERROR lines"
            preview["note"] += f", the first {k} listed in warnings_and_errors."
            preview["warnings_and_errors"] = problems[:k]
        preview["text"] = "\n".join(_head_and_tail(head, tail, ref.count, n))
        return preview

    k = _largest(lambda k: build(k, 0), len(problems), int(limit * _PROBLEM_SHARE))
    most = min(ref.count, len(head) + len(tail))
    n = _largest(lambda n: build(k, n), most, limit)
    return build(k, n)


def _is_log(lines: Sequence[str]) -> bool:
    sample = [line for line in lines[:200] if line.strip()]
    leveled = sum(1 for line in sample if _LEVEL.search(line))
    return bool(sample) and leveled >= _LOG_SHARE * len(sample)


def _problem_lines(text: str) -> tuple[list[str], int]:
    """The first WARN/ERROR lines as ``line N: ...`` (numbered from 1), and about how many.

    ``str.find`` and ``str.count`` run at memory speed where a regex over
    10 MB takes a tenth of a second; the regex then checks only the candidates.
    The count is of keyword occurrences, so it is approximate.
    """
    counts = {word: text.count(word) for word in _PROBLEM_WORDS}
    starts: set[int] = set()
    for word in (word for word, count in counts.items() if count):
        hit = text.find(word)
        for _ in range(_MAX_PROBLEMS):
            if hit < 0:
                break
            starts.add(text.rfind("\n", 0, hit) + 1)
            hit = text.find(word, hit + len(word))
    found: list[str] = []
    line_no, counted_to = 1, 0
    for start in sorted(starts):
        end = text.find("\n", start)
        line = text[start : end if end >= 0 else len(text)]
        if not _PROBLEM.search(line):
            continue
        line_no += text.count("\n", counted_to, start)
        counted_to = start
        found.append(f"line {line_no:,}: {_cut_text(line, 300)}")
        if len(found) == _MAX_PROBLEMS:
            break
    return found, sum(counts.values())


# -- JSON ------------------------------------------------------------------


def shrink(value: Any, cut: _Cut = _CUTS[0]) -> Any:
    """``value`` with long strings cut, long lists and wide objects trimmed, deep parts folded."""
    if isinstance(value, str):
        return _cut_text(value, cut.chars)
    if isinstance(value, list):
        if cut.depth == 0:
            return f"[… {len(value):,} items]"
        inner = _Cut(cut.chars, cut.items, cut.depth - 1)
        kept: list[Any] = [shrink(item, inner) for item in value[: cut.items]]
        if len(value) > cut.items:
            kept.append(f"… {len(value) - cut.items:,} more items")
        return kept
    if isinstance(value, dict):
        if cut.depth == 0:
            return f"{{… {len(value):,} keys}}"
        inner = _Cut(cut.chars, cut.items, cut.depth - 1)
        wide = max(4, 4 * cut.items)
        out = {key: shrink(item, inner) for key, item in list(value.items())[:wide]}
        if len(value) > wide:
            out["…"] = f"{len(value) - wide:,} more keys"
        return out
    return value


def _best_cut(
    build: Callable[[_Cut, int], Preview], count: int, enough: int, limit: int
) -> Preview:
    """The preview of the most of ``count`` parts that fit ``limit`` bytes, trying each
    cut from the mildest and stopping at the first that shows ``enough`` parts."""
    best = _CUTS[0], 0
    for cut in _CUTS:
        n = _largest(functools.partial(build, cut), min(count, limit // 2), limit)
        if n > best[1]:
            best = cut, n
        if n >= enough:
            break
    return build(*best)


def _array_preview(items: list[Any], ref: PayloadRef, limit: int) -> Preview:
    def build(cut: _Cut, n: int) -> Preview:
        kept = [shrink(item, cut) for item in items[:n]]
        shown = f"items 0-{n - 1} are shown" if n else "no item fits"
        if kept != items[:n]:
            shown += ", long values cut"
        preview = _skeleton(ref, shown)
        preview["items"] = kept
        return preview

    return _best_cut(build, len(items), min(3, len(items)), limit)


def _object_preview(obj: dict[str, Any], ref: PayloadRef, limit: int) -> Preview:
    entries = list(obj.items())

    def build(cut: _Cut, n: int) -> Preview:
        shown = "every key is shown" if n >= len(entries) else f"the first {n} keys are shown"
        preview = _skeleton(ref, shown + ", long values cut")
        preview["object"] = {key: shrink(value, cut) for key, value in entries[:n]}
        return preview

    return _best_cut(build, len(entries), len(entries), limit)
