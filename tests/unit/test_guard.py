"""The run guard's decisions as pure functions: budgets, loop detection and the ladder.

No Redis and no worker here: each round goes through :func:`plan_round` and
:func:`settle_round` with results a scripted "tool" returns, and time is a
number the test moves. Persistence in Redis is tested in test_guard_redis.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from toolexec.errors import ConfigurationError, ErrorType, UsageError
from toolexec.guard import (
    GuardedResult,
    Pattern,
    Ruling,
    RunState,
    fingerprint,
    plan_round,
    settle_round,
)
from toolexec.guard.model import call_key
from toolexec.policies import RunBudget
from toolexec.results import ErrorInfo, ToolResult

Call = tuple[str, dict[str, Any]]
Answer = Callable[[str, dict[str, Any]], ToolResult]
TOOLS = ("search", "lookup", "pause")


def ok(tool: str, data: Any) -> ToolResult:
    return ToolResult(status="ok", tool=tool, call_id="c", data=data)


def failed(tool: str, kind: ErrorType = ErrorType.UNAVAILABLE) -> ToolResult:
    info = ErrorInfo(type=kind, message="the service said no")
    return ToolResult(status="error", tool=tool, call_id="c", error=info, attempts=3)


def echo(tool: str, arguments: dict[str, Any]) -> ToolResult:
    """A deterministic tool: the same call always gives the same answer."""
    return ok(tool, {"echo": arguments})


class Run:
    """A scripted run: each :meth:`round` plans, 'runs' the allowed calls, settles."""

    def __init__(self, budget: RunBudget | None = None, answer: Answer = echo) -> None:
        self.budget = budget or RunBudget()
        self.answer = answer
        self.state: RunState | None = None
        self.now = 1_000.0
        self.ran: list[Call] = []
        self.timeouts: list[float | None] = []

    def round(self, *calls: Call) -> list[GuardedResult]:
        self.state, plan = plan_round(
            self.state, calls, run_id="run-1", budget=self.budget, now=self.now, alternatives=TOOLS
        )
        self.timeouts.append(plan.timeout)
        results = []
        for call, decision in zip(calls, plan.decisions, strict=True):
            results.append(self.answer(*call) if decision.ruling.runs else None)
            if decision.ruling.runs:
                self.ran.append(call)
        self.state, outcomes = settle_round(self.state, plan, results, now=self.now)
        return outcomes

    def one(self, tool: str, **arguments: Any) -> GuardedResult:
        return self.round((tool, arguments))[0]

    def rulings(self, *calls: Call) -> list[Ruling]:
        return [o.ruling for o in self.round(*calls)]


def kind(outcome: GuardedResult) -> ErrorType | None:
    return outcome.result.error.type if outcome.result.error else None


def details(outcome: GuardedResult) -> dict[str, Any]:
    assert outcome.result.error is not None
    return outcome.result.error.details


# -- the same call repeated --------------------------------------------------------


def test_a_repeated_call_escalates_nudge_then_disable_then_abort() -> None:
    run = Run(RunBudget(repeat_threshold=3))
    seen = [run.one("search", q="weather in Oslo") for _ in range(5)]

    assert [o.ruling for o in seen] == [
        Ruling.RUN,
        Ruling.RUN,
        Ruling.NUDGE,
        Ruling.DISABLE,
        Ruling.ABORT,
    ]
    assert [kind(o) for o in seen] == [
        None,
        None,
        None,
        ErrorType.TOOL_DISABLED,
        ErrorType.RUN_ABORTED,
    ]
    assert len(run.ran) == 3, "the disabled and the aborted call never ran"


def test_the_nudge_runs_the_call_and_attaches_the_previous_result_and_a_hint() -> None:
    run = Run(answer=lambda tool, args: ok(tool, {"n": len(run.ran)}))
    run.one("search", q="x")
    run.one("search", q="x")
    nudge = run.one("search", q="x")

    assert nudge.result.ok and nudge.result.data == {"n": 2}
    body = nudge.for_model()
    assert body["guard"]["verdict"] == "nudge"
    assert body["guard"]["pattern"] == "repeat"
    assert "You just made this same call" in body["guard"]["hint"]
    assert body["guard"]["previous_result"] == {"status": "ok", "data": {"n": 1}}


def test_the_disabled_tool_error_says_why_and_what_to_use_instead() -> None:
    run = Run()
    for _ in range(3):
        run.one("search", q="x")
    refused = run.one("search", q="x")

    assert refused.result.error is not None
    assert refused.result.error.retryable is False
    assert "search is disabled for this turn and your next one" in refused.result.error.message
    assert "4 times in the last 4 calls" in refused.result.error.message
    assert "lookup, pause" in (refused.result.error.suggestion or "")
    assert details(refused)["previous_result"] == {"status": "ok", "data": {"echo": {"q": "x"}}}
    assert refused.to_anthropic_block("toolu_1")["is_error"] is True


def test_a_disabled_tool_is_refused_next_round_whatever_its_arguments_then_allowed_again() -> None:
    run = Run()
    for _ in range(4):
        run.one("search", q="x")  # the 4th call disables search

    assert run.rulings(("search", {"q": "other"}), ("lookup", {"id": 1})) == [
        Ruling.DISABLE,
        Ruling.RUN,
    ]
    assert run.rulings(("search", {"q": "third"})) == [Ruling.RUN]


def test_the_abort_summary_names_completed_calls_the_stuck_point_and_last_results() -> None:
    run = Run()
    run.one("lookup", id=7)
    for _ in range(5):
        last = run.one("search", q="x")

    summary = details(last)["summary"]
    search, lookup = call_key("search", {"q": "x"}), call_key("lookup", {"id": 7})
    assert summary["stuck_on"] == {
        "pattern": "repeat",
        "tool": "search",
        "call": search,
        "times": 5,
    }
    assert summary["completed_calls"] == [
        {"tool": "lookup", "call": lookup, "times": 1, "last_status": "ok"},
        {"tool": "search", "call": search, "times": 3, "last_status": "ok"},
    ]
    assert [r["tool"] for r in summary["last_results"]] == ["lookup", "search"]
    assert summary["rounds"] == 6
    assert "Stop calling tools" in (last.result.error.suggestion or "")  # type: ignore[union-attr]


def test_an_aborted_run_refuses_every_later_call_and_runs_nothing() -> None:
    run = Run()
    for _ in range(5):
        run.one("search", q="x")
    ran_before = len(run.ran)

    later = run.round(("lookup", {"id": 1}), ("pause", {"seconds": 0}))

    assert [kind(o) for o in later] == [ErrorType.RUN_ABORTED, ErrorType.RUN_ABORTED]
    assert len(run.ran) == ran_before


def test_arguments_that_differ_only_in_key_order_and_float_noise_are_the_same_call() -> None:
    run = Run()
    run.one("search", q="x", limit=0.1, path="./data/a.csv")
    run.round(("search", {"path": "data//a.csv", "limit": 0.1000000000000001, "q": "x"}))

    assert run.one("search", limit=0.1, q="x", path="data/a.csv").ruling is Ruling.NUDGE


def test_a_key_climbs_at_most_one_rung_per_round() -> None:
    """Five identical calls in one response are one mistake, not an abort."""
    run = Run()
    assert run.rulings(*[("search", {"q": "x"})] * 5) == [
        Ruling.RUN,
        Ruling.RUN,
        Ruling.NUDGE,
        Ruling.NUDGE,
        Ruling.NUDGE,
    ]


def test_calls_further_apart_than_the_window_are_not_a_repeat() -> None:
    run = Run(RunBudget(repeat_threshold=2, repeat_window=3, cycle_max_length=2))
    for i in range(8):
        run.one("search", q="x")
        run.one("lookup", id=i)
        run.one("pause", seconds=i)

    assert run.ran.count(("search", {"q": "x"})) == 8


# -- cycles --------------------------------------------------------------------------


def test_an_a_b_a_b_cycle_is_detected_and_climbs_the_ladder() -> None:
    run = Run(RunBudget(repeat_threshold=5))
    a, b = ("search", {"q": "x"}), ("lookup", {"id": 1})
    outcomes = [run.round(call)[0] for call in (a, b, a, b, a, b)]

    assert [o.ruling for o in outcomes] == [
        Ruling.RUN,
        Ruling.RUN,
        Ruling.RUN,
        Ruling.NUDGE,
        Ruling.DISABLE,
        Ruling.ABORT,
    ]
    assert outcomes[3].note is not None and outcomes[3].note["pattern"] == "cycle"
    assert "search → lookup" in outcomes[3].note["hint"]
    stuck = details(outcomes[5])["summary"]["stuck_on"]
    assert stuck["pattern"] == "cycle"
    assert [c["tool"] for c in stuck["calls"]] == ["search", "lookup"]


def test_a_three_call_cycle_is_detected() -> None:
    run = Run(RunBudget(repeat_threshold=5))
    calls = [("search", {"q": "x"}), ("lookup", {"id": 1}), ("pause", {"seconds": 0})] * 2
    rulings = [run.round(call)[0].ruling for call in calls]
    assert rulings == [Ruling.RUN] * 5 + [Ruling.NUDGE]


def test_parallel_calls_in_a_cycle_are_detected_across_rounds() -> None:
    run = Run(RunBudget(repeat_threshold=5))
    pair = (("search", {"q": "x"}), ("lookup", {"id": 1}))
    assert run.rulings(*pair) == [Ruling.RUN, Ruling.RUN]
    assert run.rulings(*pair) == [Ruling.RUN, Ruling.NUDGE]
    assert run.rulings(*pair) == [Ruling.DISABLE, Ruling.DISABLE]


def test_alternating_calls_that_make_progress_are_not_escalated() -> None:
    """A→B→A→B whose answers keep changing is work, not a loop."""
    counter = iter(range(1000))
    run = Run(RunBudget(repeat_threshold=5), answer=lambda t, a: ok(t, next(counter)))
    a, b = ("search", {"q": "x"}), ("lookup", {"id": 1})
    rulings = [run.round(call)[0].ruling for call in (a, b) * 6]
    assert Ruling.DISABLE not in rulings and Ruling.ABORT not in rulings


# -- progress -----------------------------------------------------------------------


def test_a_round_with_progress_resets_the_ladder_for_the_repeated_key() -> None:
    run = Run()
    for _ in range(3):
        run.one("search", q="x")  # the third is nudged
    run.one("lookup", id=42)  # a new result: progress

    assert run.one("search", q="x").ruling is Ruling.NUDGE, "back to the first rung"


def test_without_progress_the_ladder_keeps_climbing() -> None:
    run = Run()
    run.one("lookup", id=42)
    for _ in range(3):
        run.one("search", q="x")
    run.one("lookup", id=42)  # an answer the run has seen before: no progress

    assert run.one("search", q="x").ruling is Ruling.DISABLE


def test_a_poll_whose_answer_changes_is_nudged_but_never_disabled() -> None:
    status = iter(["queued", "running 10%", "running 40%", "running 80%", "writing", "done"])
    run = Run(answer=lambda t, a: ok(t, next(status)))
    rulings = [run.one("search", job=1).ruling for _ in range(6)]
    assert rulings == [Ruling.RUN, Ruling.RUN] + [Ruling.NUDGE] * 4


def test_same_results_for_consecutive_rounds_is_no_progress_and_escalates() -> None:
    """Different arguments, the same empty answer every time: the model is stuck."""
    run = Run(RunBudget(no_progress_rounds=3), answer=lambda t, a: ok(t, []))
    outcomes = [run.one("search", q=f"query {i}") for i in range(4)]

    assert [o.ruling for o in outcomes] == [
        Ruling.RUN,
        Ruling.RUN,
        Ruling.NUDGE,
        Ruling.DISABLE,
    ]
    assert outcomes[2].note is not None and outcomes[2].note["pattern"] == "no_progress"
    assert "not making progress" in outcomes[2].note["hint"]
    assert details(outcomes[3])["previous_result"] == {"status": "ok", "data": []}
    assert run.one("search", q="query 5").ruling is Ruling.DISABLE  # refused next round
    final = run.one("search", q="query 6")
    assert final.ruling is Ruling.ABORT
    assert details(final)["summary"]["stuck_on"]["pattern"] == Pattern.NO_PROGRESS


def test_the_fingerprint_ignores_ids_timings_and_error_messages() -> None:
    a = ToolResult(status="ok", tool="t", call_id="1", data={"x": 1}, elapsed_ms=5)
    b = ToolResult(status="ok", tool="t", call_id="2", data={"x": 1}, elapsed_ms=900)
    e1 = ToolResult(
        status="error", tool="t", call_id="3", error=ErrorInfo(type="timeout", message="after 1 s")
    )
    e2 = ToolResult(
        status="error", tool="t", call_id="4", error=ErrorInfo(type="timeout", message="after 2 s")
    )
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(e1) == fingerprint(e2)
    assert fingerprint(a) != fingerprint(ok("t", {"x": 2}))


# -- budgets -------------------------------------------------------------------------


def test_max_steps_stops_the_run_when_the_next_round_begins() -> None:
    run = Run(RunBudget(max_steps=2))
    run.one("search", q="a")
    run.one("search", q="b")
    spent = run.round(("search", {"q": "c"}), ("lookup", {"id": 1}))

    assert [kind(o) for o in spent] == [ErrorType.RUN_BUDGET_EXHAUSTED] * 2
    assert [o.ruling for o in spent] == [Ruling.EXHAUSTED] * 2
    assert details(spent[0])["budget"] == "max_steps"
    assert details(spent[0])["used"] == 2 and details(spent[0])["limit"] == 2
    assert "2 of 2 steps used" in spent[0].result.error.message  # type: ignore[union-attr]
    assert len(run.ran) == 2
    assert kind(run.one("pause", seconds=0)) is ErrorType.RUN_BUDGET_EXHAUSTED, "it stays over"


def test_the_remaining_wall_time_is_each_rounds_timeout_until_it_is_spent() -> None:
    run = Run(RunBudget(max_wall_s=60))
    run.one("search", q="a")
    run.now += 45
    run.one("search", q="b")
    run.now += 15
    spent = run.one("search", q="c")

    assert run.timeouts == [60, 15, None]
    assert kind(spent) is ErrorType.RUN_BUDGET_EXHAUSTED
    assert details(spent)["budget"] == "max_wall_s"


def test_consecutive_failures_stop_the_run_and_a_success_resets_the_count() -> None:
    outcomes = iter([False, False, True, False, False, False])
    run = Run(
        RunBudget(max_consecutive_failures=3, max_tool_errors=None),
        answer=lambda t, a: ok(t, a) if next(outcomes) else failed(t),
    )
    rulings = [run.one("search", q=i).ruling for i in range(7)]

    assert Ruling.EXHAUSTED not in rulings[:6]
    assert rulings[6] is Ruling.EXHAUSTED


def test_total_tool_errors_stop_the_run() -> None:
    flip = iter(range(100))
    run = Run(
        RunBudget(max_tool_errors=3, max_consecutive_failures=None),
        answer=lambda t, a: failed(t) if next(flip) % 2 else ok(t, a),
    )
    rulings = [run.one("search", q=i).ruling for i in range(7)]

    assert rulings == [Ruling.RUN] * 6 + [Ruling.EXHAUSTED]


def test_reported_tokens_count_against_the_token_budget() -> None:
    run = Run(RunBudget(max_tokens=1000))
    run.one("search", q="a")
    assert run.state is not None
    run.state.tokens += 1200  # what RunGuard.report_tokens does, atomically

    spent = run.one("search", q="b")
    assert details(spent)["budget"] == "max_tokens"


def test_refused_calls_do_not_count_as_tool_errors() -> None:
    run = Run(RunBudget(max_tool_errors=1))
    for _ in range(4):
        run.one("search", q="x")  # nudge, then a disabled call
    assert run.state is not None and run.state.errors == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"max_steps": 0},
        {"max_wall_s": -1},
        {"repeat_threshold": 1},
        {"repeat_window": 2, "repeat_threshold": 3},
        {"cycle_repeats": 1},
        {"no_progress_rounds": 1},
    ],
)
def test_an_impossible_budget_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="invalid run budget"):
        RunBudget(**bad)


def test_the_state_survives_its_json_form() -> None:
    run = Run()
    for _ in range(3):
        run.one("search", q="x")
    assert run.state is not None
    again = RunState.model_validate_json(run.state.model_dump_json())

    assert again == run.state
    assert isinstance(again.budget, RunBudget)


def test_settling_with_the_wrong_number_of_results_is_a_usage_error() -> None:
    state, plan = plan_round(None, [("search", {})], run_id="r", budget=None, now=0.0)
    results: Sequence[ToolResult | None] = []
    with pytest.raises(UsageError, match="1 calls were planned, 0 results"):
        settle_round(state, plan, results, now=0.0)


def test_the_run_state_keeps_hashes_of_arguments_never_their_values() -> None:
    """The state lives in Redis for a day; a call's arguments may hold a secret."""
    run = Run(answer=lambda tool, arguments: ok(tool, {"found": 1}))
    for _ in range(5):
        run.one("search", q="x", token="canary-s3cret")
        run.one("lookup", id=1, password="canary-s3cret")

    assert run.state is not None
    assert "canary-s3cret" not in run.state.model_dump_json()


def test_a_run_keeps_the_first_fairness_key_a_round_names_and_its_plans_carry_it() -> None:
    """The run is one tenant's: later rounds that name no key, or another, keep the first."""
    calls = [("search", {"q": "a"})]
    state, plan = plan_round(None, calls, run_id="r", budget=None, now=0.0)
    assert state.fairness_key is None and plan.fairness_key is None
    state, plan = plan_round(state, calls, run_id="r", budget=None, now=1.0, fairness_key="t-1")
    assert state.fairness_key == "t-1" and plan.fairness_key == "t-1"
    state, plan = plan_round(state, calls, run_id="r", budget=None, now=2.0)
    assert plan.fairness_key == "t-1"
    state, plan = plan_round(state, calls, run_id="r", budget=None, now=3.0, fairness_key="t-2")
    assert plan.fairness_key == "t-1"
    restored = type(state).model_validate_json(state.model_dump_json())
    assert restored.fairness_key == "t-1"
