"""The agent's side: :class:`ToolClient` and the pieces it wires together.

``sdk`` is the client itself; ``catalog_cache``, ``prepare`` (the checks made
before a call is queued), ``publish``, ``waiting`` (replies and deadlines) and
``payloads`` (large values) are what it delegates to.
"""

from toolexec.client.prepare import CallSpec, PreparedCall
from toolexec.client.sdk import CallHandle, ToolClient

__all__ = ["CallHandle", "CallSpec", "PreparedCall", "ToolClient"]
