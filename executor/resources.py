"""MCP resources a tools module declares, read on the workers like any tool call.

``@resource("docs://readme")`` makes a function the reader of one resource, and
``@resource("orders://{order_id}/summary")`` of every URI the template matches,
its placeholders passed as string arguments. The function is registered as a
tool whose catalog entry carries the URI (``ToolSpec.resource``): a read goes
through the queue, the workers' breakers, retries, deadlines and payloads like
any call, and models never see it among the tools.

A reader returns text (``str``), or :class:`toolexec.content.Resource` for
bytes (``Resource.from_bytes(uri, data, mime)``) or a MIME type of its own. The
URI matching is a pure function here, used by the MCP front.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from toolexec.errors import ConfigurationError
from toolexec.registry import Registry, ToolSpec, default_registry, tool

__all__ = ["is_template", "match_uri", "notify_updated", "resource", "template_names"]

F = TypeVar("F", bound=Callable[..., Any])

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def is_template(uri: str) -> bool:
    return _PLACEHOLDER.search(uri) is not None


def template_names(uri: str) -> list[str]:
    return _PLACEHOLDER.findall(uri)


def match_uri(template: str, uri: str) -> dict[str, str] | None:
    """The placeholders' values when ``uri`` matches ``template`` (RFC 6570 level 1), else None.

    A value never spans a ``/``, so ``a://{x}/b`` cannot match ``a://1/2/b``.
    """
    pattern, last = "", 0
    for found in _PLACEHOLDER.finditer(template):
        pattern += re.escape(template[last : found.start()]) + f"(?P<{found.group(1)}>[^/]+)"
        last = found.end()
    pattern += re.escape(template[last:])
    matched = re.fullmatch(pattern, uri)
    return None if matched is None else matched.groupdict()


def _tool_name(uri: str) -> str:
    """A tool name for the reader: readable, and unique per URI (a hash of it)."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", uri)[:40].strip("_")
    return f"resource_{slug}_{hashlib.sha256(uri.encode()).hexdigest()[:8]}"


def resource(
    uri: str,
    *,
    name: str | None = None,
    description: str | None = None,
    mime_type: str = "text/plain",
    timeout: float = 30.0,
    registry: Registry | None = None,
) -> Callable[[F], F]:
    """Register ``func`` as the reader of the resource (or template) ``uri``."""
    names = template_names(uri)

    def register(fn: F) -> F:
        scratch = Registry()
        tool(name=_tool_name(uri), description=description, timeout=timeout, registry=scratch)(fn)
        spec: ToolSpec = fn.__toolexec__  # type: ignore[attr-defined]
        params = set(spec.arguments.model_fields)
        if params != set(names):
            raise ConfigurationError(
                f"the reader of {uri!r} must take exactly its placeholders "
                f"({', '.join(names) or 'none'}), not ({', '.join(sorted(params)) or 'none'})"
            )
        declared: Mapping[str, Any] = {
            "uri": uri,
            "name": name or fn.__name__,
            "description": description or spec.description,
            "mimeType": mime_type,
        }
        spec = replace(spec, resource=dict(declared))
        (default_registry if registry is None else registry).register(spec)
        fn.__toolexec__ = spec  # type: ignore[attr-defined]
        return fn

    return register


def notify_updated(uri: str) -> int:
    """Tell the MCP clients subscribed to ``uri`` that it changed; call it from a tool body.

    Published on a Redis channel every ``toolexec mcp`` front listens to; each sends
    ``notifications/resources/updated`` to its sessions subscribed to the URI. Returns
    how many fronts heard it (0 outside a tool body: nothing is sent).
    """
    from toolexec.caller import current_line

    line = current_line()
    if line is None:
        return 0
    return int(line.client.publish(line.keys.resource_updates(), uri))
