"""Shared rate limits: calls per second with a burst, for every worker at once.

Celery's ``rate_limit`` is per worker (docs/background.md, Celery): ten workers at 5/s send
50/s. This limit is one Redis key per tool, a GCRA (generic cell rate
algorithm: the time the next call would be due, advanced by ``1 / rate`` per
call), updated by one Lua script, so the fleet together sends at most
``burst`` calls at once and ``rate`` per second after that.

A call over the limit does not call the service and does not fail: the
script reserves the next free slot for it and the worker puts the message
back on the queue with a countdown to that slot (the executor's ``Defer``
verdict), which uses no attempt. The attempt that comes back finds its slot
kept (``CallContext.slot_for``) and runs without asking again. A call whose
slot would come after its deadline reserves nothing and ends at once with
``rate_limited`` and ``retry_after``. While Redis is unreachable, limits step
aside and a warning is logged.

The slot is reserved in the attempt's admission round trip, together with the
other layers' asks (``toolexec.layers.batch``). An attempt that an outer layer
answers first (a replay, a duplicate in flight) gives its slot back in the
settlement, unless a later reservation came in between: then that slot stays
spent, as if the call had been made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.errors import ThrottledError
from toolexec.keys import Keys
from toolexec.layers import Attempt, Layer, Outcome, Proceed, Verdict
from toolexec.layers.batch import Batch
from toolexec.lua import register, script_source
from toolexec.policies import RateLimitPolicy
from toolexec.stores.failopen import FailOpen

__all__ = ["RateLimitLayer", "RateLimiter", "Slot"]


@dataclass(frozen=True)
class Slot:
    """When a call may go: now (``wait`` 0), later (``reserved``), or not before its deadline.

    ``due`` is the due time the reservation set (None: nothing reserved in
    Redis), what :meth:`RateLimiter.release_into` needs to give it back.
    """

    wait: float
    reserved: bool
    due: str | None = None

    @property
    def now(self) -> bool:
        return self.reserved and self.wait <= 0


class RateLimiter:
    """Shared rate limits in one Redis, under one key prefix; safe to share between threads."""

    def __init__(
        self, client: redis.Redis, keys: Keys | None = None, *, clock: Clock | None = None
    ) -> None:
        self.redis = client
        self.keys = keys or Keys()
        self.clock = clock
        self.fail_open = FailOpen("shared rate limits", clock=clock)
        self._reserve = register(client, script_source("rate_limit"))
        self._release = register(client, script_source("rate_limit_release"))

    def now(self) -> float:
        return (self.clock or SystemClock()).now()

    def reserve(self, name: str, policy: RateLimitPolicy, max_wait: float) -> Slot:
        """The next slot of ``name``, taken if it comes within ``max_wait`` seconds."""
        slots: list[Slot] = []
        batch = Batch()
        self.reserve_into(batch, name, policy, max_wait, slots.append)
        batch.execute()
        return slots[0]

    def reserve_into(
        self,
        batch: Batch,
        name: str,
        policy: RateLimitPolicy,
        max_wait: float,
        take: Callable[[Slot], None],
    ) -> None:
        """:meth:`reserve` queued on ``batch``: ``take`` gets the slot when it runs.

        While Redis is away the call goes at once, unlimited (``toolexec.stores.failopen``).
        """
        unlimited = Slot(wait=0.0, reserved=True)
        if self.fail_open.down():
            take(unlimited)
            return

        def failed(exc: Exception) -> None:
            self.fail_open.failed(exc, "calls are not rate limited meanwhile")
            take(unlimited)

        def reserved(raw: Any) -> None:
            due = _text(raw[2]) if len(raw) > 2 else None
            take(Slot(wait=float(raw[1]), reserved=bool(int(raw[0])), due=due))

        now = "" if self.clock is None else repr(float(self.clock.now()))
        args: list[str | int] = [now, repr(policy.interval), policy.burst, repr(max(0.0, max_wait))]
        batch.script(
            self.redis, self._reserve, [self.keys.rate_limit(name)], args, reserved, failed
        )

    def release_into(self, batch: Batch, name: str, policy: RateLimitPolicy, slot: Slot) -> None:
        """Give back ``slot`` if it is still the last one reserved (its attempt never ran)."""
        if slot.due is None:
            return
        args = [slot.due, repr(policy.interval)]

        def failed(exc: Exception) -> None:
            self.fail_open.failed(exc, "calls are not rate limited meanwhile")

        batch.script(self.redis, self._release, [self.keys.rate_limit(name)], args, None, failed)

    def reset(self, name: str) -> None:
        self.redis.delete(self.keys.rate_limit(name))


class RateLimitLayer(Layer):
    """Lets an attempt through at its tool's shared rate, or defers it to its slot.

    ``overrides`` (from settings) replace a tool's declared policy by name, so
    an operator can slow a tool down without a release.
    """

    name = "rate_limit"

    def __init__(
        self,
        limiter: RateLimiter,
        overrides: Mapping[str, RateLimitPolicy] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.limiter = limiter
        self.overrides = dict(overrides or {})
        # the clock a call's deadline is read on (the worker's fleet clock)
        self.clock = clock or limiter

    def policy_for(self, attempt: Attempt) -> RateLimitPolicy | None:
        return self.overrides.get(attempt.tool) or attempt.spec.policy.rate_limit

    def admit(self, attempt: Attempt, batch: Batch) -> None:
        """Reserve the slot in the admission round trip; ``around`` reads it."""
        policy = self.policy_for(attempt)
        if policy is None or attempt.ctx.slot_for == attempt.number:
            return
        note = _Note(policy)
        attempt.notes[self.name] = note
        left = attempt.ctx.deadline - self.clock.now()

        def take(slot: Slot) -> None:
            note.slot = slot

        self.limiter.reserve_into(batch, attempt.tool, policy, left, take)

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        policy = self.policy_for(attempt)
        if policy is None or attempt.ctx.slot_for == attempt.number:
            return proceed()  # no limit, or this attempt's slot was reserved before it was deferred
        note = attempt.notes.get(self.name)
        if isinstance(note, _Note) and note.slot is not None:
            slot = note.slot
            note.used = True
        else:  # admitted alone
            left = attempt.ctx.deadline - self.clock.now()
            slot = self.limiter.reserve(attempt.tool, policy, left)
        if slot.now:
            return proceed()
        return Outcome(failure=_throttled(attempt.tool, policy, slot), ran=False)

    def record(self, attempt: Attempt, outcome: Outcome, verdict: Verdict, batch: Batch) -> None:
        """An outer layer answered before ``around``: the slot goes back, if it still can."""
        note = attempt.notes.get(self.name)
        if isinstance(note, _Note) and note.slot is not None and not note.used:
            self.limiter.release_into(batch, attempt.tool, note.policy, note.slot)


@dataclass
class _Note:
    """The slot ``admit`` reserved, and whether ``around`` used it."""

    policy: RateLimitPolicy
    slot: Slot | None = None
    used: bool = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _throttled(tool: str, policy: RateLimitPolicy, slot: Slot) -> ThrottledError:
    if slot.reserved:
        why = f"its next slot is in {slot.wait:.3f} s; the call waits in the queue until then"
    else:
        why = f"its next free slot is {slot.wait:.1f} s away, after this call's deadline"
    return ThrottledError(
        f"{tool!r} is held to {policy.describe()} across all workers; {why}; "
        "the service was not called",
        retry_after=slot.wait,
        reserved=slot.reserved,
        suggestion="This tool is busy for everyone: call it less often, batch the work, or "
        "try again after retry_after seconds.",
        details={"rate_limit": policy.to_json(), "shared": True},
    )
