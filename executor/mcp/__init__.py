"""toolexec and the Model Context Protocol, in both directions (the ``mcp`` extra).

``toolexec mcp`` (:mod:`toolexec.mcp.server`, :mod:`toolexec.mcp.transports`;
the command itself is in ``toolexec.ops.mcp_cli``) serves the catalog to MCP
clients; :func:`mcp_server` (:mod:`toolexec.mcp.servers`) declares a remote MCP server
whose tools a worker runs as toolexec tools (:mod:`toolexec.mcp.remote`,
:mod:`toolexec.mcp.sessions`, :mod:`toolexec.mcp.classify`).
"""

from toolexec.mcp.server import McpFront
from toolexec.mcp.servers import RemoteServer, mcp_server

__all__ = ["McpFront", "RemoteServer", "mcp_server"]
