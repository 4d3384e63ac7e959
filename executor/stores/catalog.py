"""The tool catalog: what workers can run, published to Redis for clients.

Clients validate and route calls from it without importing tool code, and
export the definitions in the shapes the OpenAI and Anthropic APIs take.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast

import redis

from toolexec.keys import Keys
from toolexec.strict import strict_or_none

if TYPE_CHECKING:  # only publish's signature: a client reads the catalog without tool code
    from toolexec.registry import ToolSpec

__all__ = [
    "Catalog",
    "CatalogEntry",
    "CatalogPolicy",
    "DefinitionFormat",
    "publish",
    "read",
    "to_definitions",
    "workers_seen",
]


class CatalogPolicy(TypedDict):
    """The part of a tool's policy a client acts on; workers publish the whole policy.

    Keys a client may meet missing were added after the first release: a worker
    that predates them publishes without them.
    """

    queue: str
    breaker: NotRequired[dict[str, Any]]
    breaker_key: NotRequired[str | None]
    fallbacks: NotRequired[list[Any]]
    #: The tool's default priority (``@tool(priority=...)``, toolexec.fairness).
    priority: NotRequired[int | None]
    #: The tool's cap on calls in flight (``@tool(max_in_flight=...)``, toolexec.transport.lanes).
    max_in_flight: NotRequired[int | None]


class CatalogEntry(TypedDict):
    """One published tool: what a client validates, routes and describes a call with.

    JSON in Redis (a worker of another version may have written it), so a
    TypedDict over the parsed document rather than a class that would copy it.
    """

    name: str
    task: str
    description: str
    parameters: dict[str, Any]
    policy: CatalogPolicy
    #: JSON Schema of the tool's return value, when its annotation says (toolexec.mcp).
    returns: NotRequired[dict[str, Any]]
    #: The MCP resource (or template) the function serves (toolexec.resources).
    resource: NotRequired[dict[str, Any]]


Catalog = dict[str, CatalogEntry]


def publish(
    client: redis.Redis,
    keys: Keys,
    specs: Iterable[ToolSpec],
    default_queue: str,
    worker: str,
    now: float,
    queues: Iterable[str] = (),
) -> int:
    """Write this worker's tools to the catalog and note the worker as alive.

    The queues it serves are noted in the same transaction, before anyone can
    see the worker, so no client finds it alive but serving nothing.
    """
    entries: dict[Any, str] = {
        spec.name: json.dumps(spec.catalog_entry(default_queue), sort_keys=True) for spec in specs
    }
    pipe = client.pipeline(transaction=True)
    if entries:
        pipe.hset(keys.catalog(), mapping=entries)
    for queue in queues:
        pipe.zadd(keys.queue_workers(queue), {worker: now})
    pipe.zadd(keys.workers(), {worker: now})
    pipe.execute()
    return len(entries)


def read(client: redis.Redis, keys: Keys) -> Catalog:
    """Every tool the workers have published, by name."""
    raw: dict[str, str] = client.hgetall(keys.catalog())  # type: ignore[assignment]
    return {name: cast(CatalogEntry, json.loads(entry)) for name, entry in raw.items()}


def workers_seen(client: redis.Redis, keys: Keys, since: float) -> list[str]:
    """Workers that published a heartbeat at or after ``since``."""
    found: list[str] = client.zrangebyscore(keys.workers(), since, "+inf")  # type: ignore[assignment]
    return found


DefinitionFormat = Literal["openai", "openai-responses", "anthropic"]
_FORMATS = ("openai", "openai-responses", "anthropic")


def to_definitions(
    catalog: Catalog, fmt: DefinitionFormat = "openai", *, strict: bool = False
) -> list[dict[str, Any]]:
    """Tool definitions ready for a Chat Completions, Responses or Messages API request.

    ``strict`` asks the OpenAI shapes for strict mode: each schema in its strict form
    (``toolexec.strict``). A tool whose published schema has none (a worker's remote
    MCP tool, say) is sent non-strict with its own schema; OpenAI takes a mix. The
    Responses API treats a tool without ``strict`` as strict, so that shape always says.
    """
    if fmt not in _FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(_FORMATS)}")
    if strict and fmt == "anthropic":
        raise ValueError("strict applies to the OpenAI shapes; Anthropic's has no strict flag")
    # a resource's reader is read by the MCP front, not called by a model (toolexec.resources)
    names = sorted(name for name, entry in catalog.items() if "resource" not in entry)
    return [_definition(name, catalog[name], fmt, strict) for name in names]


def _definition(
    name: str, entry: CatalogEntry, fmt: DefinitionFormat, strict: bool
) -> dict[str, Any]:
    if fmt == "anthropic":
        return {
            "name": name,
            "description": entry["description"],
            "input_schema": entry["parameters"],
        }
    converted = strict_or_none(entry["parameters"]) if strict else None
    parameters, is_strict = (converted, True) if converted else (entry["parameters"], False)
    function: dict[str, Any] = {
        "name": name,
        "description": entry["description"],
        "parameters": parameters,
    }
    if strict or fmt == "openai-responses":
        function["strict"] = is_strict
    if fmt == "openai-responses":
        return {"type": "function", **function}
    return {"type": "function", "function": function}
