"""The tools bench/storm.py runs on real workers: contention on a row, and an outage.

``row_update_<kind>`` reads a versioned row and writes it back conditionally,
one tool per backoff kind of Brooker's experiment (and ``_x5`` at five times
its time scale), with retries unlimited in
practice and no budget or breaker (they would cut the contention short).
``outage_<setup>`` calls an endpoint that an outage takes down, with four
setups of the same three attempts: alone, with the retry budget (a ratio, or a
token bucket), and with the ratio budget and a circuit breaker.
``defaults_<blip|down>`` are a user's tools at the default policies but for
four attempts, for (d).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from toolexec import Jitter, RetryPolicy, TransientError, tool
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy

#: Brooker's base and cap, in seconds.
BASE_S = 0.005
CAP_S = 2.0
#: Retries "unlimited": far more than any run needs.
UNLIMITED = 1000
#: (b) runs at Brooker's time scale, or with every duration (hops, base, cap) times 5:
#: calls should not change, but the broker's own delays weigh less against the hops.
TIME_SCALES = (1, 5)


def row_policies(scale: int = 1) -> dict[str, RetryPolicy]:
    """How each kind of (a) and (b) spaces its retries, as toolexec RetryPolicies.

    Brooker's "none" is no delay at all: a base of 0.
    """
    base, cap = BASE_S * scale, CAP_S * scale

    def policy(jitter: Jitter, base: float = base) -> RetryPolicy:
        return RetryPolicy(max_attempts=UNLIMITED, base=base, cap=cap, jitter=jitter)

    return {
        "none": policy(Jitter.NONE, base=0.0),
        "exponential": policy(Jitter.NONE),
        "full": policy(Jitter.FULL),
        "equal": policy(Jitter.EQUAL),
        "decorrelated": policy(Jitter.DECORRELATED),
    }


def row_tool(kind: str, scale: int) -> str:
    return f"row_update_{kind}" if scale == 1 else f"row_update_{kind}_x{scale}"


NO_BREAKER = BreakerPolicy(enabled=False)
NO_BUDGET = RetryBudgetPolicy(enabled=False)
#: Opens on half the last 20 calls failing; probes again after 2 s.
OUTAGE_BREAKER = BreakerPolicy(
    consecutive_failures=10, failure_rate=0.5, window_size=20, min_calls=10, open_s=2.0
)
#: The setups of (c): what each adds to three attempts with full jitter. The
#: budgets are the defaults: a 10% ratio, and gRPC A6's token bucket.
OUTAGE_SETUPS: dict[str, tuple[RetryBudgetPolicy, BreakerPolicy]] = {
    "attempts": (NO_BUDGET, NO_BREAKER),
    "budget": (RetryBudgetPolicy(), NO_BREAKER),
    "token_budget": (RetryBudgetPolicy(kind="tokens"), NO_BREAKER),
    "budget_breaker": (RetryBudgetPolicy(), OUTAGE_BREAKER),
}

#: One connection pool for every call of this worker process.
_HTTP = httpx.Client(timeout=10.0, limits=httpx.Limits(max_connections=256))


def _row_update() -> Callable[[str, float], int]:
    def update(url: str, start_at: float = 0.0) -> int:
        """Read the row's version, then write it back on condition that it has not changed.

        The first attempt waits until ``start_at`` (epoch seconds), so that all
        agents start together as in Brooker's experiment, whenever the workers
        picked their calls up; retries come later and do not wait.
        """
        time.sleep(max(0.0, start_at - time.time()))
        version = _HTTP.get(url).json()["version"]
        answer = _HTTP.put(url, params={"version": version})
        if answer.status_code == 409:
            raise TransientError("the row changed between read and write (409 Conflict)")
        answer.raise_for_status()
        written: int = answer.json()["version"]
        return written

    return update


def _work() -> Callable[[str], httpx.Response]:
    def work(url: str) -> httpx.Response:
        """GET the endpoint; toolexec classifies a 503 as unavailable."""
        return _HTTP.get(url)

    return work


for _scale in TIME_SCALES:
    for _kind, _policy in row_policies(_scale).items():
        tool(
            name=row_tool(_kind, _scale),
            timeout=10,
            retry=_policy,
            breaker=NO_BREAKER,
            retry_budget=NO_BUDGET,
        )(_row_update())

for _setup, (_budget, _breaker) in OUTAGE_SETUPS.items():
    tool(
        name=f"outage_{_setup}",
        timeout=5,
        max_attempts=3,
        backoff_base=0.05,
        backoff_cap=1.0,
        breaker=_breaker,
        retry_budget=_budget,
    )(_work())


#: (d): a user's tool at the default policies but for four attempts.
for _scenario in ("blip", "down"):
    tool(name=f"defaults_{_scenario}", max_attempts=4)(_work())
