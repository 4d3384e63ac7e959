"""toolexec's tools as LangChain tools (``pip install toolexec[langchain]``).

::

    model = chat_model.bind_tools(tools(client))
    ...
    message = tool.invoke(tool_call, config={"metadata": {"run_id": "r-1"}})

Each tool is a :class:`~langchain_core.tools.BaseTool` with the catalog's JSON Schema
as its ``args_schema``, sync (``client.call``) and async (``client.acall``). Its
``response_format`` is ``content_and_artifact``: the ``ToolMessage`` the model reads
holds ``ToolResult.content()``, and its ``artifact`` the whole :class:`ToolResult`.
Errors are results too, so LangChain's ``handle_tool_error`` never fires for them;
only Redis or the broker being unreachable raises.

The run id, when none is given, comes from the run config: ``run_id`` in its
``configurable`` or ``metadata``, else ``configurable["thread_id"]`` (LangGraph's
conversation), else the parent run's id (the agent chain that called the tool).
A tool invoked with none of these runs unguarded.

The lane (docs/guides/fairness.md): ``fairness_key=`` and ``priority=`` given to
:func:`tools` apply to every call; without a key, ``fairness_key`` in the run
config's ``configurable`` or ``metadata`` names the tenant, else the run's own
(the run guard's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict

from toolexec.fairness import Lane
from toolexec.integrations.common import fairness_key_in, run_id_in, selected
from toolexec.results import ToolResult
from toolexec.strict import from_strict, strict_or_none

if TYPE_CHECKING:
    from toolexec.client import ToolClient

__all__ = ["ToolexecTool", "fairness_key_of", "run_id_of", "tools"]


def run_id_of(
    config: Mapping[str, Any] | None,
    run_manager: CallbackManagerForToolRun | AsyncCallbackManagerForToolRun | None = None,
) -> str | None:
    """The run id a LangChain run config names (see the module's docstring)."""
    config = config or {}
    configurable = config.get("configurable") or {}
    for found in (
        run_id_in(configurable),
        run_id_in(config.get("metadata") or {}),
        run_id_in({"run_id": configurable.get("thread_id")}),
    ):
        if found is not None:
            return found
    parent = getattr(run_manager, "parent_run_id", None)
    return run_id_in({"run_id": parent}) if parent is not None else None


def fairness_key_of(config: Mapping[str, Any] | None) -> str | None:
    """The fairness key a LangChain run config names (``configurable``, else ``metadata``)."""
    config = config or {}
    return fairness_key_in(config.get("configurable") or {}) or fairness_key_in(
        config.get("metadata") or {}
    )


class ToolexecTool(BaseTool):
    """One catalog tool; call it as any LangChain tool, sync or async."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any
    tool_run_id: str | None = None
    catalog_schema: dict[str, Any]
    strict: bool = False
    fairness_key: str | None = None
    priority: int | None = None
    response_format: str = "content_and_artifact"  # type: ignore[assignment]

    def _arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return from_strict(kwargs, self.catalog_schema) if self.strict else kwargs

    def _lane(self, config: RunnableConfig) -> dict[str, Any]:
        return {
            "fairness_key": self.fairness_key or fairness_key_of(config),
            "priority": self.priority,
        }

    def _run(
        self,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> tuple[str, ToolResult]:
        run_id = self.tool_run_id or run_id_of(config, run_manager)
        result: ToolResult = self.client.call(
            self.name, self._arguments(kwargs), run_id=run_id, **self._lane(config)
        )
        return result.content(), result

    async def _arun(
        self,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> tuple[str, ToolResult]:
        run_id = self.tool_run_id or run_id_of(config, run_manager)
        result: ToolResult = await self.client.acall(
            self.name, self._arguments(kwargs), run_id=run_id, **self._lane(config)
        )
        return result.content(), result


def tools(
    client: ToolClient,
    *,
    run_id: str | None = None,
    names: Iterable[str] | None = None,
    strict: bool = False,
    fairness_key: str | None = None,
    priority: int | None = None,
) -> list[BaseTool]:
    """The catalog's tools (all, or ``names``) as LangChain tools.

    ``strict=True`` gives each its strict-mode schema (``toolexec.strict``), for
    ``bind_tools(..., strict=True)``; the arguments are turned back before the call.
    ``fairness_key`` and ``priority`` choose the calls' lane (checked here).
    """
    lane = Lane.of(fairness_key, priority)
    built: list[BaseTool] = []
    for name, entry in selected(client, names):
        converted = strict_or_none(entry["parameters"]) if strict else None
        built.append(
            ToolexecTool(
                name=name,
                description=entry["description"],
                args_schema=converted or entry["parameters"],
                client=client,
                tool_run_id=run_id,
                catalog_schema=entry["parameters"],
                strict=converted is not None,
                fairness_key=lane.fairness_key,
                priority=lane.priority,
            )
        )
    return built
