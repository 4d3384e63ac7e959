"""What a breaker is named after and which failures count against it.

The policy itself (when it opens, how long it stays open) is plain data in
``toolexec.policies``; it travels into each script call and is not stored in Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from toolexec.errors import TRANSIENT_TYPES, ToolException

__all__ = ["breaker_name", "counts_as_failure"]


def breaker_name(tool: str, key_argument: str | None, arguments: Mapping[str, Any]) -> str:
    """``tool``, or ``tool@host`` when the tool keeps a breaker per downstream host.

    Retry budgets are named the same way, so one host's breaker and budget agree.
    """
    if key_argument:
        value = arguments.get(key_argument)
        host = urlsplit(value).hostname if isinstance(value, str) else None
        if host:
            return f"{tool}@{host}"
    return tool


def counts_as_failure(failure: ToolException | None) -> bool:
    """Only transient failures say the service is unhealthy.

    A 404 or a 400 means the service answered; an agent's mistake must never
    cut everyone else off from a healthy service (nor spend its retry budget).
    """
    return failure is not None and failure.error_type in TRANSIENT_TYPES
