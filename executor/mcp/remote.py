"""Remote MCP servers' tools as toolexec tools, behind the same defences.

A worker lists each declared server's tools (``toolexec.mcp.servers``) and
registers each as tool ``NAME.tool`` (Celery task ``tools.NAME.tool``) through
the registry's public API. From there on a remote tool is an ordinary tool: a
per-server policy (timeout, attempts, backoff, queue), one breaker shared by
the server's tools, ``side_effects`` from the remote annotations unless
overridden (an idempotency record per call), fallbacks, offloaded results. Its
arguments are checked against the remote JSON Schema field by field, and its
body is one call through the process's session to the server
(``toolexec.mcp.sessions``), whose failures ``toolexec.mcp.classify`` sorts:
an ``isError`` result is ``tool_error``; transport failures, HTTP 429/5xx and
timeouts are transient; a protocol error on the arguments is
``invalid_arguments``, or ``unknown_tool`` when the server no longer lists it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import jsonschema
import mcp_types as types
import pydantic

from toolexec.caller import asker
from toolexec.mcp.classify import remote_side_effects
from toolexec.mcp.servers import RemoteServer
from toolexec.mcp.sessions import Hub
from toolexec.registry import Registry, ToolSpec, default_registry

__all__ = ["arguments_model", "refresh", "register_servers"]

log = logging.getLogger("toolexec.mcp")

_REMOTE_TOOL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _value_checker(schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    validator = jsonschema.Draft202012Validator(dict(schema))

    def check(value: Any) -> Any:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            raise ValueError(errors[0].message)
        return value

    return check


def arguments_model(
    qualified: str, schema: Mapping[str, Any]
) -> tuple[type[pydantic.BaseModel], dict[str, str]]:
    """A pydantic model that checks arguments against a remote tool's JSON Schema.

    The worker validates with pydantic (the authority); each property becomes a
    field checked against its own subschema, so a failure names the field.
    Fields get safe Python names, aliased to the remote names, and the model
    reports the remote schema itself, which the catalog publishes.
    """
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    for index, (remote, subschema) in enumerate(properties.items()):
        python = f"arg{index}"
        names[python] = remote
        checker = pydantic.AfterValidator(_value_checker(subschema or {}))
        default = ... if remote in required else None
        fields[python] = (Annotated[Any, checker], pydantic.Field(default=default, alias=remote))
    published = copy.deepcopy(dict(schema))
    published.pop("title", None)

    class _Remote(pydantic.BaseModel):
        # dumped under the remote names: idempotency records and retries carry those
        model_config = pydantic.ConfigDict(extra="forbid", serialize_by_alias=True)

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(published)

    model = pydantic.create_model(f"{qualified}_arguments", __base__=_Remote, **fields)
    return model, names


def _body(server: RemoteServer, remote: str, names: Mapping[str, str]) -> Callable[..., Any]:
    """The tool body: one call through this process's session to ``server``."""

    async def call_remote(**kwargs: Any) -> Any:
        arguments = {names[k]: v for k, v in kwargs.items() if v is not None}
        hub = Hub.get()
        # the server's questions during the call go to this call's caller
        future = asyncio.run_coroutine_threadsafe(
            hub.call(server, remote, arguments, server.timeout, ask=asker()), hub.loop
        )
        return await asyncio.wrap_future(future)

    call_remote.__name__ = f"mcp_{server.name}_{remote}".replace(".", "_").replace("-", "_")
    call_remote.__qualname__ = call_remote.__name__
    call_remote.__module__ = __name__
    return call_remote


def _spec(server: RemoteServer, tool: types.Tool) -> ToolSpec:
    qualified = server.tool_name(tool.name)
    writes = remote_side_effects(tool.annotations, server.side_effects.get(tool.name))
    model, names = arguments_model(qualified, tool.input_schema)
    return ToolSpec(
        name=qualified,
        description=tool.description or tool.title or qualified,
        func=_body(server, tool.name, names),
        arguments=model,
        policy=server.policy(writes),
        returns=dict(tool.output_schema) if tool.output_schema else None,
    )


def _register_tools(
    server: RemoteServer, tools: Mapping[str, types.Tool], registry: Registry
) -> list[str]:
    done = []
    for name, tool in sorted(tools.items()):
        if not _REMOTE_TOOL.match(name):
            log.warning(
                "MCP server %s: skipping tool %r (not a usable tool name)", server.name, name
            )
            continue
        spec = _spec(server, tool)
        registry.register(spec)
        steps = server.fallbacks.get(name)
        if steps:
            registry.set_fallbacks(spec.name, steps)
        done.append(spec.name)
    return done


def _list(server: RemoteServer) -> dict[str, types.Tool]:
    hub = Hub.get()
    return hub.run(hub.session(server).list_tools(), server.timeout + 5.0)


def refresh(server: RemoteServer, registry: Registry | None = None) -> None:
    """Re-list a server's tools (it said they changed) and publish the new catalog."""
    try:
        names = _register_tools(server, _list(server), registry or default_registry)
    except Exception as exc:
        log.warning("could not re-list the tools of MCP server %s: %s", server.name, exc)
        return
    log.info("MCP server %s now has %d tools: %s", server.name, len(names), ", ".join(names))
    _publish_now()


def _publish_now() -> None:
    """Let the worker run the new tools, then publish the catalog that routes calls to them.

    Celery's consumer maps task names to handlers once, at start; a task added
    later must be added there too, or its messages are dropped as unregistered.
    """
    consumer = _worker.get("consumer")
    if consumer is None:
        return
    from toolexec.tasks.catalog_publisher import publish_catalog

    # the queues it consumes, which the catalog's liveness entries name
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = sorted({queue.name for queue in getattr(task_consumer, "queues", None) or ()})
    try:
        consumer.update_strategies()
        publish_catalog(consumer.app, consumer.hostname, queues)
    except Exception as exc:  # the heartbeat publishes it soon anyway
        log.warning("could not publish the catalog: %s", exc)


_worker: dict[str, Any] = {}


def _on_worker_ready(sender: Any, **_: Any) -> None:
    _worker["consumer"] = sender


def register_servers(
    servers: Sequence[RemoteServer],
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    registry: Registry | None = None,
) -> dict[str, str | None]:
    """List each server's tools and register them; called by the worker before it consumes.

    A server that cannot be listed now is not fatal: the worker starts with the
    others, and keeps trying that one in the background. Returns each server's
    queue (None: the default queue), which the worker consumes either way.
    """
    from celery import signals

    signals.worker_ready.connect(_on_worker_ready, weak=False)
    queues: dict[str, str | None] = {}
    for declared in servers:
        server = declared.configured((overrides or {}).get(declared.name, {}))
        queues[server.name] = server.queue
        try:
            tools = _list(server)
        except Exception as exc:
            log.warning(
                "MCP server %s cannot be listed now (%s: %s); retrying in the background",
                server.name,
                type(exc).__name__,
                exc,
            )
            threading.Thread(
                target=_keep_trying, args=(server,), name="toolexec-mcp-list", daemon=True
            ).start()
            continue
        _register_tools(server, tools, registry or default_registry)
    return queues


def _keep_trying(server: RemoteServer, every: float = 5.0) -> None:
    while True:
        time.sleep(every)
        try:
            tools = _list(server)
        except Exception:
            Hub.get().session(server).close()
            continue
        _register_tools(server, tools, default_registry)
        _publish_now()
        return
