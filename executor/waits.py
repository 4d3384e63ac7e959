"""Whether a call a defence refused should wait for it instead of ending now.

A blip and an outage look alike to the first refusal: the retry budget is full,
the breaker is open. They differ in what follows. In a blip the retries the
budget granted are succeeding (each pays its way and frees its place) and the
breaker's first, short open ends with a probe that succeeds; in an outage the
retries fail and the probe fails. So a refused call waits (the executor's
``Defer``) only while the evidence says blip, and only for a bounded time
within its deadline; otherwise it ends at once, saying which defence ended it.

Pure functions of plain numbers: tested without a clock or Redis. The
executor checks the deadline and spreads the waits (``toolexec.pipeline.execution``).
"""

from __future__ import annotations

__all__ = ["POLL_S", "breaker_wait", "budget_wait", "failing_share"]

#: How soon a waiting call asks again while the outcomes it waits for are in flight:
#: a retry or a probe to a service that answers takes milliseconds to a second.
POLL_S = 0.25

#: A share of failing retries at or above which the budget is protecting an outage.
OUTAGE_SHARE = 0.5


def failing_share(failed: float, succeeded: float) -> float | None:
    """Failed retries over retries that settled in the window; None while none has."""
    settled = failed + succeeded
    return failed / settled if settled > 0 else None


def budget_wait(
    *,
    retries: float,
    failed: float,
    succeeded: float,
    frees_in: float,
    max_wait_s: float,
    waited_s: float,
) -> float | None:
    """Seconds to wait for a ratio budget that refused a retry, or None: end now.

    ``retries`` are those the window holds (in flight or failed), ``failed`` and
    ``succeeded`` those that settled, ``frees_in`` when the oldest leaves the
    window. Failing retries mean an outage: waiting would only delay the answer;
    a budget that holds no retry at all (its floor is zero) has nothing to wait for.
    Retries in flight will settle soon (and free their places if they succeed):
    ask again shortly (then after as long as waited so far). Otherwise wait for the
    oldest to leave the window.
    """
    share = failing_share(failed, succeeded)
    if retries <= 0 or (share is not None and share >= OUTAGE_SHARE):
        return None  # nothing will free a place, or what frees it is failing
    in_flight = retries - failed > 0
    wait = _poll(waited_s) if in_flight else max(frees_in, POLL_S)
    return _within(wait, max_wait_s, waited_s)


def breaker_wait(
    *,
    state: str | None,
    retry_after: float | None,
    trips: int,
    max_wait_s: float,
    waited_s: float,
) -> float | None:
    """Seconds to wait for a breaker that refused a call, or None: end now.

    A half-open breaker's probes are in flight: their answer comes soon. A first
    trip is short and may be a blip: wait for its probe. A breaker open again
    after a probe failed (``trips`` > 1), isolated, or unreachable is an outage
    or an operator's decision: say so at once.
    """
    if state == "half_open":
        return _within(_poll(waited_s), max_wait_s, waited_s)
    if state != "open" or retry_after is None or trips > 1:
        return None
    return _within(retry_after, max_wait_s, waited_s)


def _poll(waited_s: float) -> float:
    """The next look while outcomes are in flight: soon, then as long as waited so far.

    Doubling keeps a hundred waiting calls from asking the queue and Redis
    several times a second each when the answer takes longer than usual.
    """
    return max(POLL_S, waited_s)


def _within(wait: float, max_wait_s: float, waited_s: float) -> float | None:
    """``wait``, unless it would take the call's waiting past ``max_wait_s``."""
    return wait if waited_s + wait <= max_wait_s else None
