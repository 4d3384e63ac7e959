"""The circuit breaker in the worker's attempt pipeline.

The client's fast check (:func:`toolexec.breaker.gate.refusal_for`) and this
layer derive the same breaker name from the call (the tool, or the tool and
the downstream host when the tool names a ``breaker_key`` argument), so both
read the same state.

A breaker counts calls, not attempts: "5 failures in a row" means five calls
that failed, whatever their ``max_attempts``. A failed attempt that will be
retried is therefore not recorded; only the call's last attempt is, once the
executor's verdict says the call is over (:meth:`BreakerLayer.record`). A
half-open probe is the exception: it is recorded whatever the verdict,
because the probe's question, "is the service back?", has been answered by
that one attempt. Nothing toolexec refused or cut short itself is counted
(:func:`_service_spoke`): a budget's refusal, for one. A call that such a
refusal ends counts once, with the service's last real error
(:func:`_ended_by_refusal`).

The permit is asked for in the attempt's admission round trip and the outcome
recorded in its settlement round trip (``toolexec.layers.batch``), so the breaker
adds no round trip of its own. On a worker it does less: while the process's
copy of the breaker's gate (:class:`~toolexec.breaker.gate.BreakerGate`, which
Redis invalidates) says closed, the attempt is admitted from the copy, and its
success is added to the process's tally (``toolexec.stores.tally``), written with the
next flush; a failure, a slow call or any attempt admitted by the script is
recorded in the settlement at once, after the successes still pending. When
an outer layer answers first (a replay, a deferral), the permit was asked for
all the same: a closed breaker wrote nothing for it, and a probe permit is
given back in the settlement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from toolexec.breaker.gate import BreakerGate
from toolexec.breaker.policy import breaker_name, counts_as_failure
from toolexec.breaker.store import CircuitBreaker
from toolexec.breaker.views import Admission, BreakerState, Transition
from toolexec.errors import TRANSIENT_TYPES, RetryBudgetExhaustedError, ToolException
from toolexec.layers import Attempt, Final, Layer, Outcome, Proceed, Retry, Verdict
from toolexec.layers.batch import Batch
from toolexec.policies import BreakerPolicy
from toolexec.stores.tally import Tally, Writer
from toolexec.waits import breaker_wait

__all__ = ["BreakerLayer"]


@dataclass
class _Note:
    """What ``admit`` asked and ``around`` saw, for ``record``."""

    name: str
    admission: Admission | None = None
    seen: Outcome | None = None  # the body's outcome, once ``around`` ran it
    copied: bool = False  # admitted from the gate's copy: closed, no permit


def _counted(note: _Note, admission: Admission, verdict: Verdict) -> bool:
    """Whether this attempt is recorded: not a failed one the call retries, unless a probe."""
    assert note.seen is not None
    failed = counts_as_failure(note.seen.failure)
    return not (failed and isinstance(verdict, Retry) and not admission.probe)


def _service_spoke(seen: Outcome) -> bool:
    """Whether the outcome is the service's, not a refusal of toolexec's own.

    An inner layer's refusal (the retry budget) never reached the service: it
    says nothing about its health. (A timeout is the service's even when the
    call's deadline shortened the attempt: a hung service must still open it.)
    """
    return seen.ran


def _ended_by_refusal(
    attempt: Attempt, note: _Note, admission: Admission, verdict: Verdict
) -> bool:
    """A call that waited for budget and was then refused: it counts its last real failure.

    The refusal is toolexec's, but the service did fail the call's earlier
    attempt, and a breaker counts calls: without this, calls an outage's budget
    ends would never open it. A probe permit is not spent on it (the probe's
    question was not asked): that attempt gives its permit back instead.
    """
    seen = note.seen
    return (
        seen is not None
        and not seen.ran
        and isinstance(seen.failure, RetryBudgetExhaustedError)
        and isinstance(verdict, Final)
        and not admission.probe
        and (attempt.ctx.last_error or {}).get("type") in TRANSIENT_TYPES
    )


class BreakerLayer(Layer):
    """Admits an attempt through the tool's breaker and records how its call went."""

    name = "breaker"

    def __init__(
        self,
        breakers: CircuitBreaker,
        *,
        gate: BreakerGate | None = None,
        tally: Tally | None = None,
    ) -> None:
        self.breakers = breakers
        self.gate = gate
        self.tally = tally

    def admit(self, attempt: Attempt, batch: Batch) -> None:
        note = _Note(breaker_name(attempt.tool, attempt.spec.policy.breaker_key, attempt.arguments))
        attempt.notes[self.name] = note
        policy = attempt.spec.policy.breaker
        if policy.enabled and self.gate is not None and self.gate.closed(note.name):
            note.admission = Admission(name=note.name, allowed=True, state=BreakerState.CLOSED)
            note.copied = True
            return

        def admitted(admission: Admission) -> None:
            note.admission = admission

        self.breakers.acquire_into(batch, note.name, attempt.spec.policy.breaker, admitted)

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        note = attempt.notes.get(self.name)
        if not isinstance(note, _Note) or note.admission is None:  # admitted alone
            name = breaker_name(attempt.tool, attempt.spec.policy.breaker_key, attempt.arguments)
            note = _Note(name, self.breakers.acquire(name, attempt.spec.policy.breaker))
            attempt.notes[self.name] = note
        admission = note.admission
        assert admission is not None
        if not admission.allowed:
            note.admission = None  # nothing to give back or record
            refusal = admission.refusal()
            policy = attempt.spec.policy.breaker
            refusal.wait_s = breaker_wait(
                state=admission.state,
                retry_after=admission.retry_after,
                trips=admission.trips,
                max_wait_s=policy.max_wait_s,
                waited_s=attempt.ctx.waited_s,
            )
            return Outcome(failure=refusal, ran=False)
        note.seen = proceed()
        return note.seen

    def record(self, attempt: Attempt, outcome: Outcome, verdict: Verdict, batch: Batch) -> None:
        """Count the call's outcome; give back a permit that no attempt used."""
        note = attempt.notes.get(self.name)
        if not isinstance(note, _Note) or note.admission is None:
            return
        admission = note.admission
        if note.seen is not None and _ended_by_refusal(attempt, note, admission, verdict):
            self._count(attempt, note, admission, batch, success=False, failure=None)
            return
        if note.seen is None or not _service_spoke(note.seen):
            # an outer layer answered or an inner one refused:
            # the service said nothing, so nothing is counted and a probe permit returns
            self.breakers.release_into(batch, admission)
            return
        if not _counted(note, admission, verdict):
            return
        failure = note.seen.failure
        self._count(
            attempt, note, admission, batch, success=not counts_as_failure(failure), failure=failure
        )

    def _count(
        self,
        attempt: Attempt,
        note: _Note,
        admission: Admission,
        batch: Batch,
        *,
        success: bool,
        failure: ToolException | None,
    ) -> None:
        assert note.seen is not None
        policy, name = attempt.spec.policy.breaker, note.name
        if self.tally is not None:
            if note.copied and success and not policy.is_slow(note.seen.duration_s):
                self.tally.add(("breaker", name), {"ok": 1}, self._successes(name, policy))
                return
            self.tally.take_into(batch, ("breaker", name))  # they came first
        self.breakers.record_into(
            batch,
            name,
            policy,
            admission,
            success=success,
            duration_s=note.seen.duration_s,
            retry_after=getattr(failure, "retry_after", None),
            write=attempt.write,
            caused=self._moved(name),
        )

    def _moved(self, name: str) -> Callable[[Transition | None], None]:
        """A record that moved the breaker: this process's copy of its gate is out of date."""

        def caused(transition: Transition | None) -> None:
            if transition is not None and self.gate is not None:
                self.gate.forget(name)

        return caused

    def _successes(self, name: str, policy: BreakerPolicy) -> Writer:
        """The tally's writer of ``name``'s successes: one record standing for all of them."""

        def write(batch: Batch, counts: Mapping[str, int], write: tuple[str, float]) -> None:
            closed = Admission(name=name, allowed=True, state=BreakerState.CLOSED)
            self.breakers.record_into(
                batch,
                name,
                policy,
                closed,
                success=True,
                duration_s=0.0,
                write=write,
                successes=counts["ok"],
                caused=self._moved(name),
            )

        return write
