"""The idempotency layer: dedupes, joins, replays and takes over calls.

Its work is split over two hooks because what to store depends on the
executor's verdict, which comes after the layers: ``around`` claims the record
and runs the body under a renewed lease; ``settle`` stores the final result
(or parks the call for its retry) under the fencing check, and hands the calls
that joined to the verdict (:attr:`Final.joined`) so that the worker's one
delivery answers them with whatever the call ends in, fallbacks included.
What ``around`` learnt travels to ``settle`` in the attempt's notes, as a
:class:`Held`, :class:`Replayed` or :class:`Elsewhere`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from toolexec.clock import Clock, SystemClock
from toolexec.connection import through_blips
from toolexec.errors import (
    IdempotencyMismatchError,
    ToolException,
    UnavailableError,
    WorkerLostError,
)
from toolexec.idempotency.records import (
    UNCERTAIN_TYPES,
    Claim,
    FinalState,
    Finished,
    Lease,
    Message,
    Mode,
    call_mode,
    record_id,
)
from toolexec.idempotency.renewer import LeaseKeeper
from toolexec.idempotency.store import IdempotencyStore
from toolexec.layers import Attempt, Defer, Final, Layer, NoReply, Outcome, Proceed, Retry, Verdict
from toolexec.layers.batch import Batch
from toolexec.normalize import arguments_hash
from toolexec.pipeline.classify import classify_exception
from toolexec.pipeline.execution import error_info, error_result, restamped
from toolexec.pipeline.runner import Runner
from toolexec.registry import ToolSpec
from toolexec.results import ToolResult
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = ["UNKNOWN_SUGGESTION", "IdempotencyLayer", "as_unknown"]

log = logging.getLogger("toolexec.idempotency")

UNKNOWN_SUGGESTION = (
    "The action may or may not have taken effect and this tool cannot check which. "
    "Verify the target state before doing it again; repeating the call with the same "
    "idempotency key returns this same answer."
)

_FENCED = "fenced: another worker took the call over"


@dataclass(frozen=True)
class Held:
    """This run held the lease: its outcome is stored in ``settle``."""

    lease: Lease
    mode: Mode
    uncertain: bool = False  # whether the write may have happened
    confirmed: bool = False  # the check found the effect; the body did not run


@dataclass(frozen=True)
class Replayed:
    """The call is over: answer with the stored result."""

    stored: ToolResult


@dataclass(frozen=True)
class Elsewhere:
    """Another worker answers this call."""

    reason: str


@dataclass
class _Begun:
    """What the admission round trip answered: a claim, or Redis's error."""

    claim: Claim | None = None
    error: Exception | None = None


Note = Held | Replayed | Elsewhere


def _left_uncertain(outcome: Outcome, before: bool) -> bool:
    """Whether, after ``outcome``, the write may have happened."""
    if not outcome.ran:
        return before
    return outcome.failure is not None and outcome.failure.error_type in UNCERTAIN_TYPES


def _final_state(mode: Mode, result: ToolResult) -> FinalState:
    """What the record keeps: outcomes about the effect; a sure no-op frees the key."""
    if mode != "idempotent":
        return "released"
    if result.status == "ok":
        return "succeeded"
    if result.status == "unknown":
        return "unknown"
    return "released" if result.error is not None and result.error.retryable else "failed"


def as_unknown(result: ToolResult) -> ToolResult:
    """A failed result of a write that may have happened, told as such."""
    if result.error is None:
        return result
    message = f"the outcome is unknown: {result.error.message}"
    error = result.error.model_copy(
        update={"message": message, "suggestion": UNKNOWN_SUGGESTION, "retryable": False}
    )
    return result.model_copy(update={"status": "unknown", "error": error})


