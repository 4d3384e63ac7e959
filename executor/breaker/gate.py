"""The client's side of a breaker: refuse a call before it is queued.

One round trip and no permit: the worker's :class:`~toolexec.breaker.layer.BreakerLayer`
takes the permit when the call runs. The fallback chain asks the same question
before it sends an alternative.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolexec.breaker.policy import breaker_name
from toolexec.breaker.store import CircuitBreaker
from toolexec.errors import CircuitOpenError
from toolexec.policies import BreakerPolicy

__all__ = ["refusal_for"]


def refusal_for(
    breakers: CircuitBreaker,
    tool: str,
    policy: BreakerPolicy,
    key: str | None,
    arguments: Mapping[str, Any],
) -> CircuitOpenError | None:
    """The refusal an open breaker gives, or None when it would admit the call."""
    view = breakers.check(breaker_name(tool, key, arguments), policy)
    return None if view.admits else view.refusal()
