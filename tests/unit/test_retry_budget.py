"""Retry budgets on a real Redis, driven by a ManualClock: exact counts, no sleeping."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.connection import fail_fast_client
from toolexec.errors import ConfigurationError
from toolexec.keys import Keys
from toolexec.layers.batch import Batch
from toolexec.layers.retry_budget import BUCKETS, RetryBudget, budget_name
from toolexec.policies import RetryBudgetPolicy

NAME = "search"
#: 10% of the calls in the last 10 s, and no floor, so that counts are easy to read.
TEN_PERCENT = RetryBudgetPolicy(ratio=0.1, window_s=10.0, min_retries=0)
#: A Redis that refuses at once: a socket path nothing listens on.
DEAD_URL = "unix:///nonexistent/toolexec-test.sock"
#: gRPC A6 defaults scaled down: 10 tokens, a success refunds 0.5.
TOKENS = RetryBudgetPolicy(kind="tokens", max_tokens=10, token_ratio=0.5)


@pytest.fixture
def budget(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> RetryBudget:
    return RetryBudget(rdb, keys, clock=clock)


def calls(budget: RetryBudget, n: int, policy: RetryBudgetPolicy = TEN_PERCENT) -> None:
    for _ in range(n):
        budget.record(NAME, policy, first_attempt=True, failed=False)


def spend_all(budget: RetryBudget, policy: RetryBudgetPolicy = TEN_PERCENT) -> int:
    """Retries granted until the first refusal."""
    granted = 0
    while budget.spend(NAME, policy).allowed:
        granted += 1
        assert granted < 10_000, "the budget never ran out"
    return granted


# -- ratio budgets -------------------------------------------------------------


def test_retries_are_capped_at_the_ratio_of_recent_calls(budget: RetryBudget) -> None:
    calls(budget, 30)
    assert spend_all(budget) == 3
    view = budget.peek(NAME, TEN_PERCENT)
    assert (view.calls, view.retries, view.allowance, view.allowed) == (30, 3, 3.0, False)


def test_only_first_attempts_count_as_calls(budget: RetryBudget) -> None:
    """A retry that reached the service is not a new call: it must not grow its own budget."""
    calls(budget, 10)
    for _ in range(50):
        assert budget.record(NAME, TEN_PERCENT, first_attempt=False, failed=True) is None
    assert budget.peek(NAME, TEN_PERCENT).calls == 10


def test_min_retries_lets_a_quiet_tool_retry_its_rare_failures(budget: RetryBudget) -> None:
    policy = RetryBudgetPolicy(ratio=0.1, window_s=10.0, min_retries=2)
    calls(budget, 1, policy)
    assert spend_all(budget, policy) == 2


def test_the_floor_is_not_added_to_the_ratio(budget: RetryBudget) -> None:
    """max(floor, ratio * calls): under heavy load the bound is the ratio alone."""
    policy = RetryBudgetPolicy(ratio=0.1, window_s=10.0, min_retries=5)
    calls(budget, 200, policy)
    assert spend_all(budget, policy) == 20


def test_calls_and_retries_leave_the_window(budget: RetryBudget, clock: ManualClock) -> None:
    calls(budget, 50)
    assert spend_all(budget) == 5
    clock.advance(TEN_PERCENT.window_s)
    view = budget.peek(NAME, TEN_PERCENT)
    assert (view.calls, view.retries) == (0, 0)
    calls(budget, 20)
    assert spend_all(budget) == 2


def test_the_window_slides_a_bucket_at_a_time(budget: RetryBudget, clock: ManualClock) -> None:
    """Calls from 9 s ago still count; those from the bucket before the window do not."""
    bucket = TEN_PERCENT.window_s / BUCKETS
    calls(budget, 40)
    clock.advance(TEN_PERCENT.window_s - bucket)
    calls(budget, 10)
    assert budget.peek(NAME, TEN_PERCENT).calls == 50
    clock.advance(bucket)
    assert budget.peek(NAME, TEN_PERCENT).calls == 10


def test_state_stays_small_however_long_a_tool_runs(
    budget: RetryBudget, rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    """A bucket per tenth of the window (and a counter), and only the window's retries."""
    floor = RetryBudgetPolicy(ratio=0.1, window_s=10.0, min_retries=5)
    for _ in range(300):
        calls(budget, 1, floor)
        budget.spend(NAME, floor)
        clock.advance(0.5)
    assert rdb.hlen(keys.budget(NAME)) <= BUCKETS + 1
    assert rdb.zcard(keys.budget_retries(NAME)) == 5
    for key in (keys.budget(NAME), keys.budget_retries(NAME)):
        assert 0 < rdb.pttl(key) <= 2 * TEN_PERCENT.window_s * 1000


