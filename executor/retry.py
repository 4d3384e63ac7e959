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
from dataclasses import dataclass
from typing import Literal

from toolexec.errors import ErrorType
from toolexec.policies import RetryPolicy

__all__ = ["RetryDecision", "decide"]


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
