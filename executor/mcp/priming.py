"""SSE priming by the session's negotiated protocol, not by one request's header.

A priming event (an event id, empty data, ``retry:``) opens each POST's SSE stream
so that a client whose stream drops can reconnect with ``Last-Event-ID`` at the
pace the server asks for (SEP-1699, protocol 2025-11-25). The SDK's transport sends
it only when the request's ``MCP-Protocol-Version`` header is 2025-11-25 or later,
because a client of an older protocol may try to parse the empty ``data`` as a
JSON-RPC message and fail.

What a client can parse is what it declared at ``initialize``: a session that
negotiated 2025-11-25 belongs to a client that implements it, whatever a later
header says (the specification asks every later request to carry the negotiated
version; a request that declares an older one is the client's slip, and the
conformance suite's raw polling request is such a one). So the front presents
such a request to the SDK with the negotiated version, and priming follows the
session. Only upwards, and only within the handshake-era versions: a session that
negotiated an older protocol never gets priming it did not ask for, and a header of
a newer, sessionless protocol is left to the SDK's own routing.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, is_version_at_least
from starlette.types import Scope

__all__ = ["PRIMING_SINCE", "NegotiatedVersion", "presented_version", "with_version"]

#: The first protocol whose clients parse a priming event (the SDK's own threshold).
PRIMING_SINCE = "2025-11-25"

#: How much of an initialize answer is read for its ``protocolVersion`` (it is small).
_MAX_ANSWER_BYTES = 64 * 1024

_HEADER = MCP_PROTOCOL_VERSION_HEADER.encode("ascii")


def presented_version(declared: str | None, negotiated: str | None) -> str | None:
    """The version to show the SDK for a request that ``declared`` one (None: no header)
    in a session that ``negotiated`` one; None to leave the request as it came.

    A request without the header counts as 2025-03-26, as the specification says.
    """
    if negotiated is None or negotiated not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    if not is_version_at_least(negotiated, PRIMING_SINCE):
        return None
    if declared is not None and declared not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None  # unknown or sessionless: the SDK answers it
    if declared is not None and is_version_at_least(declared, negotiated):
        return None
    return negotiated


def with_version(scope: Scope, negotiated: str | None) -> Scope:
    """``scope`` with its protocol header replaced as :func:`presented_version` says."""
    headers = list(scope.get("headers", ()))
    declared = next(
        (bytes(v).decode("latin-1") for k, v in headers if k.lower() == _HEADER), None
    )
    version = presented_version(declared, negotiated)
    if version is None:
        return scope
    kept = [(k, v) for k, v in headers if k.lower() != _HEADER]
    return {**scope, "headers": [*kept, (_HEADER, version.encode("ascii"))]}


class NegotiatedVersion:
    """Reads ``result.protocolVersion`` from an initialize answer, JSON or SSE, as it streams."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.version: str | None = None

    def feed(self, chunk: bytes) -> None:
        if self.version is not None or len(self._buffer) > _MAX_ANSWER_BYTES:
            return
        self._buffer += chunk
        self.version = answer_version(bytes(self._buffer))


def answer_version(body: bytes) -> str | None:
    """The protocol version an initialize answer (a JSON body, or SSE ``data:`` lines) names."""
    text = body.decode("utf-8", "replace")
    candidates = [text] + [line[5:] for line in text.splitlines() if line.startswith("data:")]
    for candidate in candidates:
        version = _version_of(candidate)
        if version is not None:
            return version
    return None


def _version_of(candidate: str) -> str | None:
    try:
        message: Any = json.loads(candidate)
    except ValueError:
        return None
    result = message.get("result") if isinstance(message, dict) else None
    version = result.get("protocolVersion") if isinstance(result, dict) else None
    return version if isinstance(version, str) else None
