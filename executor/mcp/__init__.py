"""toolexec and the Model Context Protocol, in both directions (the ``mcp`` extra).

``toolexec mcp`` (:mod:`toolexec.mcp.server`, :mod:`toolexec.mcp.transports`;
the command itself is in ``toolexec.ops.mcp_cli``) serves the catalog to MCP
clients; :func:`mcp_server` (:mod:`toolexec.mcp.remote`) runs a remote MCP
server's tools as toolexec tools.
"""

from toolexec.mcp.remote import RemoteServer, mcp_server
from toolexec.mcp.server import McpFront

__all__ = ["McpFront", "RemoteServer", "mcp_server"]
