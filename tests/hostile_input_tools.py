"""Tools of the hostile-input security tests (tests/security): each answers what it is told."""

from __future__ import annotations

from typing import Any

from toolexec import tool
from toolexec.policies import BreakerPolicy

NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=10, max_attempts=1, breaker=NO_BREAKER)
def hi_echo(value: Any = None) -> Any:
    """Answers with its argument: whatever nests inside it comes back."""
    return value


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER)
def hi_big(megabytes: int) -> str:
    """Returns that many megabytes of text: a result nobody should store whole."""
    line = "x" * 1023 + "\n"
    return line * (megabytes * 1024)


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER, max_result_bytes=200_000)
def hi_capped(kilobytes: int) -> str:
    """Returns that many kilobytes of text, under a tool limit of 200 000 bytes."""
    return ("y" * 1023 + "\n") * kilobytes