def test_a_retry_counts_for_a_whole_window_after_it_was_made(
    budget: RetryBudget, clock: ManualClock
) -> None:
    """Retries leave exactly window_s after they were made, never a bucket early: a burst
    of retries at an outage's start cannot be spent again before the window has passed."""
    calls(budget, 100)
    clock.advance(0.5)
    assert spend_all(budget) == 10
    clock.advance(TEN_PERCENT.window_s - 0.5)  # the calls' bucket has left; the retries not
    view = budget.peek(NAME, TEN_PERCENT)
    assert (view.calls, view.retries) == (0, 10)
    calls(budget, 100)
    assert spend_all(budget) == 0
    clock.advance(0.5)
    assert spend_all(budget) == 10


#: Two retries in flight or failed per 10 s, however few the calls.
TWO = RetryBudgetPolicy(ratio=0.1, window_s=10.0, min_retries=2)


def settle(budget: RetryBudget, retry: str, outcome: str, policy: RetryBudgetPolicy = TWO) -> None:
    batch = Batch()
    budget.settle_into(batch, NAME, policy, retry, outcome)
    batch.execute()


def test_a_retry_that_works_pays_its_way(budget: RetryBudget) -> None:
    """Its place is given back at once: the budget limits retries that fail, not those
    that work, so a burst of one-off failures gets all its retries, a few at a time."""
    assert budget.spend(NAME, TWO, retry_id="a:2").allowed
    assert budget.spend(NAME, TWO, retry_id="b:2").allowed
    assert not budget.spend(NAME, TWO, retry_id="c:2").allowed
    settle(budget, "a:2", "ok")
    view = budget.spend(NAME, TWO, retry_id="c:2")
    assert view.allowed
    assert (view.retries, view.succeeded, view.failed) == (2, 1, 0)


def test_retries_that_work_earn_room_for_more_at_most_tenfold(budget: RetryBudget) -> None:
    """The allowance grows with succeeded / failed retries: a burst of one-off failures
    gets its retries after one round; retries that fail as often as they work get double;
    never more than ten times the allowance."""
    for i in range(2):
        assert budget.spend(NAME, TWO, retry_id=f"w{i}").allowed
        settle(budget, f"w{i}", "ok")
    assert budget.peek(NAME, TWO).allowance == 2 * (1 + 2)
    for i in range(40):
        budget.spend(NAME, TWO, retry_id=f"x{i}")
        settle(budget, f"x{i}", "ok")
    assert budget.peek(NAME, TWO).allowance == 2 * 10
    failing = 0
    while budget.spend(NAME, TWO, retry_id=f"f{failing}").allowed:
        settle(budget, f"f{failing}", "fail")
        failing += 1
    view = budget.peek(NAME, TWO)
    # the failures shrink the room they were given: 10 failed, 2 * (1 + 42 / 10) = 10.4
    assert (failing, view.failed, view.succeeded) == (10, 10, 42)
    assert view.allowance == pytest.approx(10.4)


def test_a_retry_that_fails_keeps_its_place_for_the_window(
    budget: RetryBudget, clock: ManualClock
) -> None:
    assert budget.spend(NAME, TWO, retry_id="a:2").allowed
    clock.advance(1.0)
    assert budget.spend(NAME, TWO, retry_id="b:2").allowed
    settle(budget, "a:2", "fail")
    settle(budget, "a:2", "fail")  # sent twice: counted once
    settle(budget, "b:2", "fail")
    clock.advance(2.0)
    view = budget.spend(NAME, TWO, retry_id="c:2")
    assert not view.allowed
    assert (view.retries, view.failed, view.succeeded) == (2, 2, 0)
    assert view.frees_in == pytest.approx(7.0)  # the first was granted 3 s ago
    assert "100%" in view.describe(TWO.window_s)
    clock.advance(7.0)
    assert budget.spend(NAME, TWO, retry_id="c:2").allowed


