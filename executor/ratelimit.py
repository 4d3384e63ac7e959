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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.errors import ConfigurationError, ThrottledError
from toolexec.failopen import REDIS_ERRORS, FailOpen
from toolexec.keys import Keys
from toolexec.layers import Attempt, Layer, Outcome, Proceed
from toolexec.lua import script_source

__all__ = ["RateLimitLayer", "RateLimitPolicy", "RateLimiter", "Slot"]


@dataclass(frozen=True)
class RateLimitPolicy:
    """At most ``rate`` calls per second for the whole fleet, ``burst`` of them at once."""

    rate: float
    burst: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ConfigurationError(f"a rate limit needs a positive rate, not {self.rate}")
        if self.burst < 1:
            raise ConfigurationError(f"a rate limit's burst must be at least 1, not {self.burst}")

    @property
    def interval(self) -> float:
        """Seconds between calls at the sustained rate."""
        return 1.0 / self.rate

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RateLimitPolicy:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def describe(self) -> str:
        return f"{self.rate:g}/s, burst {self.burst}"


@dataclass(frozen=True)
class Slot:
    """When a call may go: now (``wait`` 0), later (``reserved``), or not before its deadline."""

    wait: float
    reserved: bool

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
        self._reserve = client.register_script(script_source("rate_limit"))

    def now(self) -> float:
        return (self.clock or SystemClock()).now()

    def reserve(self, name: str, policy: RateLimitPolicy, max_wait: float) -> Slot:
        """The next slot of ``name``, taken if it comes within ``max_wait`` seconds."""
        if self.fail_open.down():
            return Slot(wait=0.0, reserved=True)
        now = "" if self.clock is None else repr(float(self.clock.now()))
        args: list[str | int] = [now, repr(policy.interval), policy.burst, repr(max(0.0, max_wait))]
        try:
            raw = self._reserve(keys=[self.keys.rate_limit(name)], args=args)
        except REDIS_ERRORS as exc:
            self.fail_open.failed(exc, "calls are not rate limited meanwhile")
            return Slot(wait=0.0, reserved=True)
        return Slot(wait=float(raw[1]), reserved=bool(int(raw[0])))

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

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        policy = self.policy_for(attempt)
        if policy is None or attempt.ctx.slot_for == attempt.number:
            return proceed()  # no limit, or this attempt's slot was reserved before it was deferred
        left = attempt.ctx.deadline - self.clock.now()
        slot = self.limiter.reserve(attempt.tool, policy, left)
        if slot.now:
            return proceed()
        return Outcome(failure=_throttled(attempt.tool, policy, slot), ran=False)


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
