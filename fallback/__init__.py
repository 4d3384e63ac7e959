"""Fallback chains for tools whose primary fails or whose breaker is open.

Declare a chain next to the tool::

    @tool(fallbacks=[Alternative("search_lite", arguments=lambda a: {"q": a["query"]}),
                     LastGood(ttl_s=3600),
                     Explain(instead="Answer from what you know and say so.")])
    def search(query: str, filters: dict[str, str] | None = None) -> list[dict]: ...

or later with ``default_registry.set_fallbacks("search", [...])``. Every answer
a chain gives is ``degraded`` with its ``source`` and the primary's error.
"""

from toolexec.fallback.cache import CachedResult, LastGoodCache, LastGoodLayer, cache_step
from toolexec.fallback.chain import Action, ChainRunner, Deliver, Lookup, Send
from toolexec.fallback.state import AGENT_FIXABLE, FALLBACK_TASK, ChainState, falls_back
from toolexec.fallback.steps import (
    Alternative,
    ArgumentMap,
    Explain,
    FallbackStep,
    LastGood,
    check_chain,
    complete_chain,
)

__all__ = [
    "AGENT_FIXABLE",
    "FALLBACK_TASK",
    "Action",
    "Alternative",
    "ArgumentMap",
    "CachedResult",
    "ChainRunner",
    "ChainState",
    "Deliver",
    "Explain",
    "FallbackStep",
    "LastGood",
    "LastGoodCache",
    "LastGoodLayer",
    "Lookup",
    "Send",
    "cache_step",
    "check_chain",
    "complete_chain",
    "falls_back",
]
