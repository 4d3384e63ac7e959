"""What travels with a call besides its arguments.

The deadline is absolute (Unix epoch seconds, set by the caller) so that it
bounds queueing, every attempt and every backoff together, on whichever worker
picks the message up. Accumulated run and backoff time ride along on retries so
the final result can say where the time went.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from toolexec.bounds import finite_epoch
from toolexec.results import ErrorInfo, StepNote

__all__ = ["CallContext", "ChainState", "Joined"]


@dataclass(frozen=True)
class ChainState:
    """One chain in progress; JSON in the call's context.

    ``attempts`` counts every tool body run for the call so far (primary and
    alternatives); ``hop`` counts the messages the chain has sent, to give
    each its own task id.
    """

    primary: str
    queue: str | None
    error: ErrorInfo
    primary_attempts: int
    arguments: Any
    attempts: int = 0
    next: int = 0
    hop: int = 0
    tried: tuple[StepNote, ...] = ()

    @classmethod
    def begin(
        cls, primary: str, queue: str | None, error: ErrorInfo, attempts: int, arguments: Any
    ) -> ChainState:
        return cls(primary, queue, error, attempts, arguments, attempts=attempts)

    def noted(self, note: StepNote) -> ChainState:
        return replace(self, tried=(*self.tried, note))

    def at(self, index: int) -> ChainState:
        return replace(self, next=index)

    def sent(self) -> ChainState:
        return replace(self, hop=self.hop + 1)

    def ran(self, attempts: int) -> ChainState:
        return replace(self, attempts=self.attempts + attempts)

    def task_id(self, call_id: str) -> str:
        """The id of the message this chain sends next (after :meth:`sent`)."""
        return f"{call_id}-fb{self.hop}"

    def to_json(self) -> dict[str, Any]:
        return {
            "primary": self.primary,
            "queue": self.queue,
            "error": self.error.model_dump(mode="json"),
            "primary_attempts": self.primary_attempts,
            "arguments": self.arguments,
            "attempts": self.attempts,
            "next": self.next,
            "hop": self.hop,
            "tried": [note.model_dump(mode="json") for note in self.tried],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ChainState:
        return cls(
            primary=raw["primary"],
            queue=raw.get("queue"),
            error=ErrorInfo.model_validate(raw["error"]),
            primary_attempts=int(raw.get("primary_attempts", 0)),
            arguments=raw.get("arguments"),
            attempts=int(raw.get("attempts", 0)),
            next=int(raw.get("next", 0)),
            hop=int(raw.get("hop", 0)),
            tried=tuple(StepNote.model_validate(n) for n in raw.get("tried", ())),
        )


@dataclass(frozen=True)
class Joined:
    """A call that joined this one and is answered with its result (``toolexec.idempotency``).

    Just what its answer needs: where to deliver it and what to stamp on it.
    It rides in the context so that a fallback chain started by the call
    answers the joined calls too, whichever worker its last step runs on.
    """

    call_id: str
    reply_to: str
    deadline: float
    submitted_at: float
    run_id: str | None = None

    @classmethod
    def of(cls, ctx: CallContext) -> Joined:
        return cls(ctx.call_id, ctx.reply_to, ctx.deadline, ctx.submitted_at, ctx.run_id)

    def context(self, tool: str) -> CallContext:
        """The joined call as a context of its own, to stamp its answer."""
        return CallContext(
            call_id=self.call_id,
            tool=tool,
            deadline=self.deadline,
            submitted_at=self.submitted_at,
            reply_to=self.reply_to,
            run_id=self.run_id,
        )


@dataclass(frozen=True)
class CallContext:
    call_id: str
    tool: str
    deadline: float
    submitted_at: float
    reply_to: str
    run_id: str | None = None
    #: The caller's idempotency key (``toolexec.idempotency``); None: derived when needed.
    idempotency_key: str | None = None
    previous_delay: float | None = None
    run_s: float = 0.0
    backoff_s: float = 0.0
    #: Times a shared rate limit deferred the call (``toolexec.layers.ratelimit``): Celery
    #: counts those as retries, but they used no attempt.
    deferrals: int = 0
    #: The attempt whose rate-limit slot was reserved before it was deferred: it
    #: runs without asking the limiter again.
    slot_for: int | None = None
    #: Some attempt of this call met an injected fault (``toolexec.layers.faults``).
    injected: bool = False
    #: The caller's tenant (``TOOLEXEC_TENANT``): scopes the call's idempotency record and
    #: its last-good result (``toolexec.fallback.cache``).
    tenant: str | None = None
    #: A fallback chain in progress (``toolexec.fallback``): the primary's error,
    #: the steps tried, the original arguments.
    fallback: ChainState | None = None
    #: Calls that joined this one and wait for its answer, whatever answers it.
    joined: tuple[Joined, ...] = ()
    #: The error an earlier attempt met at the service (type, message), carried to later
    #: attempts: one refused without running (an open breaker) still tells the model what
    #: actually failed.
    last_error: dict[str, Any] | None = None
    #: The attempt that must take a retry from the retry budget before it runs: the
    #: budget refused it when the call failed, and the call chose to wait for budget.
    budget_for: int | None = None
    #: Seconds this call has waited on toolexec's own defences (budget, breaker); each
    #: defence's ``max_wait_s`` bounds it (``toolexec.waits``).
    waited_s: float = 0.0
    #: The caller's fairness key and priority (``toolexec.fairness``), kept so that a
    #: retry or a fallback step waits in the same lane as the call.
    fairness_key: str | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        # a message's times become TTLs and sorted-set scores: NaN or 1e300 must stop here
        finite_epoch(self.deadline, "deadline")
        finite_epoch(self.submitted_at, "submitted_at")

    def to_json(self) -> dict[str, Any]:
        # the fields one by one, not dataclasses.asdict: that deep-copies every value, a
        # tenth of the client's CPU for a call; only last_error is a mutable value here
        raw = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.last_error is not None:
            raw["last_error"] = copy.deepcopy(self.last_error)
        raw["fallback"] = None if self.fallback is None else self.fallback.to_json()
        for name in ("fairness_key", "priority"):
            if raw[name] is None:
                del raw[name]  # the common case keeps messages as they were
        if not self.joined:
            del raw["joined"]  # the common case keeps messages as they were
        else:
            raw["joined"] = [asdict(j) for j in self.joined]
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CallContext:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        known["joined"] = tuple(Joined(**j) for j in raw.get("joined") or ())
        chain = raw.get("fallback")
        known["fallback"] = None if chain is None else ChainState.from_json(chain)
        return cls(**known)

    def joining(self, waiters: Iterable[CallContext]) -> CallContext:
        """This context carrying ``waiters`` along, each once, never itself."""
        seen = {j.call_id for j in self.joined} | {self.call_id}
        added = []
        for waiter in waiters:
            if waiter.call_id not in seen:
                seen.add(waiter.call_id)
                added.append(Joined.of(waiter))
        return replace(self, joined=(*self.joined, *added)) if added else self

    def remaining(self, now: float) -> float:
        return self.deadline - now

    def after_attempt(self, run_s: float) -> CallContext:
        return replace(self, run_s=self.run_s + run_s)

    def before_retry(self, delay: float, error: dict[str, Any] | None = None) -> CallContext:
        return replace(
            self,
            previous_delay=delay,
            backoff_s=self.backoff_s + delay,
            last_error=error or self.last_error,
        )

    def owing(self, attempt: int, wait: float) -> CallContext:
        """Before waiting ``wait`` s for budget for the retry that is ``attempt``."""
        return replace(self, budget_for=attempt, waited_s=self.waited_s + wait)

    def waiting(self, wait: float) -> CallContext:
        """Before waiting ``wait`` s in the queue on a defence; uses no attempt."""
        return replace(
            self,
            deferrals=self.deferrals + 1,
            waited_s=self.waited_s + wait,
            backoff_s=self.backoff_s + wait,
        )

    def deferred(self, attempt: int) -> CallContext:
        """Before waiting in the queue for the rate-limit slot reserved for ``attempt``."""
        return replace(self, deferrals=self.deferrals + 1, slot_for=attempt)
