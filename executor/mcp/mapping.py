"""Pure translations between toolexec's catalog and results and MCP's shapes.

The MCP front (``toolexec.mcp.server``) is thin I/O around these functions: a
catalog entry becomes a ``Tool`` with annotations taken from its policy, a
:class:`~toolexec.results.ToolResult` becomes a ``CallToolResult`` whose text is
exactly what an OpenAI tool message would carry, and the run id and deadline of
a call are decided from the session and the request's ``_meta``. Keeping them
free of sessions and Redis lets the unit tests pin every rule down.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from toolexec.content import blocks_of
from toolexec.errors import ErrorType, UsageError
from toolexec.fairness import Lane
from toolexec.resources import is_template, match_uri
from toolexec.results import ErrorInfo, ToolResult

__all__ = [
    "FAIRNESS_KEY_META",
    "JSON_SCHEMA_2020_12",
    "PAYLOAD_TEMPLATE",
    "PRIORITY_META",
    "READ_PAYLOAD",
    "RESOURCE_NOT_FOUND",
    "RESULT_META",
    "RUN_ID_HEADER",
    "RUN_ID_META",
    "TIMEOUT_META",
    "annotations_for",
    "call_timeout",
    "cancelled_result",
    "catalog_fingerprint",
    "checked_run_id",
    "lane_for",
    "model_body",
    "output_schema",
    "payload_page_of",
    "payload_template",
    "read_payload_arguments",
    "read_payload_tool",
    "read_resource_result",
    "render_blocks",
    "resource_target",
    "run_id_for",
    "to_call_result",
    "to_resource",
    "to_template",
    "to_tool",
    "with_dialect",
]

#: The extra tool the front serves beside the catalog, to page through offloaded results.
READ_PAYLOAD = "read_payload"

#: ``_meta`` keys a client may send with ``tools/call``: the agent run the call belongs
#: to (the run guard counts per run), and how long the client itself will wait, in
#: seconds (MCP has no standard field for a request timeout).
RUN_ID_META = "toolexec/run_id"
TIMEOUT_META = "toolexec/timeout_s"
#: The call's fairness key and priority (``toolexec.fairness``): a front serving many
#: tenants passes each one's id so that none waits behind another's backlog.
FAIRNESS_KEY_META = "toolexec/fairness_key"
PRIORITY_META = "toolexec/priority"

#: The HTTP header a client may set once on its connection to name the run all its calls
#: belong to; ``_meta``'s ``toolexec/run_id`` still wins for a single call.
RUN_ID_HEADER = "toolexec-run-id"

_MAX_RUN_ID = 200


def annotations_for(policy: Mapping[str, Any]) -> types.ToolAnnotations:
    """What a client may assume about a tool, from the policy the workers published.

    A tool without side effects is read-only. A side-effecting one may destroy
    (toolexec cannot know it does not), and it is idempotent: its calls carry an
    idempotency key derived from the run, the tool and the arguments, so the same
    call made twice in one run has the effect once (``toolexec.idempotency``).
    """
    writes = bool(policy.get("side_effects"))
    if not writes:
        return types.ToolAnnotations(read_only_hint=True)
    return types.ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)


#: What ``structuredContent`` holds: what the model reads (``ToolResult.for_model``), not
#: the call record. Clients such as pydantic-ai hand structuredContent to the model, so
#: ids, timings and nulls would cost tokens and say nothing; the record is in ``_meta``.
_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "description": "The error's kind, e.g. not_found."},
        "message": {"type": "string"},
        "suggestion": {"type": "string", "description": "What to do about it."},
        "retryable": {"type": "boolean"},
        "retry_after": {"type": "number"},
        "details": {"type": "object"},
    },
    "required": ["type", "message"],
}

_MODEL_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"enum": ["ok", "error", "unknown"]},
        "data": {"description": "The tool's answer (a preview when payload is set)."},
        "error": _ERROR_SCHEMA,
        "degraded": {"type": "boolean"},
        "source": {"type": ["string", "null"]},
        "fallback": {"type": "object"},
        "replayed": {"type": "boolean"},
        "attempts": {"type": "integer"},
        "guard": {"type": "object", "description": "The run guard's hint, when it gave one."},
        "payload": {
            "type": "object",
            "description": "Where the whole value is, when data is a preview of it.",
        },
    },
    "required": ["status"],
}

#: Result ``_meta`` key holding the whole call record (the ToolResult as JSON).
RESULT_META = "toolexec/result"

_RETURNS_DEFS = "returns."


def output_schema(returns: Mapping[str, Any] | None) -> dict[str, Any]:
    """The schema of what the model reads, with ``data`` held to the tool's return type.

    ``data`` is the tool's own value only for a plain success: an error has none,
    an offloaded result carries a preview, and a degraded one may come from
    another tool. So the return type applies under ``if`` status is ok and neither
    ``degraded`` nor ``payload`` is there. The return type's ``$defs`` move into the
    schema's under a prefix, so a tool returning its own ``ErrorInfo`` cannot collide.
    """
    schema: dict[str, Any] = json.loads(json.dumps(_MODEL_BODY_SCHEMA))
    if not returns:
        return schema
    text = json.dumps(dict(returns)).replace('"#/$defs/', f'"#/$defs/{_RETURNS_DEFS}')
    data: dict[str, Any] = json.loads(text)
    for name, definition in (data.pop("$defs", None) or {}).items():
        schema.setdefault("$defs", {})[f"{_RETURNS_DEFS}{name}"] = definition
    plain_success = {
        "properties": {"status": {"const": "ok"}},
        "required": ["status"],
        "not": {"anyOf": [{"required": ["degraded"]}, {"required": ["payload"]}]},
    }
    schema["allOf"] = [{"if": plain_success, "then": {"properties": {"data": data}}}]
    return schema


#: The dialect toolexec's schemas are written in (pydantic emits 2020-12), and MCP's default.
JSON_SCHEMA_2020_12 = "https://json-schema.org/draft/2020-12/schema"


def with_dialect(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with ``$schema`` declared: a tool's own declaration is kept as it is.

    MCP (2025-11-25) takes schemas without ``$schema`` as 2020-12, but a client
    validating with another default would read ``$defs`` and ``prefixItems`` wrongly.
    """
    declared = dict(schema)
    declared.setdefault("$schema", JSON_SCHEMA_2020_12)
    return declared


