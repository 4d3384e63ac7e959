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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict

from toolexec.integrations.common import run_id_in, selected
from toolexec.results import ToolResult
from toolexec.strict import from_strict, strict_or_none

if TYPE_CHECKING:
    from toolexec.client import ToolClient

__all__ = ["ToolexecTool", "run_id_of", "tools"]


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


class ToolexecTool(BaseTool):
    """One catalog tool; call it as any LangChain tool, sync or async."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any
    tool_run_id: str | None = None
    catalog_schema: dict[str, Any]
    strict: bool = False
    response_format: str = "content_and_artifact"  # type: ignore[assignment]

    def _arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return from_strict(kwargs, self.catalog_schema) if self.strict else kwargs

    def _run(
        self,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> tuple[str, ToolResult]:
        run_id = self.tool_run_id or run_id_of(config, run_manager)
        result: ToolResult = self.client.call(self.name, self._arguments(kwargs), run_id=run_id)
        return result.content(), result

    async def _arun(
        self,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> tuple[str, ToolResult]:
        run_id = self.tool_run_id or run_id_of(config, run_manager)
        result: ToolResult = await self.client.acall(
            self.name, self._arguments(kwargs), run_id=run_id
        )
        return result.content(), result


def tools(
    client: ToolClient,
    *,
    run_id: str | None = None,
    names: Iterable[str] | None = None,
    strict: bool = False,
) -> list[BaseTool]:
    """The catalog's tools (all, or ``names``) as LangChain tools.

    ``strict=True`` gives each its strict-mode schema (``toolexec.strict``), for
    ``bind_tools(..., strict=True)``; the arguments are turned back before the call.
    """
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
            )
        )
    return built
