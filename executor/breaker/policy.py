"""What a breaker is named after and which failures count against it.

The policy itself (when it opens, how long it stays open) is plain data in
``toolexec.policies``; it travels into each script call and is not stored in Redis.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from toolexec.errors import TRANSIENT_TYPES, ToolException

__all__ = ["breaker_name", "counts_as_failure", "host_form"]


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
    safe = quote(host_form(host), safe=":.-_[]%!$&'()*+,;=~")
    if len(safe) > _MAX_HOST:
        return "sha256-" + hashlib.sha256(host.encode()).hexdigest()[:32]
    return safe


def host_form(host: str) -> str:
    """One spelling per target: ``127.1``, ``2130706433`` and ``0x7f.0.0.1`` are all
    ``127.0.0.1`` to the resolver, and ``[::FFFF:7f00:1]`` is ``::ffff:7f00:1``.

    Without this, each spelling of one address had a breaker and a retry budget of
    its own, so a model could go on hammering a failing host the breaker had cut off.
    Names lose a trailing dot (``example.com.`` is ``example.com``); urlsplit has
    already lowered their case.
    """
    name = host.rstrip(".") or host
    numeric = _ipv4_numbers(name)
    if numeric is not None:
        return str(ipaddress.IPv4Address(numeric))
    try:
        address = ipaddress.IPv6Address(name)
    except ValueError:
        return name
    mapped = address.ipv4_mapped  # ::ffff:127.0.0.1 is dialled as 127.0.0.1
    return str(mapped) if mapped is not None else address.compressed


def _ipv4_numbers(name: str) -> int | None:
    """The address of an IPv4 host in any form ``inet_aton`` reads (1 to 4 parts, each
    decimal, octal with a leading 0, or hex with 0x), as the WHATWG URL standard does."""
    parts = name.split(".")
    if len(parts) > 4 or not all(parts):
        return None
    numbers = [_ipv4_part(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    *head, last = [n for n in numbers if n is not None]
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(parts)):
        return None
    value = last
    for index, number in enumerate(head):
        value += number << (8 * (3 - index))
    return value


def _ipv4_part(part: str) -> int | None:
    lowered = part.lower()
    if lowered.startswith("0x"):
        digits, base = lowered[2:] or "0", 16
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if len(digits) > 12:  # far past 2**32 in any base: not an address
        return None
    try:
        return int(digits, base) if digits.isalnum() and digits.isascii() else None
    except ValueError:
        return None


def counts_as_failure(failure: ToolException | None) -> bool:
    """Only transient failures say the service is unhealthy.

    A 404 or a 400 means the service answered; an agent's mistake must never
    cut everyone else off from a healthy service (nor spend its retry budget).
    """
    return failure is not None and failure.error_type in TRANSIENT_TYPES