def to_tool(name: str, entry: Mapping[str, Any]) -> types.Tool:
    """A catalog entry as an MCP tool; ``outputSchema`` describes the ToolResult it returns."""
    policy = entry.get("policy") or {}
    return types.Tool(
        name=name,
        description=entry.get("description") or name,
        input_schema=with_dialect(entry["parameters"]),
        output_schema=output_schema(entry.get("returns")),
        annotations=annotations_for(policy),
    )


def read_payload_tool() -> types.Tool:
    """``read_payload``: the model pages through a result too large to be shown whole."""
    return types.Tool(
        name=READ_PAYLOAD,
        description=(
            "Read part of a large tool result that was stored instead of shown. Pass the "
            "payload key from the result's preview; offset and limit count lines (text), "
            "items (arrays) or keys (objects). The answer says where to read on."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "key": {"type": "string", "minLength": 1, "maxLength": 512},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
            },
            "required": ["key"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    )


def read_payload_arguments(arguments: Mapping[str, Any]) -> tuple[str, int, int] | str:
    """``read_payload``'s key, offset and limit, or why they cannot be used.

    They come from a model, so they are checked here as the schema says, before
    any store is asked.
    """
    key = arguments.get("key")
    offset, limit = arguments.get("offset", 0), arguments.get("limit", 100)
    if not isinstance(key, str) or not 0 < len(key) <= 512:
        return "read_payload needs key: the payload key quoted in the result's preview"
    if not (_whole(offset) and _whole(limit)):
        return "read_payload's offset and limit are whole numbers"
    if offset < 0 or not 1 <= limit <= 1000:
        return "read_payload needs offset >= 0 and a limit from 1 to 1000"
    return key, offset, limit


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def catalog_fingerprint(catalog: Mapping[str, Mapping[str, Any]]) -> tuple[Any, ...]:
    """What a client's tool list depends on: a change here is a ``list_changed``.

    Policies change what annotations say; the heartbeat republishing the same
    catalog changes nothing here, so it never notifies.
    """
    return tuple(
        (
            name,
            entry.get("description"),
            repr(entry.get("parameters")),
            bool((entry.get("policy") or {}).get("side_effects")),
        )
        for name, entry in sorted(catalog.items())
    )


def _meta_value(meta: Mapping[str, Any] | None, key: str) -> Any:
    return None if meta is None else meta.get(key)


def checked_run_id(given: Any) -> str | None:
    """A run id from a client (``_meta`` or a header), or None when it is not usable."""
    if isinstance(given, str) and 0 < len(given) <= _MAX_RUN_ID and given.isprintable():
        return given
    return None


def run_id_for(meta: Mapping[str, Any] | None, session_run_id: str) -> str:
    """The client's own run id from ``_meta`` when it gives a usable one, else the session's."""
    return checked_run_id(_meta_value(meta, RUN_ID_META)) or session_run_id


def lane_for(meta: Mapping[str, Any] | None) -> Lane | str:
    """The call's lane from ``_meta``, or why it cannot be used (the values come from outside)."""
    try:
        return Lane.of(_meta_value(meta, FAIRNESS_KEY_META), _meta_value(meta, PRIORITY_META))
    except UsageError as exc:
        return f"_meta {FAIRNESS_KEY_META} / {PRIORITY_META}: {exc}"


def call_timeout(meta: Mapping[str, Any] | None, server_timeout: float) -> float:
    """The call's deadline in seconds: the server's setting, capped by the client's own wait.

    A client that gives up after 10 s gains nothing from a call that retries for
    60; the number comes from outside, so anything but a positive finite number
    of seconds is ignored.
    """
    given = _meta_value(meta, TIMEOUT_META)
    if isinstance(given, bool) or not isinstance(given, int | float):
        return server_timeout
    seconds = float(given)
    if not math.isfinite(seconds) or seconds <= 0:
        return server_timeout
    return min(server_timeout, seconds)


def _payload_note(result: ToolResult) -> dict[str, Any] | None:
    if result.payload is None:
        return None
    return {
        "key": result.payload.key,
        "unit": result.payload.unit,
        "count": result.payload.count,
        "read_with": READ_PAYLOAD,
    }


def _result_meta(result: ToolResult) -> dict[str, Any]:
    """The call record, and flags a client can read without parsing: degraded, offloaded."""
    meta: dict[str, Any] = {RESULT_META: result.model_dump(mode="json")}
    if result.degraded:
        meta["toolexec/degraded"] = True
        meta["toolexec/source"] = result.source
    payload = _payload_note(result)
    if payload is not None:
        meta["toolexec/payload"] = payload
    return meta


def model_body(result: ToolResult, note: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the model should read of a result: ``for_model``, the guard's note, the payload."""
    body = result.for_model()
    if note:
        body["guard"] = dict(note)
    payload = _payload_note(result)
    if payload is not None:
        body["payload"] = payload
    return body


def to_call_result(
    result: ToolResult, note: Mapping[str, Any] | None = None
) -> types.CallToolResult:
    """A ToolResult as MCP's CallToolResult: the model's view as text and structured content.

    The text is what an OpenAI tool message would carry (``content()``), with the run
    guard's nudge when it gave one; ``structuredContent`` is the same as an object (a
    client that hands it to the model spends no tokens on ids and timings), and the
    whole call record is in ``_meta["toolexec/result"]``. Every status but ``ok`` is an
    error (``unknown`` too: the model must not assume a write happened).
    """
    body = model_body(result, note)
    blocks = blocks_of(result.data) if result.status == "ok" and result.payload is None else None
    text = types.TextContent(text=json.dumps(body, ensure_ascii=False, default=str))
    return types.CallToolResult(
        content=render_blocks(blocks) if blocks else [text],
        structured_content=body,
        is_error=result.status != "ok",
        _meta=_result_meta(result),
    )


def _block(raw: Mapping[str, Any]) -> types.ContentBlock:
    kind = raw["type"]
    if kind == "image":
        return types.ImageContent(data=str(raw.get("data", "")), mime_type=str(raw["mimeType"]))
    if kind == "audio":
        return types.AudioContent(data=str(raw.get("data", "")), mime_type=str(raw["mimeType"]))
    if kind == "resource":
        uri, mime = str(raw["uri"]), str(raw.get("mimeType") or "text/plain")
        contents: types.TextResourceContents | types.BlobResourceContents
        if raw.get("blob") is not None:
            contents = types.BlobResourceContents(uri=uri, mime_type=mime, blob=str(raw["blob"]))
        else:
            contents = types.TextResourceContents(
                uri=uri, mime_type=mime, text=str(raw.get("text") or "")
            )
        return types.EmbeddedResource(resource=contents)
    return types.TextContent(text=str(raw.get("text", "")))


def render_blocks(blocks: list[dict[str, Any]]) -> list[types.ContentBlock]:
    """A rich result's blocks (``toolexec.content``) as MCP content, in their order."""
    return [_block(raw) for raw in blocks]


def cancelled_result(
    *,
    tool: str,
    call_id: str,
    run_id: str | None,
    side_effects: bool,
    elapsed_s: float,
) -> ToolResult:
    """The outcome of a call the MCP client cancelled: the same as a deadline reached now.

    No further attempt starts (the front revokes the call), but an attempt that
    was running may still finish; for a tool that writes, that means the write
    may or may not have happened, so the status is ``unknown``, never ``error``.
    """
    message = f"the client cancelled the call after {elapsed_s:.1f} s; no further attempt starts"
    if side_effects:
        suggestion = (
            "The write may or may not have happened. Check its effect before calling again; "
            "the same call in the same run is answered from its idempotency record."
        )
    else:
        suggestion = "Call the tool again if its result is still needed."
    return ToolResult(
        status="unknown" if side_effects else "error",
        tool=tool,
        call_id=call_id,
        run_id=run_id,
        error=ErrorInfo(
            type=ErrorType.DEADLINE_EXCEEDED,
            message=message,
            suggestion=suggestion,
            retryable=not side_effects,
            details={"cancelled": True},
        ),
        elapsed_ms=round(elapsed_s * 1000.0, 3),
    )


#: The JSON-RPC error for an unknown resource URI (MCP 2025-06-18 and 2025-11-25).
RESOURCE_NOT_FOUND = -32002


def to_resource(entry: Mapping[str, Any]) -> types.Resource | None:
    """A catalog entry's resource (``toolexec.resources``); None for a template or a tool."""
    declared = entry.get("resource")
    if not isinstance(declared, Mapping) or is_template(str(declared.get("uri", ""))):
        return None
    return types.Resource(
        uri=str(declared["uri"]),
        name=str(declared.get("name") or declared["uri"]),
        description=declared.get("description"),
        mime_type=declared.get("mimeType"),
    )


def to_template(entry: Mapping[str, Any]) -> types.ResourceTemplate | None:
    """A catalog entry's resource template; None for a plain resource or a tool."""
    declared = entry.get("resource")
    if not isinstance(declared, Mapping) or not is_template(str(declared.get("uri", ""))):
        return None
    return types.ResourceTemplate(
        uri_template=str(declared["uri"]),
        name=str(declared.get("name") or declared["uri"]),
        description=declared.get("description"),
        mime_type=declared.get("mimeType"),
    )


def resource_target(
    entries: Mapping[str, Mapping[str, Any]], uri: str
) -> tuple[str, dict[str, str], str] | None:
    """The reader of ``uri``: its tool name, arguments and MIME type; None when none serves it.

    A plain resource's exact URI wins over a template that also matches it.
    """
    templates = []
    for name, entry in sorted(entries.items()):
        declared = entry.get("resource") or {}
        mime = str(declared.get("mimeType") or "text/plain")
        declared_uri = str(declared.get("uri", ""))
        if declared_uri == uri and not is_template(declared_uri):
            return name, {}, mime
        templates.append((name, declared_uri, mime))
    for name, template, mime in templates:
        found = match_uri(template, uri) if is_template(template) else None
        if found is not None:
            return name, found, mime
    return None


def read_resource_result(uri: str, mime_type: str, data: Any) -> types.ReadResourceResult:
    """What a reader returned as ``resources/read``'s contents: text, or a blob it built."""
    blocks = blocks_of(data)
    if blocks is None and isinstance(data, Mapping) and data.get("type") == "resource":
        blocks = [dict(data)]  # a reader that returned one toolexec.content.Resource
    if blocks:
        contents: list[types.TextResourceContents | types.BlobResourceContents] = []
        for block in blocks:
            mime = str(block.get("mimeType") or mime_type)
            if block.get("blob") is not None:
                contents.append(
                    types.BlobResourceContents(uri=uri, mime_type=mime, blob=str(block["blob"]))
                )
            else:
                text = block.get("text")
                contents.append(types.TextResourceContents(uri=uri, mime_type=mime, text=str(text)))
        return types.ReadResourceResult(contents=contents)
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type=mime_type, text=text)]
    )


