"""What travels with a call besides its arguments.

The deadline is absolute (Unix epoch seconds, set by the caller) so that it
bounds queueing, every attempt and every backoff together, on whichever worker
picks the message up. Accumulated run and backoff time ride along on retries so
the final result can say where the time went.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["CallContext"]


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
    #: Times a shared rate limit deferred the call (``toolexec.ratelimit``): Celery
    #: counts those as retries, but they used no attempt.
    deferrals: int = 0
    #: The attempt whose rate-limit slot was reserved before it was deferred: it
    #: runs without asking the limiter again.
    slot_for: int | None = None
    #: Some attempt of this call met an injected fault (``toolexec.faults``).
    injected: bool = False
    #: A fallback chain in progress (``toolexec.fallback.state.ChainState`` as JSON): the
    #: primary's error, the steps tried, the original arguments.
    fallback: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CallContext:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)

    def remaining(self, now: float) -> float:
        return self.deadline - now

    def after_attempt(self, run_s: float) -> CallContext:
        return replace(self, run_s=self.run_s + run_s)

    def before_retry(self, delay: float) -> CallContext:
        return replace(self, previous_delay=delay, backoff_s=self.backoff_s + delay)

    def deferred(self, attempt: int) -> CallContext:
        """Before waiting in the queue for the rate-limit slot reserved for ``attempt``."""
        return replace(self, deferrals=self.deferrals + 1, slot_for=attempt)