def test_a_grant_no_attempt_used_is_given_back_without_counting(budget: RetryBudget) -> None:
    assert budget.spend(NAME, TWO, retry_id="a:2").allowed
    assert budget.spend(NAME, TWO, retry_id="b:2").allowed
    settle(budget, "a:2", "release")
    view = budget.spend(NAME, TWO, retry_id="c:2")
    assert view.allowed
    assert (view.succeeded, view.failed) == (0, 0)


def test_a_grant_asked_for_again_is_the_same_grant(budget: RetryBudget) -> None:
    """A spend sent again after a broken connection neither spends twice nor is refused."""
    assert budget.spend(NAME, TWO, retry_id="a:2").allowed
    assert budget.spend(NAME, TWO, retry_id="b:2").allowed
    view = budget.spend(NAME, TWO, retry_id="b:2")
    assert view.allowed and view.retries == 2


def test_settled_retries_leave_the_counts_with_the_window(
    budget: RetryBudget, clock: ManualClock
) -> None:
    assert budget.spend(NAME, TWO, retry_id="a:2").allowed
    settle(budget, "a:2", "ok")
    clock.advance(TWO.window_s + 1)
    view = budget.peek(NAME, TWO)
    assert (view.retries, view.succeeded, view.failed) == (0, 0, 0)


def test_retries_never_exceed_the_allowance_even_by_one(budget: RetryBudget) -> None:
    """99 calls allow 9.9 retries: 9, since a tenth retry would make 10 > 9.9."""
    calls(budget, 99)
    assert spend_all(budget) == 9


def test_peek_changes_nothing(budget: RetryBudget) -> None:
    calls(budget, 10)
    for _ in range(5):
        assert budget.peek(NAME, TEN_PERCENT).allowed
    assert budget.peek(NAME, TEN_PERCENT).retries == 0