#: Stored payloads (offloaded results) as resources: one page of a payload per read.
PAYLOAD_TEMPLATE = "toolexec://payload/{key}"
_PAYLOAD_PREFIX = "toolexec://payload/"


def payload_template() -> types.ResourceTemplate:
    return types.ResourceTemplate(
        uri_template=PAYLOAD_TEMPLATE + "{?offset,limit}",
        name="payload",
        description=(
            "A page of a large tool result that was stored instead of shown: the payload "
            "key from the result's preview; offset and limit count lines (text), items "
            "(arrays) or keys (objects). The same as the read_payload tool."
        ),
        mime_type="application/json",
    )


def payload_page_of(uri: str) -> tuple[str, int, int] | str | None:
    """The payload key, offset and limit a payload URI asks for; why not; None: not one.

    ``toolexec://payload/KEY?offset=0&limit=100``; the numbers come from a client, so
    they are checked as ``read_payload``'s are.
    """
    if not uri.startswith(_PAYLOAD_PREFIX):
        return None
    from urllib.parse import parse_qs, unquote, urlsplit

    parts = urlsplit(uri)
    key = unquote(parts.path.lstrip("/")) if parts.netloc == "payload" else ""
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    arguments: dict[str, Any] = {"key": key}
    for name in ("offset", "limit"):
        if name in query:
            if not query[name].isdigit() or len(query[name]) > 9:
                return f"{name} must be a whole number"
            arguments[name] = int(query[name])
    return read_payload_arguments(arguments)
