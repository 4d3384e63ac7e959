"""What a remote MCP server's answers mean for toolexec: pure decisions, no I/O.

Whether a remote tool has side effects (from its annotations), which failure
class a failed call is (from the JSON-RPC error, the HTTP status the transport
saw, and whether the server still lists the tool), and what a success hands
the model. ``toolexec.mcp.sessions`` applies them to what a session reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError

from toolexec.errors import (
    ClientError,
    InvalidArgumentsError,
    ToolConnectionError,
    ToolException,
    ToolTimeoutError,
    UnavailableError,
    UnknownToolError,
)
from toolexec.pipeline.classify import classify_response

__all__ = [
    "HttpStatus",
    "classify_mcp_error",
    "remote_answer",
    "remote_side_effects",
    "remote_tool_error",
]

_INVALID_PARAMS = -32602
_METHOD_NOT_FOUND = -32601
_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001


def remote_side_effects(annotations: types.ToolAnnotations | None, override: bool | None) -> bool:
    """Whether calls of a remote tool must run at most once per idempotency key.

    A read-only tool has none; an idempotent tool that does not destroy may run
    twice harmlessly; anything else may write, and MCP's own defaults for absent
    hints (not read-only, destructive, not idempotent) say so too.
    """
    if override is not None:
        return override
    if annotations is None:
        return True
    if annotations.read_only_hint:
        return False
    return not (annotations.idempotent_hint and annotations.destructive_hint is False)


@dataclass
class HttpStatus:
    """The last HTTP response of a call, seen by the transport's response hook.

    The SDK reports any error status as a JSON-RPC internal error; the status
    and Retry-After decide whether the failure is transient, so the hook keeps them.
    """

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


def classify_mcp_error(
    exc: BaseException, http: HttpStatus, *, listed: bool, url: str, now: float
) -> ToolException:
    """What a failed remote call means for retries, breakers and the model.

    ``listed`` is whether the server still lists the tool, which tells an
    unknown tool from bad arguments (MCP reports both as invalid params).
    """
    if isinstance(exc, MCPError):
        return _classify_protocol(exc, http, listed=listed, url=url, now=now)
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return ToolTimeoutError(
            f"the MCP server did not answer in time ({type(exc).__name__})",
            suggestion="The service was too slow; try again later or narrow the request.",
        )
    if isinstance(
        exc,
        httpx2.TransportError
        | OSError
        | anyio.ClosedResourceError
        | anyio.BrokenResourceError
        | anyio.EndOfStream,
    ):
        return _connection_error(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return classify_mcp_error(exc.exceptions[0], http, listed=listed, url=url, now=now)
    return _connection_error(f"the MCP session failed: {type(exc).__name__}: {exc}")


def _connection_error(message: str) -> ToolConnectionError:
    return ToolConnectionError(
        f"could not reach the MCP server: {message}",
        suggestion="The service is unreachable; try again later or use another source.",
    )


def _classify_protocol(
    exc: MCPError, http: HttpStatus, *, listed: bool, url: str, now: float
) -> ToolException:
    code = exc.code
    if code == _INVALID_PARAMS:
        if not listed:
            return UnknownToolError(
                f"the MCP server has no such tool any more: {exc.message}",
                suggestion="Choose another tool from the current list.",
            )
        return InvalidArgumentsError(
            f"the MCP server refused the arguments: {exc.message}",
            suggestion="Fix the arguments named above and call the tool again.",
            details={"data": exc.data} if exc.data is not None else None,
        )
    if code == _METHOD_NOT_FOUND:
        return ClientError(f"the MCP server does not serve tools/call: {exc.message}")
    if code == _REQUEST_TIMEOUT:
        return ToolTimeoutError(f"the MCP request timed out: {exc.message}")
    if code == _CONNECTION_CLOSED:
        return _connection_error(exc.message)
    if http.status == 404:
        # streamable HTTP's answer to a session id the server no longer knows (it restarted)
        return _connection_error(f"the MCP session is gone ({exc.message}); opening a new one")
    if http.status is not None and http.status >= 400:
        found = classify_response(http.status, http.headers, exc.message, url, now)
        if found is not None:
            return found
    return UnavailableError(
        f"the MCP server failed to answer: {exc.message} (JSON-RPC error {code})",
        suggestion="The service is failing for now; try again later or use another source.",
    )


def remote_tool_error(result: types.CallToolResult) -> ToolException:
    text = " ".join(
        block.text for block in result.content if isinstance(block, types.TextContent)
    ).strip()
    return ToolException(
        text or "the remote tool reported an error without a message",
        suggestion="The tool itself reported this failure; change the request rather than "
        "repeating it.",
        details={"remote": True},
    )


def remote_answer(result: types.CallToolResult) -> Any:
    """What the model sees of a remote success: the structured result, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if len(texts) == len(result.content):
        return "\n".join(texts)
    return [block.model_dump(mode="json", by_alias=True) for block in result.content]
