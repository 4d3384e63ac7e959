"""The circuit breaker in the worker's attempt pipeline.

The client's fast check (:func:`toolexec.breaker.gate.refusal_for`) and this
layer derive the same breaker name from the call (the tool, or the tool and
the downstream host when the tool names a ``breaker_key`` argument), so both
read the same state.
"""

from __future__ import annotations

from toolexec.breaker.policy import breaker_name, counts_as_failure
from toolexec.breaker.store import CircuitBreaker
from toolexec.layers import Attempt, Layer, Outcome, Proceed

__all__ = ["BreakerLayer"]


class BreakerLayer(Layer):
    """Admits an attempt through the tool's breaker and records how it went."""

    name = "breaker"

    def __init__(self, breakers: CircuitBreaker) -> None:
        self.breakers = breakers

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
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
