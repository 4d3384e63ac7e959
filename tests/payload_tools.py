"""Tools of the payload tests: large results and large arguments, made deterministically.

The tests rebuild the same values with the same functions, so they can compare
what comes back byte for byte without the value ever travelling inline.
"""

from __future__ import annotations

import hashlib

from toolexec import tool
from toolexec.policies import BreakerPolicy

QUEUE = "payloads"
#: A queue no worker consumes: messages published to it stay there to be measured.
PARKED_QUEUE = "payloads-parked"
NO_BREAKER = BreakerPolicy(enabled=False)


def make_text(lines: int) -> str:
    """``lines`` numbered lines of 54 bytes each (10 MB at 185 186 lines)."""
    return "".join(f"{i:08d} the quick brown fox jumps over the lazy dog.\n" for i in range(lines))


def make_items(count: int) -> list[dict[str, object]]:
    return [{"id": i, "name": f"item-{i}", "even": i % 2 == 0} for i in range(count)]


def make_log(lines: int, every: int) -> str:
    """An INFO log with an ERROR line every ``every`` lines (from line ``every``)."""
    return "".join(
        f"2026-01-01T00:00:00Z ERROR job {i} failed: disk full\n"
        if i and i % every == 0
        else f"2026-01-01T00:00:00Z INFO job {i} done\n"
        for i in range(lines)
    )


@tool(timeout=60, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER)
def big_text(lines: int) -> str:
    """Returns a numbered text of ``lines`` lines."""
    return make_text(lines)


@tool(timeout=60, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER)
def big_items(count: int) -> list[dict[str, object]]:
    """Returns ``count`` small objects."""
    return make_items(count)


@tool(timeout=60, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER)
def big_log(lines: int, every: int) -> str:
    """Returns a log with an ERROR line every ``every`` lines."""
    return make_log(lines, every)


@tool(timeout=60, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER, payload_token_budget=200)
def terse_text(lines: int) -> str:
    """Like big_text, with a small preview budget of its own."""
    return make_text(lines)


@tool(timeout=60, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER)
def digest(document: str) -> dict[str, object]:
    """What a summariser would see: the document's length and hash."""
    return {"chars": len(document), "sha256": hashlib.sha256(document.encode()).hexdigest()}


@tool(timeout=60, max_attempts=1, queue=PARKED_QUEUE, breaker=NO_BREAKER)
def parked_digest(document: str) -> int:
    """Never runs: its queue has no consumer, so its messages can be read off Redis."""
    return len(document)
