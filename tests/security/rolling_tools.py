"""A tool only the newer workers of a rolling deploy have."""

from __future__ import annotations

from toolexec import tool
from toolexec.policies import BreakerPolicy


@tool(timeout=5, max_attempts=1, breaker=BreakerPolicy(enabled=False))
def sec_new(text: str) -> str:
    """Answers with its argument: only workers deployed with this module have it."""
    return f"new:{text}"
