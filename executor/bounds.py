"""Numbers and shapes from outside, checked before they reach Lua, Redis or a thread.

A Retry-After header, a caller's timeout, a message's deadline and a model's
arguments are written by someone else. Left unchecked, ``Retry-After: 1e300``
becomes a TTL Redis refuses half-way through a breaker script, ``timeout=nan``
a deadline that every comparison passes, and 500 levels of nesting a
``RecursionError`` in code that promised never to raise. Each check here is a
pure function, so the call sites stay one line and the bounds are in one place.
"""

from __future__ import annotations

import math
import re
from typing import Any

from toolexec.errors import UsageError

__all__ = [
    "DEFAULT_RETRY_AFTER_CAP_S",
    "MAX_ARGUMENT_DEPTH",
    "MAX_EPOCH",
    "MAX_ID_LENGTH",
    "MAX_RETRY_AFTER_S",
    "MAX_SECONDS",
    "bounded_retry_after",
    "checked_id",
    "checked_timeout",
    "depth_problem",
    "finite_epoch",
    "nesting_depth",
    "text_problem",
    "too_deep",
]

#: The longest span, in seconds, any outside number may stand for before it becomes
#: a TTL or a score (ten years): far beyond every real timeout, far below what Redis
#: (milliseconds in a signed 64-bit integer) or ``time.gmtime`` refuses.
MAX_SECONDS = 10 * 365 * 86_400.0

#: The latest absolute time (epoch seconds, about the year 3237) a message may carry.
MAX_EPOCH = 4e10

#: The hard ceiling on any Retry-After toolexec honours, whatever the settings say: a
#: day. A server asking for longer is treated as asking for a day.
MAX_RETRY_AFTER_S = 86_400.0

#: ``TOOLEXEC_RETRY_AFTER_CAP_S`` by default: a server may push a retry, and a
#: breaker's open time, five minutes out; one model's URL must not close a tool for
#: everyone for longer than that.
DEFAULT_RETRY_AFTER_CAP_S = 300.0

#: The deepest nesting of arrays and objects a call's arguments may have. Real tool
#: arguments are a few levels deep; Python's own recursion (json, pydantic, repr)
#: gives out near 1000, and validation and redaction each add frames.
MAX_ARGUMENT_DEPTH = 64


#: A lone UTF-16 surrogate: Python keeps one in a ``str`` (JSON's ``"\ud800"`` decodes to
#: it), but it is not a character, and encoding the text as UTF-8 raises.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def bounded_retry_after(value: Any, cap: float = MAX_RETRY_AFTER_S) -> float | None:
    """A Retry-After in seconds made safe: None unless a finite number, then within [0, cap]."""
    if not _is_number(value) or not math.isfinite(value):
        return None
    return min(max(0.0, float(value)), cap, MAX_RETRY_AFTER_S)


def finite_epoch(value: Any, name: str) -> float:
    """An absolute time (epoch seconds) from a message: finite, and before ``MAX_EPOCH``."""
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_EPOCH:
        raise ValueError(f"{name} must be a finite time in epoch seconds, not {value!r:.40}")
    return float(value)


def checked_timeout(timeout: Any) -> float | None:
    """A caller's timeout in seconds (None: the default), or :class:`UsageError`.

    Raised before anything is published: ``nan`` would make a deadline every
    comparison passes, and a string or ``True`` is a caller's bug.
    """
    if timeout is None:
        return None
    if not _is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
        raise UsageError(
            f"timeout must be a positive, finite number of seconds, not {timeout!r:.40}"
        )
    return float(min(timeout, MAX_SECONDS))


#: The longest run or call id a caller may give: an id, not a document.
MAX_ID_LENGTH = 255


def checked_id(value: Any, name: str) -> str | None:
    """A caller's run or call id (None: none given), or :class:`UsageError`.

    An id becomes part of Redis keys and log lines, so it must be a short
    string without control characters; checked before anything is published.
    """
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ID_LENGTH
        or any(ord(c) < 32 or ord(c) == 127 for c in value)
        or _SURROGATE.search(value)
    ):
        raise UsageError(
            f"{name} must be a string of 1-{MAX_ID_LENGTH} printable characters, not {value!r:.80}"
        )
    return value


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply arrays and objects nest in ``value``, counting stops past ``limit``.

    Iterative, so a value nested far deeper than Python's recursion limit is
    measured without a ``RecursionError``.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def too_deep(limit: int = MAX_ARGUMENT_DEPTH) -> str:
    """What a model reads when its arguments nest too deeply."""
    return (
        f"the arguments nest arrays and objects more than {limit} levels deep; "
        "send a flatter structure"
    )


def depth_problem(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> str | None:
    """Why ``value`` nests too deeply to be a tool's arguments, or None."""
    return too_deep(limit) if nesting_depth(value, limit) > limit else None


#: How much of a key a message quotes: the path names the field, it need not repeat it.
_MAX_KEY_SHOWN = 40


def _shown_key(key: str) -> str:
    text = key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return text if len(text) <= _MAX_KEY_SHOWN else text[: _MAX_KEY_SHOWN - 1] + "…"


def _bad_text(node: Any) -> bool:
    return isinstance(node, str) and not node.isascii() and _SURROGATE.search(node) is not None


def _unencodable_at(value: Any) -> list[str] | None:
    """The path to the first key or string holding a lone surrogate, or None."""
    stack: list[tuple[Any, list[str]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if _bad_text(node):
            return path
        if isinstance(node, dict):
            for key, child in node.items():
                step = [*path, _shown_key(str(key))]
                if _bad_text(key):
                    return [*step[:-1], f"{step[-1]} (the key itself)"]
                stack.append((child, step))
        elif isinstance(node, list | tuple):
            stack.extend((child, [*path, str(i)]) for i, child in enumerate(node))
    return None


def text_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a call's arguments as text, or None.

    A lone surrogate passes ``json.dumps`` (escaped) and pydantic's ``str``, then
    raises ``UnicodeEncodeError`` wherever the text is encoded: in the digest of
    the arguments, in Redis, in a log line. That error's ``repr`` quotes the whole
    text it failed on, which reached the worker log and Flower with the call's
    secrets in it; so such arguments are refused first, naming the field only.
    Call after :func:`depth_problem`: the walk is iterative but visits everything.
    """
    path = _unencodable_at(value)
    if path is None:
        return None
    where = ".".join(path) if path else "(arguments)"
    return (
        f"the arguments are not valid Unicode text: {where} holds a lone UTF-16 surrogate "
        "(an escape such as \\ud800 without its pair), which cannot be encoded; "
        "send the text as real characters"
    )
