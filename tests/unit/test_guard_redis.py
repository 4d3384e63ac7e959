"""RunGuard keeps a run's state in a real Redis: any process picks the run up, no update is lost."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.errors import ErrorType, RedisUnavailableError
from toolexec.guard import GuardedResult, Ruling, RunGuard
from toolexec.keys import RUN_IDLE_TTL_S, Keys
from toolexec.policies import RunBudget
from toolexec.results import ToolResult


def play(guard: RunGuard, calls: Sequence[tuple[str, dict[str, Any]]]) -> list[GuardedResult]:
    """One round: the calls the guard allows 'run' and echo their arguments."""
    plan = guard.begin_round(calls, alternatives=["search", "lookup"])
    results = [
        ToolResult(status="ok", tool=tool, call_id=uuid.uuid4().hex, data=args)
        if decision.ruling.runs
        else None
        for (tool, args), decision in zip(calls, plan.decisions, strict=True)
    ]
    return guard.end_round(plan, results)


def test_a_new_guard_in_a_new_connection_continues_the_run_where_the_last_one_stopped(
    redis_url: str, keys: Keys, clock: ManualClock
) -> None:
    """Given a run nudged by one client, when another process takes it over, it climbs on."""
    first = RunGuard(
        "run-a",
        RunBudget(repeat_threshold=2),
        redis=redis_client(redis_url),
        keys=keys,
        clock=clock,
    )
    assert [play(first, [("search", {"q": "x"})])[0].ruling for _ in range(2)] == [
        Ruling.RUN,
        Ruling.NUDGE,
    ]
    first.redis.close()

    second = RunGuard("run-a", redis=redis_client(redis_url), keys=keys, clock=clock)
    refused = play(second, [("search", {"q": "x"})])[0]

    assert refused.ruling is Ruling.DISABLE, "the stored budget (threshold 2) was adopted"
    assert second.view().budget.repeat_threshold == 2
    assert play(second, [("search", {"q": "x"})])[0].ruling is Ruling.ABORT
    second.redis.close()


def test_a_guard_given_a_budget_replaces_the_stored_one(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    """An operator can extend a run that hit its step limit."""
    tight = RunGuard("run-b", RunBudget(max_steps=1), redis=rdb, keys=keys, clock=clock)
    play(tight, [("search", {"q": "a"})])
    assert play(tight, [("search", {"q": "b"})])[0].ruling is Ruling.EXHAUSTED

    tight.forget()
    wider = RunGuard("run-b", RunBudget(max_steps=5), redis=rdb, keys=keys, clock=clock)
    assert play(wider, [("search", {"q": "b"})])[0].ruling is Ruling.RUN


def test_the_view_reports_counts_elapsed_and_remaining_time(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    guard = RunGuard("run-c", RunBudget(max_wall_s=100), redis=rdb, keys=keys, clock=clock)
    assert guard.view().exists is False

    play(guard, [("search", {"q": "a"}), ("lookup", {"id": 1})])
    clock.advance(30)
    view = guard.view()

    assert (view.exists, view.rounds, view.tool_errors, view.ended) == (True, 1, 0, None)
    assert view.elapsed_s == 30 and view.remaining_s == 70


def test_the_state_key_expires_a_day_after_the_last_round_or_after_a_longer_wall_budget(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    short = RunGuard("run-d", RunBudget(max_wall_s=60), redis=rdb, keys=keys, clock=clock)
    long = RunGuard("run-e", RunBudget(max_wall_s=3 * 86_400), redis=rdb, keys=keys, clock=clock)
    play(short, [("search", {"q": "a"})])
    play(long, [("search", {"q": "a"})])

    assert RUN_IDLE_TTL_S - 5 <= rdb.ttl(keys.run("run-d")) <= RUN_IDLE_TTL_S
    assert rdb.ttl(keys.run("run-e")) > 3 * 86_400


def test_concurrent_token_reports_from_many_threads_are_all_counted(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    """Compare-and-set: a report that races another is decided again, never lost."""
    guard = RunGuard("run-f", RunBudget(max_tokens=10_000), redis=rdb, keys=keys, clock=clock)

    def report() -> None:
        for _ in range(25):
            guard.report_tokens(4)

    threads = [threading.Thread(target=report) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert guard.view().tokens == 400


def test_reported_tokens_over_the_budget_end_the_run_at_the_next_round(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    guard = RunGuard("run-g", RunBudget(max_tokens=1_000), redis=rdb, keys=keys, clock=clock)
    play(guard, [("search", {"q": "a"})])
    guard.report_tokens(1_500)

    spent = play(guard, [("search", {"q": "b"})])[0]
    assert spent.result.error is not None
    assert spent.result.error.type is ErrorType.RUN_BUDGET_EXHAUSTED
    assert spent.result.error.details["budget"] == "max_tokens"
    assert guard.view().ended is ErrorType.RUN_BUDGET_EXHAUSTED


def test_two_guards_planning_rounds_of_the_same_run_at_once_both_count(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    one = RunGuard("run-h", redis=rdb, keys=keys, clock=clock)
    two = RunGuard("run-h", redis=rdb, keys=keys, clock=clock)
    plan_one = one.begin_round([("search", {"q": "a"})])
    plan_two = two.begin_round([("search", {"q": "b"})])
    two.end_round(plan_two, [ToolResult(status="ok", tool="search", call_id="2", data=2)])
    one.end_round(plan_one, [ToolResult(status="ok", tool="search", call_id="1", data=1)])

    assert (plan_one.round, plan_two.round) == (1, 2)
    assert one.view().rounds == 2


def test_a_round_abandoned_before_anyone_else_wrote_is_taken_back(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    """The broker refused the calls: the round counts neither as a step nor as repeats."""
    guard = RunGuard("run-j", redis=rdb, keys=keys, clock=clock)
    play(guard, [("search", {"q": "a"})])
    stored = rdb.get(keys.run("run-j"))

    plan = guard.begin_round([("search", {"q": "a"})])

    assert guard.abandon_round(plan) is True
    assert rdb.get(keys.run("run-j")) == stored
    assert guard.view().rounds == 1


def test_a_first_round_abandoned_leaves_no_run_behind(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    guard = RunGuard("run-k", redis=rdb, keys=keys, clock=clock)
    assert guard.abandon_round(guard.begin_round([("search", {})])) is True
    assert guard.view().exists is False


def test_an_abandon_after_another_write_changes_nothing(
    rdb: redis.Redis, keys: Keys, clock: ManualClock
) -> None:
    """Another loop advanced the run meanwhile: its work is not undone."""
    guard = RunGuard("run-l", redis=rdb, keys=keys, clock=clock)
    plan = guard.begin_round([("search", {"q": "a"})])
    guard.report_tokens(10)

    assert guard.abandon_round(plan) is False
    view = guard.view()
    assert (view.rounds, view.tokens) == (1, 10)


def test_an_unreachable_redis_raises_redis_unavailable(keys: Keys, clock: ManualClock) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = redis_client(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    guard = RunGuard("run-i", redis=dead, keys=keys, clock=clock)

    with pytest.raises(RedisUnavailableError, match=f"127.0.0.1:{port}"):
        guard.begin_round([("search", {})])