class IdempotencyLayer(Layer):
    """The outermost layer; see the module doc for its two hooks."""

    name = "idempotency"

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        default_queue: str = "tools",
        runner: Runner | None = None,
        clock: Clock | None = None,
        lease_reads: bool = True,
    ) -> None:
        self.store = store
        #: Whether a read-only call without a key holds a lease (``call_mode`` "lease").
        #: A worker whose broker gives a dead consumer's messages back within seconds
        #: (``toolexec.transport.orphans``; RabbitMQ on its own) needs none: that hands the call
        #: on as fast, without a record written and deleted per call.
        self.lease_reads = lease_reads
        self.keeper = LeaseKeeper(store, store.lease_s / 3)
        self.default_queue = default_queue
        self.runner = runner or Runner()
        self.clock = clock or SystemClock()

    # -- around the body ---------------------------------------------------

    def admit(self, attempt: Attempt, batch: Batch) -> None:
        """Begin the record in the attempt's admission round trip; ``around`` reads the claim."""
        mode = call_mode(attempt.spec, attempt.ctx)
        if mode == "lease" and not self.lease_reads:
            return
        begun = _Begun()
        attempt.notes[self.name] = begun

        def claimed(claim: Claim) -> None:
            begun.claim = claim

        def failed(exc: Exception) -> None:
            begun.error = exc

        self.store.begin_into(
            batch, **self._begin_args(attempt, mode), on_claim=claimed, on_error=failed
        )

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        mode = call_mode(attempt.spec, attempt.ctx)
        if mode == "lease" and not self.lease_reads:
            return proceed()
        try:
            claim = self._claimed(attempt, mode)
        except REDIS_ERRORS as exc:
            if mode != "idempotent":  # a shared read or a hand-over is a help: run it alone
                return proceed()
            return Outcome(failure=_store_down(exc), ran=False)
        if claim.kind == "mismatch":
            return Outcome(failure=_mismatch(attempt), ran=False)
        if claim.kind == "replay" and claim.stored is not None:
            return self._noted(attempt, Replayed(claim.stored), Outcome(ran=False))
        if claim.lease is None:
            note = Elsewhere(f"{claim.kind}: another worker answers it")
            return self._noted(attempt, note, Outcome(ran=False))
        return self._hold(attempt, proceed, claim.lease, mode, claim.uncertain)

    def _noted(self, attempt: Attempt, note: Note, outcome: Outcome) -> Outcome:
        attempt.notes[self.name] = note
        return outcome

    def _claimed(self, attempt: Attempt, mode: Mode) -> Claim:
        """The claim ``admit`` got, or (admitted alone) one asked for now."""
        begun = attempt.notes.pop(self.name, None)
        if isinstance(begun, _Begun):
            if begun.error is not None:
                raise begun.error
            if begun.claim is not None:
                return begun.claim
        return self.store.begin(**self._begin_args(attempt, mode))

    def _begin_args(self, attempt: Attempt, mode: Mode) -> dict[str, Any]:
        spec, ctx = attempt.spec, attempt.ctx
        message = Message(
            task=spec.task_name,
            queue=spec.policy.queue or self.default_queue,
            arguments=attempt.arguments,
            context=ctx.to_json(),
            attempt=attempt.number,
        )
        args_hash = arguments_hash(spec.name, attempt.arguments)
        return {
            "record": record_id(mode, args_hash, ctx),
            "args_hash": args_hash,
            "ctx": ctx,
            "mode": mode,
            "has_check": mode == "idempotent" and spec.check is not None,
            "message": message,
        }

    def _hold(
        self, attempt: Attempt, proceed: Proceed, lease: Lease, mode: Mode, uncertain: bool
    ) -> Outcome:
        """Run under the lease, renewed by the process's keeper until the body is done."""
        self.keeper.hold(lease)
        try:
            if mode == "idempotent" and uncertain:
                outcome, held = self._resolve(attempt, proceed, lease)
            else:
                outcome = proceed()
                left = mode == "idempotent" and _left_uncertain(outcome, False)
                held = Held(lease, mode, uncertain=left)
        finally:
            self.keeper.drop(lease)
        return self._noted(attempt, held, outcome)

    def _resolve(self, attempt: Attempt, proceed: Proceed, lease: Lease) -> tuple[Outcome, Held]:
        """An earlier run may have written: check before writing again."""
        check = attempt.spec.check
        if check is None:
            return Outcome(failure=_lost(), ran=False), Held(lease, "idempotent", uncertain=True)
        found, present = self._check(attempt, check)
        if found.failure is not None:  # cannot tell yet: still uncertain
            return found, Held(lease, "idempotent", uncertain=True)
        if present:
            return found, Held(lease, "idempotent", confirmed=True)
        outcome = proceed()
        return outcome, Held(lease, "idempotent", uncertain=_left_uncertain(outcome, False))

    def _check(self, attempt: Attempt, check: Callable[..., Any]) -> tuple[Outcome, bool]:
        """The tool's check within the attempt's time, and whether it found the effect.

        A check may return the thing it found (the order, the message) instead
        of True: that becomes the result's data.
        """
        kwargs = _kwargs(attempt.spec, attempt.arguments)
        start = self.clock.now()
        try:
            found = self.runner.run(check, kwargs, attempt.limit)
        except Exception as exc:
            failure = classify_exception(exc, self.clock.now())
            return Outcome(failure=failure, ran=False, duration_s=self.clock.now() - start), False
        data = None if isinstance(found, bool) else to_jsonable_python(found)
        return Outcome(data=data, ran=False, duration_s=self.clock.now() - start), bool(found)

    # -- after the verdict ---------------------------------------------------

    def settle(self, attempt: Attempt, outcome: Outcome, verdict: Verdict) -> Verdict:
        """Store what the call came to, or answer from the record; see the module doc."""
        note = attempt.notes.get(self.name)
        if isinstance(note, Replayed):
            now = self.clock.now()
            return Final(restamped(note.stored, attempt.ctx, now, replayed=True, attempts=0))
        if isinstance(note, Elsewhere):
            return NoReply(note.reason)
        if not isinstance(note, Held):
            return verdict
        if note.mode == "lease" and isinstance(verdict, Final):
            return Final(verdict.result, verdict.joined, release=note.lease)
        try:
            if isinstance(verdict, Final):
                return self._finish(attempt, note, verdict.result)
            if isinstance(verdict, Retry | Defer):
                # the message comes back after a delay
                instead = self._park(attempt, note, verdict)
                return verdict if instead is None else instead
        except REDIS_ERRORS as exc:
            # The lease runs out and a sweeper hands the call on; its caller still
            # gets this verdict now.
            log.warning("could not store the outcome of %s: %s", attempt.ctx.call_id, exc)
        return verdict

    def _park(self, attempt: Attempt, held: Held, verdict: Retry | Defer) -> Verdict | None:
        """Keep the call for the message that comes back after ``verdict.delay``.

        None: parked, the verdict stands. A write that may have happened is
        repeated only after its check; a tool without one ends here as
        ``unknown`` instead of retrying.
        """
        spec, now = attempt.spec, self.clock.now()
        if isinstance(verdict, Retry) and held.uncertain and spec.check is None:
            info = error_info(verdict.error)
            result = error_result(verdict.context, info, attempts=attempt.number, now=now)
            return self._finish(attempt, held, as_unknown(result))
        parked = self.store.park(
            held.lease,
            hold_s=min(verdict.delay, attempt.ctx.deadline - now) + self.store.lease_s,
            uncertain=held.uncertain,
            ctx=verdict.context,
            attempt=attempt.number + 1 if isinstance(verdict, Retry) else attempt.number,
        )
        return None if parked else NoReply(_FENCED)

    def _finish(self, attempt: Attempt, held: Held, result: ToolResult) -> Verdict:
        if held.mode == "idempotent" and held.uncertain and result.status == "error":
            result = as_unknown(result)
        if held.confirmed:
            result = result.model_copy(update={"source": "check"})
        tries = 0

        def finish() -> Finished:
            nonlocal tries
            tries += 1
            return self.store.finish(held.lease, _final_state(held.mode, result), result)

        # through a Redis blip, while the caller still waits (issue 12: writes survive blips)
        finished = through_blips(finish, max(0.0, attempt.ctx.deadline - self.clock.now()))
        if not finished.stored and tries > 1:
            # an earlier try may have stored it and lost only its reply: answer anyway
            return Final(result)
        if not finished.stored:
            log.warning(
                "call %s: a newer holder owns it (this run's token %d is stale); outcome dropped",
                attempt.ctx.call_id,
                held.lease.token,
            )
            return NoReply(_FENCED)
        # the call itself gets its own answer; the others joined it
        joined = tuple(w for w in finished.waiters if w.call_id != result.call_id)
        return Final(result, joined)


def _kwargs(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    model = spec.arguments.model_validate(arguments)
    return {name: getattr(model, name) for name in type(model).model_fields}


def _store_down(exc: Exception) -> ToolException:
    return UnavailableError(
        f"the idempotency store (Redis) did not answer ({type(exc).__name__}: {exc}); "
        "the call was not made, since it could not be made safely",
        suggestion="Try again in a moment.",
    )


def _mismatch(attempt: Attempt) -> ToolException:
    return IdempotencyMismatchError(
        f"the idempotency key {attempt.ctx.idempotency_key!r} was already used for a call "
        f"with other arguments (or another tool than {attempt.tool!r})",
        suggestion="Use a new idempotency key for a different request, or repeat the "
        "original arguments exactly to get the original result.",
    )


def _lost() -> ToolException:
    return WorkerLostError(
        "the worker running this call stopped while the action may have been under way, "
        "and the tool declares no check to find out whether it took effect",
        suggestion=UNKNOWN_SUGGESTION,
    )
