"""What a breaker looks like from outside: its states, a view, an admission, a transition.

Frozen values the store returns and listeners (metrics, logs) receive; the
states and the reasons for moving between them are docs/breaker.md's machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from toolexec.errors import CircuitOpenError

__all__ = [
    "Admission",
    "BreakerState",
    "BreakerView",
    "Listener",
    "Transition",
    "TransitionReason",
]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class TransitionReason(StrEnum):
    CONSECUTIVE_FAILURES = "consecutive_failures"
    FAILURE_RATE = "failure_rate"
    OPEN_ELAPSED = "open_elapsed"
    PROBE_FAILED = "probe_failed"
    PROBES_SUCCEEDED = "probes_succeeded"
    TRIPPED = "tripped"
    RESET = "reset"


_REASONS = {
    TransitionReason.CONSECUTIVE_FAILURES: "calls failed in a row",
    TransitionReason.FAILURE_RATE: "too many calls in its window failed",
    TransitionReason.PROBE_FAILED: "a test call found the service still failing",
    TransitionReason.TRIPPED: "an operator opened it",
}


def _refusal(
    name: str,
    state: BreakerState | None,
    retry_after: float | None,
    trips: int = 0,
    reason: TransitionReason | None = None,
) -> CircuitOpenError:
    """``circuit_open``, saying it was toolexec's breaker, why, and when it probes again."""
    why_open = _REASONS.get(reason, "recent calls failed") if reason else "recent calls failed"
    if state is None:
        why = "cannot reach its Redis and is set to refuse calls meanwhile"
    elif state is BreakerState.HALF_OPEN:
        why = "half-open: the calls that test whether the service is back are in flight"
    elif retry_after is None:
        why = "held open by an operator until reset"
    else:
        nth = f"trip {trips}, " if trips else ""
        why = f"open ({nth}{why_open}); it lets a test call through in {retry_after:.1f} s"
    return CircuitOpenError(
        f"circuit_open: the circuit breaker of {name!r} (toolexec's, not the service's "
        f"answer) is {why}; this call was not made",
        retry_after=retry_after,
        suggestion="Use another tool or answer without this one; retry it later if still needed.",
        details={
            "defence": "circuit_breaker",
            "breaker": name,
            "state": None if state is None else str(state),
            "trips": trips,
            "reason": None if reason is None else str(reason),
            "reopens_in_s": None if retry_after is None else round(retry_after, 3),
        },
    )


@dataclass(frozen=True)
class BreakerView:
    """One breaker as a script saw it at ``at``; ``state`` None means not consulted.

    ``admits`` says whether :meth:`CircuitBreaker.acquire` would let a call
    through now (the client's pre-check); when it would not, ``retry_after``
    is when it may (None while isolated). A view from :meth:`snapshot`, which
    knows no policy, treats the number of probes as unlimited.
    """

    name: str
    state: BreakerState | None
    admits: bool
    retry_after: float | None = None
    open_until: float | None = None
    isolated: bool = False
    calls: int = 0
    failures: int = 0
    slow: int = 0
    consecutive: int = 0
    probes_in_flight: int = 0
    probe_successes: int = 0
    generation: int = 0
    changed_at: float | None = None
    reason: TransitionReason | None = None
    at: float | None = None
    #: Consecutive trips so far (each stays open longer); 0 once a calm spell resets it.
    trips: int = 0

    @property
    def failure_rate(self) -> float | None:
        """Failures (slow calls included) over calls in the window; None while empty."""
        return self.failures / self.calls if self.calls else None

    def refusal(self) -> CircuitOpenError:
        """The error a refused call reports (``circuit_open``, retryable)."""
        return _refusal(self.name, self.state, self.retry_after, self.trips, self.reason)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": None if self.state is None else str(self.state),
            "admits": self.admits,
            "retry_after": self.retry_after,
            "open_until": self.open_until,
            "isolated": self.isolated,
            "calls": self.calls,
            "failures": self.failures,
            "slow": self.slow,
            "failure_rate": self.failure_rate,
            "consecutive": self.consecutive,
            "probes_in_flight": self.probes_in_flight,
            "probe_successes": self.probe_successes,
            "generation": self.generation,
            "changed_at": self.changed_at,
            "reason": None if self.reason is None else str(self.reason),
            "at": self.at,
            "trips": self.trips,
        }


@dataclass(frozen=True)
class Admission:
    """Whether one call may run, and the permit to hand back to :meth:`CircuitBreaker.record`.

    ``state`` is the state that admitted or refused it (None: the breaker was
    disabled or Redis unreachable). A half-open admission carries a probe
    ``permit``; ``generation`` ties the outcome to the state it was admitted in.
    """

    name: str
    allowed: bool
    state: BreakerState | None
    permit: str | None = None
    generation: int | None = None
    retry_after: float | None = None
    open_until: float | None = None
    trips: int = 0
    reason: TransitionReason | None = None

    @property
    def probe(self) -> bool:
        return self.permit is not None

    def refusal(self) -> CircuitOpenError:
        """The error a refused call reports (``circuit_open``, retryable)."""
        return _refusal(self.name, self.state, self.retry_after, self.trips, self.reason)


@dataclass(frozen=True)
class Transition:
    """A breaker changed state; what listeners receive (one frozen object).

    ``calls``, ``failures`` and ``consecutive`` are the window after the
    change: the numbers that opened it, or zeros once it closed.
    """

    name: str
    from_state: BreakerState
    to_state: BreakerState
    at: float
    reason: TransitionReason
    open_until: float | None = None
    calls: int = 0
    failures: int = 0
    consecutive: int = 0
    trips: int = 0


Listener = Callable[[Transition], object]
