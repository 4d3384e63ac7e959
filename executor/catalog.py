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

if TYPE_CHECKING:  # only publish's signature: a client reads the catalog without tool code
    from toolexec.registry import ToolSpec

__all__ = [
    "Catalog",
    "CatalogEntry",
    "CatalogPolicy",
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


def to_definitions(
    catalog: Catalog, fmt: Literal["openai", "anthropic"] = "openai"
) -> list[dict[str, Any]]:
    """Tool definitions ready for a chat-completions or Messages API request."""
    out = []
    for name in sorted(catalog):
        entry = catalog[name]
        if fmt == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": entry["description"],
                        "parameters": entry["parameters"],
                    },
                }
            )
        elif fmt == "anthropic":
            out.append(
                {
                    "name": name,
                    "description": entry["description"],
                    "input_schema": entry["parameters"],
                }
            )
        else:
            raise ValueError(f"unknown format {fmt!r}; use 'openai' or 'anthropic'")
    return out
