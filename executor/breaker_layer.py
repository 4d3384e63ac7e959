"""The circuit breaker in the call path: a gate on the client, a layer on the worker.

Both sides derive the same breaker name from the call (the tool, or the tool
and the downstream host when the tool names a ``breaker_key`` argument), so the
client's fast check and the worker's admission read the same state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from toolexec.breaker import BreakerPolicy, CircuitBreaker
from toolexec.errors import TRANSIENT_TYPES, CircuitOpenError, ToolException
from toolexec.layers import Attempt, Outcome, Proceed

__all__ = ["BreakerLayer", "breaker_name", "counts_as_failure", "refusal_for"]


def breaker_name(tool: str, key_argument: str | None, arguments: Mapping[str, Any]) -> str:
    """``tool``, or ``tool@host`` when the tool keeps a breaker per downstream host."""
    if key_argument:
        value = arguments.get(key_argument)
        host = urlsplit(value).hostname if isinstance(value, str) else None
        if host:
            return f"{tool}@{host}"
    return tool


def counts_as_failure(failure: ToolException | None) -> bool:
    """Only transient failures say the service is unhealthy.

    A 404 or a 400 means the service answered; an agent's mistake must never
    cut everyone else off from a healthy service.
    """
    return failure is not None and failure.error_type in TRANSIENT_TYPES


def refusal_for(
    breakers: CircuitBreaker,
    tool: str,
    policy: BreakerPolicy,
    key: str | None,
    arguments: Mapping[str, Any],
) -> CircuitOpenError | None:
    """The client's pre-check: the refusal an open breaker gives, without a permit."""
    view = breakers.check(breaker_name(tool, key, arguments), policy)
    return None if view.admits else view.refusal()


class BreakerLayer:
    """Admits an attempt through the tool's breaker and records how it went."""

    def __init__(self, breakers: CircuitBreaker) -> None:
        self.breakers = breakers

    def __call__(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        policy = attempt.spec.policy.breaker
        name = breaker_name(attempt.tool, attempt.spec.policy.breaker_key, attempt.arguments)
        admission = self.breakers.acquire(name, policy)
        if not admission.allowed:
            return Outcome(failure=admission.refusal(), ran=False)
        outcome = proceed()
        failure = outcome.failure
        self.breakers.record(
            name,
            policy,
            admission,
            success=not counts_as_failure(failure),
            duration_s=outcome.duration_s,
            retry_after=getattr(failure, "retry_after", None),
        )
        return outcome
