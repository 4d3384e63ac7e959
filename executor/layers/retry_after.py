"""The deployment's cap on Retry-After, as a layer right around the tool body.

A server's Retry-After is already bounded to a day when it is parsed
(:func:`toolexec.bounds.bounded_retry_after`); this layer applies the
deployment's own, lower cap (``TOOLEXEC_RETRY_AFTER_CAP_S``). It sits inside
every layer that reads a failure's Retry-After and outside fault injection, so
the retry countdown and the breaker's open time see the same capped value: a
server answering ``Retry-After: 999999999`` gets the call retried, and the
breaker reopened, ``cap_s`` later at most instead of in 31 years.
"""

from __future__ import annotations

from dataclasses import replace

from toolexec.bounds import DEFAULT_RETRY_AFTER_CAP_S, bounded_retry_after
from toolexec.errors import TransientError
from toolexec.layers import Attempt, Layer, Outcome, Proceed

__all__ = ["RetryAfterCap"]


class RetryAfterCap(Layer):
    """Holds every failure's Retry-After to ``cap_s`` seconds."""

    name = "retry_after_cap"

    def __init__(self, cap_s: float = DEFAULT_RETRY_AFTER_CAP_S) -> None:
        self.cap_s = cap_s

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        outcome = proceed()
        failure = outcome.failure
        if not isinstance(failure, TransientError) or failure.retry_after is None:
            return outcome
        capped = bounded_retry_after(failure.retry_after, self.cap_s)
        if capped == failure.retry_after:
            return outcome
        failure.retry_after = capped
        return replace(outcome, failure=failure)
