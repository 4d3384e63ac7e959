"""When to retry and how long to wait: pure functions of the attempt.

The delay before the next attempt depends only on the policy, the attempt
number, the previous delay (for decorrelated jitter), the error's Retry-After,
the time now and the call's deadline, so it is tested without a clock. Celery's
own backoff is whole seconds and knows nothing of Retry-After or deadlines
(docs/background.md, Celery), so the worker computes the countdown here and hands it to
``Task.retry``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from toolexec.errors import TRANSIENT_TYPES, ConfigurationError, ErrorType

__all__ = ["Jitter", "RetryDecision", "RetryPolicy", "decide"]


class Jitter(StrEnum):
    """How a backoff is spread; Brooker (2015) compares them under contention."""

    NONE = "none"  # plain exponential: every client retries in lock-step
    FULL = "full"  # uniform(0, expo): fewest calls under contention
    EQUAL = "equal"  # expo/2 + uniform(0, expo/2): never retries at once
    DECORRELATED = "decorrelated"  # min(cap, uniform(base, previous * 3))


@dataclass(frozen=True)
class RetryPolicy:
    """How many times to try a tool and how long to wait between tries.

    ``base`` and ``cap`` are seconds; attempt ``n`` (1-based) that failed is
    followed by ``min(cap, base * factor ** (n - 1))`` before jitter.
    """

    max_attempts: int = 3
    base: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    jitter: Jitter = Jitter.FULL
    retry_on: frozenset[ErrorType] = field(default=TRANSIENT_TYPES)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, not {self.max_attempts}")
        # Written as 'not (x >= 0)' so that NaN, which fails every comparison, is refused too.
        if not (self.base >= 0 and self.cap >= 0 and self.factor >= 1):
            raise ConfigurationError(
                f"backoff needs base >= 0, cap >= 0 and factor >= 1 "
                f"(got base={self.base}, cap={self.cap}, factor={self.factor})"
            )
        try:
            object.__setattr__(self, "jitter", Jitter(self.jitter))
            object.__setattr__(self, "retry_on", frozenset(ErrorType(t) for t in self.retry_on))
        except ValueError as exc:  # a declaration error, like the checks above
            raise ConfigurationError(f"retry policy: {exc}") from exc

    def exponential(self, attempt: int) -> float:
        """The un-jittered delay after failed attempt ``attempt`` (1-based)."""
        exponent = min(attempt - 1, 64)  # beyond this the cap has long been reached
        return min(self.cap, self.base * self.factor**exponent)

    def backoff(self, attempt: int, previous: float | None, rng: random.Random) -> float:
        """The jittered delay after failed attempt ``attempt``."""
        expo = self.exponential(attempt)
        if self.jitter is Jitter.FULL:
            return rng.uniform(0.0, expo)
        if self.jitter is Jitter.EQUAL:
            return expo / 2 + rng.uniform(0.0, expo / 2)
        if self.jitter is Jitter.DECORRELATED:
            last = self.base if previous is None else max(previous, self.base)
            return min(self.cap, rng.uniform(self.base, last * 3))
        return expo


@dataclass(frozen=True)
class RetryDecision:
    """Whether to try again, after how long, and why."""

    retry: bool
    delay: float = 0.0
    reason: Literal["retry", "not_retryable", "attempts_exhausted", "deadline"] = "retry"


def decide(
    policy: RetryPolicy,
    *,
    attempt: int,
    error_type: ErrorType,
    retry_after: float | None,
    now: float,
    deadline: float,
    previous_delay: float | None = None,
    rng: random.Random | None = None,
) -> RetryDecision:
    """Decide what follows failed attempt ``attempt`` (1-based).

    Retry-After is a floor on the delay, not capped: a server that asks for
    more time than our cap would only refuse an earlier retry. A retry that
    would start at or after the deadline is never scheduled.
    """
    if error_type not in policy.retry_on:
        return RetryDecision(False, reason="not_retryable")
    if attempt >= policy.max_attempts:
        return RetryDecision(False, reason="attempts_exhausted")
    delay = policy.backoff(attempt, previous_delay, rng or random.Random())
    if retry_after is not None:
        delay = max(delay, retry_after)
    if now + delay >= deadline:
        return RetryDecision(False, delay=delay, reason="deadline")
    return RetryDecision(True, delay=delay)
