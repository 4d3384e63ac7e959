"""Tools of bench/scaling.py: one per feature whose cost the capacity model needs."""

from __future__ import annotations

from toolexec import tool
from toolexec.policies import BreakerPolicy

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
