"""The circuit breaker in the worker's attempt pipeline.

The client's fast check (:func:`toolexec.breaker.gate.refusal_for`) and this
layer derive the same breaker name from the call (the tool, or the tool and
the downstream host when the tool names a ``breaker_key`` argument), so both
read the same state.

A breaker counts calls, not attempts: "5 failures in a row" means five calls
that failed, whatever their ``max_attempts``. A failed attempt that will be
retried is therefore not recorded; only the call's last attempt is, once the
executor's verdict says the call is over (:meth:`BreakerLayer.settle`). A
half-open probe is the exception: it is recorded at once, because the probe's
question, "is the service back?", has been answered by that one attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolexec.breaker.policy import BreakerPolicy, breaker_name, counts_as_failure
from toolexec.breaker.store import CircuitBreaker
from toolexec.breaker.views import Admission
from toolexec.errors import ToolException
from toolexec.layers import Attempt, Layer, Outcome, Proceed, Retry, Verdict

__all__ = ["BreakerLayer"]


@dataclass(frozen=True)
class _Pending:
    """A failed attempt waiting for the verdict: recorded if the call ends with it."""

    name: str
    policy: BreakerPolicy
    admission: Admission
    failure: ToolException
    duration_s: float


class BreakerLayer(Layer):
    """Admits an attempt through the tool's breaker and records how its call went."""

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
        if failure is not None and counts_as_failure(failure) and not admission.probe:
            attempt.notes[self.name] = _Pending(
                name, policy, admission, failure, outcome.duration_s
            )
            return outcome
        self._record(name, policy, admission, failure, outcome.duration_s)
        return outcome

    def settle(self, attempt: Attempt, outcome: Outcome, verdict: Verdict) -> Verdict:
        """Count a failed attempt only if the call ends with it, not if it is retried."""
        pending = attempt.notes.pop(self.name, None)
        if isinstance(pending, _Pending) and not isinstance(verdict, Retry):
            self._record(
                pending.name, pending.policy, pending.admission, pending.failure, pending.duration_s
            )
        return verdict

    def _record(
        self,
        name: str,
        policy: BreakerPolicy,
        admission: Admission,
        failure: ToolException | None,
        duration_s: float,
    ) -> None:
        self.breakers.record(
            name,
            policy,
            admission,
            success=not counts_as_failure(failure),
            duration_s=duration_s,
            retry_after=getattr(failure, "retry_after", None),
        )
