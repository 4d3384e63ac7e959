"""Fallback chains for tools whose primary fails or whose breaker is open.

Filled by the fallback work (issue 3): alternative tools, the cached last good
result, then an honest explanation, each marked ``degraded`` with its source.
"""

__all__: list[str] = []
