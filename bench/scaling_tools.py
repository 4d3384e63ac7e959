"""Tools of bench/scaling.py: one per feature whose cost the capacity model needs."""

from __future__ import annotations

import threading

from toolexec import tool
from toolexec.errors import TransientError
from toolexec.fallback import Alternative
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy

NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER)
def scale_plain() -> str:
    """Answer at once: the executor's own cost, no optional feature."""
    return "ok"


@tool(timeout=30, max_attempts=1)
def scale_breaker() -> str:
    """The same with the shared circuit breaker (the default policy)."""
    return "ok"


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER, side_effects=True)
def scale_idempotent(n: int) -> int:
    """A side-effecting call, made with an idempotency key."""
    return n


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER, payload_threshold_bytes=1_000)
def scale_payload(size: int) -> str:
    """A result over the offload threshold: stored apart, a preview in the reply."""
    return "x" * size


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER)
def scale_echo(n: int) -> str:
    """Answer with its argument: each round of a guarded run differs from the last."""
    return f"echo-{n}"


#: Arguments seen by this worker process: the retry tool fails each one's first attempt.
_SEEN: set[str] = set()
_SEEN_LOCK = threading.Lock()


#: Every call of the bench retries once: a budget that still runs (its script is part of
#: a retry's cost) but never refuses (the default allows 10% of calls to retry).
EVERY_CALL_RETRIES = RetryBudgetPolicy(ratio=1.0, min_retries=1_000_000)


@tool(
    timeout=30,
    max_attempts=2,
    backoff_base=0.01,
    backoff_cap=0.01,
    breaker=NO_BREAKER,
    retry_budget=EVERY_CALL_RETRIES,
)
def scale_retry(key: str) -> str:
    """Fail the first attempt of each call, answer the second: a call that retries once.

    The bench runs one worker process, so the retry meets the same ``_SEEN``.
    """
    with _SEEN_LOCK:
        first = key not in _SEEN
        _SEEN.add(key)
    if first:
        raise TransientError("the first attempt of every call fails, by design")
    return "ok"


@tool(timeout=30, max_attempts=1, breaker=NO_BREAKER)
def scale_alternative() -> str:
    """The fallback chain's one step: answers at once."""
    return "ok"


@tool(
    timeout=30,
    max_attempts=1,
    breaker=NO_BREAKER,
    fallbacks=[Alternative("scale_alternative", needs_s=1.0)],
)
def scale_falls_back() -> str:
    """Always fails, once: its fallback chain of one (an alternative tool) answers."""
    raise TransientError("the primary always fails, by design")
