"""Retry budget, shared rate limit and fault injection on two real worker processes.

Both workers import ``storm_protection_tools`` and consume its queue, with fault
injection enabled (a test setup, as it must be); the service is the
FlakyServer, which records every request it gets.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from integration_support import fleet_of
from storm_protection_tools import BUDGET, FIVE_PER_S, QUEUE

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.layers.faults import FaultConfig, FaultStore
from toolexec.layers.ratelimit import RateLimiter
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

CALLS = 40


@pytest.fixture(scope="module")
def fleet(
    settings: Settings,
    worker_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[WorkerProcess]]:
    """Two workers on the storm queue, fault injection enabled."""
    env = {**worker_env, "TOOLEXEC_FAULTS_ENABLED": "true"}
    logs = tmp_path_factory.mktemp("storm")
    with fleet_of(
        "storm_protection_tools", env, QUEUE, 8, logs, settings.redis_url or "", settings.key_prefix
    ) as procs:
        yield procs


@pytest.fixture(scope="module")
def storm_client(settings: Settings, fleet: list[WorkerProcess]) -> Iterator[ToolClient]:
    with ToolClient(settings) as client:
        yield client


def calls_served(proc: WorkerProcess, tool: str) -> int:
    assert proc.log_path is not None
    return len(re.findall(rf"tool={tool} ", proc.log_path.read_text()))


def test_under_total_failure_retries_stay_within_the_fleet_wide_budget(
    storm_client: ToolClient, flaky: FlakyServer, fleet: list[WorkerProcess]
) -> None:
    """Given a service that answers 503 to everything and two workers sharing one budget,
    when 40 calls with 4 attempts each run at once,
    then the service sees at most 40 + max(3, 10% of 40) requests instead of 160,
    and the calls the budget cut short say retry_budget_exhausted."""
    url = flaky.script(flaky.unique_path("down"), Reply(503))

    results = storm_client.call_many([("budgeted_fetch", {"url": url})] * CALLS, timeout=30)

    allowance = max(BUDGET.min_retries, BUDGET.ratio * CALLS)
    hits = len(flaky.hits(url.removeprefix(flaky.url)))
    assert CALLS <= hits <= CALLS + allowance
    kinds = {r.error.type for r in results if r.error is not None}
    assert kinds <= {ErrorType.UNAVAILABLE, ErrorType.RETRY_BUDGET_EXHAUSTED}
    cut = [r for r in results if r.error and r.error.type is ErrorType.RETRY_BUDGET_EXHAUSTED]
    assert len(cut) >= CALLS - allowance
    assert all(r.error and r.error.retryable and r.error.suggestion for r in cut)
    assert all(calls_served(proc, "budgeted_fetch") > 0 for proc in fleet)


def test_calls_over_the_shared_rate_limit_wait_in_the_queue_without_using_attempts(
    storm_client: ToolClient, flaky: FlakyServer, settings: Settings
) -> None:
    """Given a tool limited to 5 calls a second fleet-wide and never retried (1 attempt),
    whose next free slot is known (the test reserves 25 slots first, as earlier callers
    would have: 5 s of them),
    when 6 calls arrive at once on two workers,
    then all succeed after one attempt each, and none reaches the service before its slot:
    the k-th arrival is at least k - 1 slots (0.2 s each) after the first free one, so
    never two in one slot, and the last a second after the first slot (without the limit
    they would all arrive within milliseconds, seconds before the first free slot).

    What the limiter decides is when each call may go; it never lets one go early. A call
    can reach the service later than its slot on a loaded machine, and two late calls can
    then land close together (1 ms apart measured), so arrivals are held to their slots,
    which are exact here, rather than to each other. Measured under load average 12: the
    calls 0.8-2.3 s after their slots; with the limit removed from the tool, 0.7-1.0 s
    before the first one (a failure)."""
    url = flaky.script(flaky.unique_path("limited"), Reply(200))
    limiter = RateLimiter(redis_client(settings.redis_url or ""), Keys(settings.key_prefix))
    primed = [limiter.reserve("limited_fetch", FIVE_PER_S, 10.0) for _ in range(25)]
    assert all(slot.reserved for slot in primed) and primed[-1].due is not None
    first_free = float(primed[-1].due)  # Redis TIME: this host's clock, as the hits' stamps

    results = storm_client.call_many([("limited_fetch", {"url": url})] * 6, timeout=30)

    assert [(r.status, r.attempts) for r in results] == [("ok", 1)] * 6
    arrivals = sorted(hit.at - first_free for hit in flaky.hits(url.removeprefix(flaky.url)))
    assert len(arrivals) == 6
    assert all(at >= 0.2 * k for k, at in enumerate(arrivals)), arrivals


def test_injected_faults_follow_the_seed_across_workers_and_are_marked(
    storm_client: ToolClient, flaky: FlakyServer, settings: Settings
) -> None:
    """Given a fault config (half the attempts fail with not_found, seed 7) set at run time,
    when 16 calls run one after another on whichever worker takes them,
    then exactly the attempts the seed picks fail, each result saying injected,
    and the spared calls reach the service."""
    url = flaky.script(flaky.unique_path("chaos"), Reply(200))
    config = FaultConfig(rate=0.5, error=ErrorType.NOT_FOUND, seed=7)
    store = FaultStore(redis_client(settings.redis_url or ""), Keys(settings.key_prefix))
    store.set("chaotic_fetch", config)
    # Workers re-read fault configs on a call once a second has passed since their last
    # read (FaultLayer.refresh_s): any call made a second after this set sees it, however
    # loaded the machine. Not a race a slow machine can lose, so a wait on time is right.
    time.sleep(1.2)
    try:
        results = [storm_client.call("chaotic_fetch", {"url": url}) for _ in range(16)]
    finally:
        store.clear("chaotic_fetch")

    expected = [config.plan(n).injected for n in range(1, 17)]
    assert [r.injected for r in results] == expected
    assert all(r.error and r.error.type is ErrorType.NOT_FOUND for r in results if r.injected)
    assert all(r.ok for r in results if not r.injected)
    assert len(flaky.hits(url.removeprefix(flaky.url))) == expected.count(False)
