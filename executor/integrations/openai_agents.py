"""toolexec's tools as the OpenAI Agents SDK's ``FunctionTool``.

Installed with ``pip install toolexec[openai-agents]``.

::

    agent = Agent(name="helper", tools=function_tools(client))

Each tool's schema is the catalog's in strict form (``toolexec.strict``), the SDK's
default: the model's arguments are turned back into the catalog's shape before the
call. The call goes through ``client.acall``, so toolexec validates, queues, retries
and guards it, and the model reads ``ToolResult.content()`` whatever happened: an
error is a result it can act on, never an exception that ends the run (only Redis or
the broker being unreachable raises, and the SDK reports that to the model).

The run id, when none is given, is the run's own: ``run_id`` of the context object
passed to ``Runner.run(..., context=...)`` (an attribute or a key), else the run
config's ``trace_id``, else one id per run (the SDK builds a ``RunConfig`` per run).

The lane (docs/guides/fairness.md): ``fairness_key=`` and ``priority=`` given here
apply to every call; without a key, the context object's ``fairness_key`` (an
attribute or a key) names the run's tenant, else the run's own (the run guard's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agents import FunctionTool, RunContextWrapper
from agents.tool_context import ToolContext

from toolexec.integrations.common import (
    Lane,
    RunIds,
    decoded,
    fairness_key_in,
    run_id_in,
    selected,
)
from toolexec.stores.catalog import CatalogEntry
from toolexec.strict import from_strict, strict_or_none

if TYPE_CHECKING:
    from toolexec.client import ToolClient

__all__ = ["function_tools", "run_id_of"]

_RUNS = RunIds("agents")


def run_id_of(ctx: RunContextWrapper[Any]) -> str | None:
    """The run id of the SDK run a tool is called in (see the module's docstring)."""
    given = run_id_in(ctx.context)
    if given is not None:
        return given
    config = ctx.run_config if isinstance(ctx, ToolContext) else None
    if config is None:
        return None
    trace_id = run_id_in({"run_id": config.trace_id}) if config.trace_id else None
    return trace_id or _RUNS.of(config)


def function_tools(
    client: ToolClient,
    *,
    run_id: str | None = None,
    names: Iterable[str] | None = None,
    strict: bool = True,
    approve_writes: bool = False,
    fairness_key: str | None = None,
    priority: int | None = None,
) -> list[FunctionTool]:
    """The catalog's tools (all, or ``names``) as ``FunctionTool`` objects.

    ``run_id`` puts every call under that run's guard; by default each SDK run is a
    run of its own. ``strict=False`` sends the catalog's schemas as they are.
    ``approve_writes`` sets the SDK's ``needs_approval`` on tools declared with
    ``side_effects=True``, so the run pauses for a human before each write.
    A tool whose schema has no strict form (a remote MCP tool's, say) is offered
    non-strict rather than left out. ``fairness_key`` and ``priority`` choose the
    calls' lane (checked here, so a bad value fails before the agent runs).
    """
    lane = Lane.of(fairness_key, priority)
    return [
        _function_tool(client, name, entry, run_id, strict, approve_writes, lane)
        for name, entry in selected(client, names)
    ]


def _function_tool(
    client: ToolClient,
    name: str,
    entry: CatalogEntry,
    run_id: str | None,
    strict: bool,
    approve_writes: bool,
    lane: Lane,
) -> FunctionTool:
    original = entry["parameters"]
    converted = strict_or_none(original) if strict else None
    is_strict = converted is not None

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        arguments = decoded(raw)
        if is_strict:
            arguments = from_strict(arguments, original)
        result = await client.acall(
            name,
            arguments,
            run_id=run_id or run_id_of(ctx),
            fairness_key=lane.fairness_key or fairness_key_in(ctx.context),
            priority=lane.priority,
        )
        return result.content()

    writes = bool((entry.get("policy") or {}).get("side_effects"))
    return FunctionTool(
        name=name,
        description=entry["description"],
        params_json_schema=converted or original,
        on_invoke_tool=invoke,
        strict_json_schema=is_strict,
        needs_approval=approve_writes and writes,
    )
