"""toolexec and the Model Context Protocol, in both directions.

``toolexec mcp`` (:mod:`toolexec.mcp.server`, :mod:`toolexec.mcp.transports`)
serves the catalog to MCP clients; :func:`mcp_server` (:mod:`toolexec.mcp.remote`)
runs a remote MCP server's tools as toolexec tools. The names are imported on
first use: the ``toolexec`` command imports this package for its ``mcp``
subcommand, and must work without the ``mcp`` extra installed.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["McpFront", "RemoteServer", "mcp_server"]

_HOMES = {
    "McpFront": "toolexec.mcp.server",
    "RemoteServer": "toolexec.mcp.remote",
    "mcp_server": "toolexec.mcp.remote",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'toolexec.mcp' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
