"""Tools the ``toolexec mcp`` tests need besides ``tooldefs``, on a queue of their own."""

from __future__ import annotations

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy

QUEUE = "mcp_front"


@tool(timeout=10, max_attempts=1, queue=QUEUE, breaker=BreakerPolicy(enabled=False))
def numbered_lines(lines: int) -> str:
    """Returns ``lines`` numbered lines: large enough to be offloaded."""
    return "\n".join(f"line {i:05d} of a long report" for i in range(lines))


@tool(
    timeout=10,
    max_attempts=1,
    queue=QUEUE,
    side_effects=True,
    breaker=BreakerPolicy(enabled=False),
)
def post_note(url: str, note: str) -> dict[str, str]:
    """POSTs a note: a tool that writes, so MCP clients see it as not read-only."""
    with httpx.Client(timeout=5) as client:
        client.post(url, json={"note": note}).raise_for_status()
    return {"posted": note}
