"""toolexec's tools as a pydantic-ai toolset (``pip install toolexec[pydantic-ai]``).

::

    agent = Agent(model, toolsets=[toolset(client)])

The toolset lists the live catalog at each run step, so tools a worker adds appear
without a restart. Arguments are validated by toolexec against the catalog's schema
(pydantic-ai passes them through untouched), and every call goes through
``client.acall``; the model reads ``ToolResult.content()``, errors included, as the
tool's return. toolexec retries what is transient itself, so pydantic-ai's own retry
count (``ModelRetry``) is not used: an ``invalid_arguments`` result already tells the
model what to change.

The run id, when none is given, is pydantic-ai's: ``RunContext.run_id``, the
``run_id`` passed to ``Agent.run`` or a fresh one per run.

The lane (docs/guides/fairness.md): ``fairness_key=`` and ``priority=`` given here
apply to every call; without a key, the run's ``deps`` name the tenant
(``deps.fairness_key`` or ``deps["fairness_key"]``), else the run's own (the run guard's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic_ai import RunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from toolexec.integrations.common import Lane, fairness_key_in, run_id_in, selected
from toolexec.stores.catalog import CatalogEntry
from toolexec.strict import from_strict, strict_or_none

if TYPE_CHECKING:
    from toolexec.client import ToolClient

__all__ = ["ToolexecToolset", "toolset"]

#: toolexec validates against the catalog's schema, with errors written for the model;
#: pydantic-ai only has to hand the arguments on.
_PASS_THROUGH = SchemaValidator(schema=core_schema.any_schema())

#: Only arguments that are not JSON at all fail in pydantic-ai (toolexec never sees them):
#: one retry prompt lets the model send them again.
_RETRIES = 1


class ToolexecToolset(AbstractToolset[Any]):
    """The catalog's tools, called through a :class:`~toolexec.ToolClient`."""

    def __init__(
        self,
        client: ToolClient,
        *,
        run_id: str | None = None,
        names: Iterable[str] | None = None,
        strict: bool = False,
        id: str | None = "toolexec",
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.lane = Lane.of(fairness_key, priority)
        self.names = None if names is None else list(names)
        self.strict = strict
        self._id = id

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await asyncio.to_thread(selected, self.client, self.names)
        return {name: self._tool(name, entry) for name, entry in tools}

    def _tool(self, name: str, entry: CatalogEntry) -> ToolsetTool[Any]:
        converted = strict_or_none(entry["parameters"]) if self.strict else None
        schema, strict = (converted, True) if converted else (entry["parameters"], False)
        definition = ToolDefinition(
            name=name,
            description=entry["description"],
            parameters_json_schema=schema,
            strict=strict,
            metadata={"toolexec": {"schema": entry["parameters"], "strict": strict}},
        )
        return ToolsetTool(
            toolset=self, tool_def=definition, max_retries=_RETRIES, args_validator=_PASS_THROUGH
        )

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> str:
        meta = (tool.tool_def.metadata or {}).get("toolexec") or {}
        arguments: Any = tool_args
        if meta.get("strict"):
            arguments = from_strict(tool_args, meta["schema"])
        run_id = self.run_id or run_id_in(ctx)
        result = await self.client.acall(
            name,
            arguments,
            run_id=run_id,
            fairness_key=self.lane.fairness_key or fairness_key_in(ctx.deps),
            priority=self.lane.priority,
        )
        return result.content()


def toolset(
    client: ToolClient,
    *,
    run_id: str | None = None,
    names: Iterable[str] | None = None,
    strict: bool = False,
    fairness_key: str | None = None,
    priority: int | None = None,
) -> ToolexecToolset:
    """The catalog's tools (all, or ``names``) as a pydantic-ai toolset.

    ``strict=True`` gives each tool its strict-mode schema (``toolexec.strict``) and
    asks the provider for strict mode; by default the catalog's schema goes as it is,
    which every provider takes, and pydantic-ai decides. ``fairness_key`` and
    ``priority`` choose the calls' lane (see the module's docstring).
    """
    return ToolexecToolset(
        client,
        run_id=run_id,
        names=names,
        strict=strict,
        fairness_key=fairness_key,
        priority=priority,
    )
