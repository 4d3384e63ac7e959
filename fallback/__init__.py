"""Fallback chains for tools whose primary fails or whose breaker is open.

Declare a chain next to the tool::

    @tool(fallbacks=[Alternative("search_lite", arguments=lambda a: {"q": a["query"]}),
                     LastGood(ttl_s=3600),
                     Explain(instead="Answer from what you know and say so.")])
    def search(query: str, filters: dict[str, str] | None = None) -> list[dict]: ...

or later with ``default_registry.set_fallbacks("search", [...])``. Every answer
a chain gives is ``degraded`` with its ``source`` and the primary's error.

The package exports what a tool declares; the machinery that runs a chain
on the worker (``chain``, ``cache``, ``state``) is imported from its module by
the worker's side, so declaring tools loads none of it.
"""

from toolexec.fallback.steps import Alternative, ArgumentMap, Explain, FallbackStep, LastGood

__all__ = ["Alternative", "ArgumentMap", "Explain", "FallbackStep", "LastGood"]
