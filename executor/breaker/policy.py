"""What a breaker is named after and which failures count against it.

The policy itself (when it opens, how long it stays open) is plain data in
``toolexec.policies``; it travels into each script call and is not stored in Redis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from toolexec.errors import TRANSIENT_TYPES, ToolException

__all__ = ["breaker_name", "counts_as_failure"]


def breaker_name(tool: str, key_argument: str | None, arguments: Mapping[str, Any]) -> str:
    """``tool``, or ``tool@host`` when the tool keeps a breaker per downstream host.

    Retry budgets are named the same way, so one host's breaker and budget agree.
    A key starting with ``@`` is not an argument but the name of a breaker several
    tools share: the tools of one remote MCP server fail together (``toolexec.mcp.servers``).
    """
    if key_argument and key_argument.startswith("@"):
        return key_argument[1:]
    if key_argument:
        value = arguments.get(key_argument)
        host = _host(value) if isinstance(value, str) else None
        if host:
            return f"{tool}@{host}"
    return tool


#: Longest host kept readable in a breaker name (names are at most 200 characters).
_MAX_HOST = 120


def _host(url: str) -> str | None:
    """The URL's host as a breaker name may hold it; a model writes the URL.

    Braces would move the name's Redis hash tag and blanks confuse the CLI, so
    they are percent-encoded; an absurdly long host becomes its digest; a URL
    that does not parse has no host (its request fails permanently anyway).
    """
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    if not host:
        return None
    safe = quote(host, safe=":.-_[]%!$&'()*+,;=~")
    if len(safe) > _MAX_HOST:
        return "sha256-" + hashlib.sha256(host.encode()).hexdigest()[:32]
    return safe


def counts_as_failure(failure: ToolException | None) -> bool:
    """Only transient failures say the service is unhealthy.

    A 404 or a 400 means the service answered; an agent's mistake must never
    cut everyone else off from a healthy service (nor spend its retry budget).
    """
    return failure is not None and failure.error_type in TRANSIENT_TYPES