def test_two_workers_share_one_budget(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> None:
    first, second = RetryBudget(rdb, keys, clock=clock), RetryBudget(rdb, keys, clock=clock)
    calls(first, 10)
    calls(second, 10)
    assert first.spend(NAME, TEN_PERCENT).allowed
    assert second.spend(NAME, TEN_PERCENT).allowed
    assert not first.spend(NAME, TEN_PERCENT).allowed
    assert not second.spend(NAME, TEN_PERCENT).allowed


def test_racing_spenders_never_overdraw(budget: RetryBudget) -> None:
    """Check and count are one Lua script: 64 threads at once get exactly the allowance."""
    calls(budget, 100)
    barrier = threading.Barrier(64)

    def spend() -> bool:
        barrier.wait()
        return budget.spend(NAME, TEN_PERCENT).allowed

    with ThreadPoolExecutor(64) as pool:
        granted = sum(pool.map(lambda _: spend(), range(64)))
    assert granted == 10


def test_budgets_are_separate_per_name(budget: RetryBudget) -> None:
    calls(budget, 10)
    assert spend_all(budget) == 1
    assert budget.peek("other_tool", TEN_PERCENT).calls == 0
    budget.record("other_tool", TEN_PERCENT, first_attempt=True, failed=False)
    assert budget.peek("other_tool", TEN_PERCENT).calls == 1


def test_a_budget_per_host_is_named_after_the_host() -> None:
    per_host = RetryBudgetPolicy(key_argument="url")
    args = {"url": "https://api.example.com/v1/x"}
    assert budget_name("http_request", per_host, args) == "http_request@api.example.com"
    assert budget_name("http_request", RetryBudgetPolicy(), args) == "http_request"


def test_a_disabled_budget_allows_everything_and_writes_nothing(
    budget: RetryBudget, rdb: redis.Redis, keys: Keys
) -> None:
    off = RetryBudgetPolicy(enabled=False, min_retries=0)
    budget.record(NAME, off, first_attempt=True, failed=True)
    assert all(budget.spend(NAME, off).allowed for _ in range(100))
    assert not rdb.exists(keys.budget(NAME))


# -- token budgets (gRPC A6) ---------------------------------------------------


def failures(budget: RetryBudget, n: int) -> float | None:
    view = None
    for _ in range(n):
        view = budget.record(NAME, TOKENS, first_attempt=True, failed=True)
    assert view is not None
    return view.tokens


def test_a_token_bucket_starts_full(budget: RetryBudget) -> None:
    view = budget.peek(NAME, TOKENS)
    assert view.allowed and view.tokens == 10


def test_each_failure_costs_a_token_and_retries_stop_at_half(budget: RetryBudget) -> None:
    assert failures(budget, 4) == 6
    assert budget.spend(NAME, TOKENS).allowed
    assert failures(budget, 1) == 5
    assert not budget.spend(NAME, TOKENS).allowed  # at half: throttled (A6: "<=")


def test_a_success_refunds_a_fraction_of_a_token(budget: RetryBudget) -> None:
    failures(budget, 5)
    view = budget.record(NAME, TOKENS, first_attempt=False, failed=False)
    assert view is not None and view.tokens == 5.5
    assert budget.spend(NAME, TOKENS).allowed


def test_tokens_stay_between_zero_and_the_maximum(budget: RetryBudget) -> None:
    assert failures(budget, 50) == 0
    for _ in range(100):
        view = budget.record(NAME, TOKENS, first_attempt=True, failed=False)
    assert view is not None and view.tokens == 10


def test_spending_a_token_budget_takes_nothing(budget: RetryBudget) -> None:
    """A6 charges failures, not retries: asking leaves the bucket as it was."""
    failures(budget, 2)
    for _ in range(20):
        assert budget.spend(NAME, TOKENS).tokens == 8


def test_an_idle_token_bucket_expires(budget: RetryBudget, rdb: redis.Redis, keys: Keys) -> None:
    failures(budget, 1)
    assert 0 < rdb.ttl(keys.budget(NAME)) <= budget.idle_ttl_s


# -- Redis away, and bad policies ----------------------------------------------


def test_an_unreachable_redis_lets_retries_through_and_warns_once(
    keys: Keys, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    dead = RetryBudget(fail_fast_client(DEAD_URL), keys, clock=clock)
    with caplog.at_level(logging.WARNING, logger="toolexec.stores.failopen"):
        assert dead.spend(NAME, TEN_PERCENT).allowed
        assert dead.record(NAME, TEN_PERCENT, first_attempt=True, failed=True) is not None
        clock.advance(2.0)
        assert dead.spend(NAME, TEN_PERCENT).allowed
    warnings = [r for r in caplog.records if "retry budgets cannot reach Redis" in r.message]
    assert len(warnings) == 1


def test_while_redis_is_down_the_budget_does_not_ask_again_at_once(
    keys: Keys, clock: ManualClock
) -> None:
    dead = RetryBudget(fail_fast_client(DEAD_URL), keys, clock=clock)
    dead.spend(NAME, TEN_PERCENT)
    assert dead.fail_open.down()
    clock.advance(dead.fail_open.retry_s)
    assert not dead.fail_open.down()


@pytest.mark.parametrize(
    "fields",
    [
        {"ratio": 1.5},
        {"ratio": -0.1},
        {"window_s": 0},
        {"min_retries": -1},
        {"max_tokens": 0},
        {"max_tokens": 5000},
        {"token_ratio": 0},
        {"kind": "leaky"},
    ],
)
def test_a_nonsensical_budget_is_refused_at_declaration(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="invalid retry budget"):
        RetryBudgetPolicy(**fields)  # type: ignore[arg-type]


def test_a_policy_survives_the_catalog_round_trip() -> None:
    policy = RetryBudgetPolicy(kind="tokens", max_tokens=20, token_ratio=0.2, key_argument="url")
    assert RetryBudgetPolicy.from_json(policy.to_json()) == policy
