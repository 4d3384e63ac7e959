"""A tool that appears in the catalog while an MCP client is connected (list_changed)."""

from __future__ import annotations

from toolexec import tool

QUEUE = "mcp_late"


@tool(timeout=5, max_attempts=1, queue=QUEUE)
def mcp_late_probe() -> str:
    """Answers "late"; exists only to change the catalog."""
    return "late"
