"""A round, before and after: which calls may run, and what came back.

Pure functions of the state, the calls and the time (:func:`plan_round`,
:func:`settle_round`), so every decision is tested without Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from toolexec.errors import ErrorType, UsageError
from toolexec.guard.detection import climb, escalate, findings, spent_budget, stalled
from toolexec.guard.model import (
    EXCERPT_CHARS,
    LAST_RESULTS,
    MAX_ALTERNATIVES,
    MAX_CALLS,
    MAX_LEVEL,
    MAX_SEEN,
    CallRecord,
    Decision,
    DisabledTool,
    Finding,
    GuardedResult,
    Pattern,
    RoundPlan,
    Ruling,
    RunEnd,
    RunState,
    call_key,
    copy_state,
    excerpt,
    fingerprint,
)
from toolexec.guard.rendering import (
    aborted,
    disabled_result,
    ended_result,
    exhausted,
    guarded,
    nudged,
)
from toolexec.policies import RunBudget
from toolexec.results import ToolResult

__all__ = ["alternatives_to", "plan_round", "settle_round"]


def _remember_request(state: RunState, key: str, tool: str, arguments: Any) -> None:
    # the key (a hash of tool and arguments) stands for the arguments: the state lives in
    # Redis for a day, and arguments may hold secrets
    record = state.calls.pop(key, None) or CallRecord(tool=tool)
    record.requested += 1
    state.calls[key] = record  # re-inserted: the dict's order is least recently used first
    while len(state.calls) > MAX_CALLS:
        del state.calls[next(iter(state.calls))]
    state.window = [*state.window, key][-state.budget.window :]
    recent = set(state.window)
    for name, kept in state.calls.items():
        if name not in recent:  # only a call in the window can be nudged with its last result
            kept.result = None


def alternatives_to(state: RunState, tool: str, offered: Sequence[str]) -> tuple[str, ...]:
    refused = {name for name, d in state.disabled.items() if d.until_round >= state.round}
    usable = [name for name in offered if name != tool and name not in refused]
    return tuple(usable[:MAX_ALTERNATIVES])


def _decide(state: RunState, tool: str, arguments: Any, offered: Sequence[str]) -> Decision:
    key = call_key(tool, arguments)
    previous = state.calls[key].result if key in state.calls else None
    _remember_request(state, key, tool, arguments)
    level, finding = escalate(state, findings(state, key), tool, key)
    base = Decision(tool, arguments, key, Ruling.RUN, finding, previous)
    if level >= MAX_LEVEL:
        return replace(base, ruling=Ruling.ABORT)
    if level == 2 and finding is not None:
        state.disabled[tool] = DisabledTool(until_round=state.round + 1, reason=finding.why)
    disabled = state.disabled.get(tool)
    if disabled is not None and disabled.until_round >= state.round:
        alternatives = alternatives_to(state, tool, offered)
        return replace(
            base,
            ruling=Ruling.DISABLE,
            reason=disabled.reason,
            alternatives=alternatives,
            also_next=disabled.until_round > state.round,
        )
    return replace(base, ruling=Ruling.NUDGE if level == 1 else Ruling.RUN)


def plan_round(
    state: RunState | None,
    calls: Sequence[tuple[str, Any]],
    *,
    run_id: str,
    budget: RunBudget | None,
    now: float,
    alternatives: Sequence[str] = (),
    copy: bool = True,
    fairness_key: str | None = None,
) -> tuple[RunState, RoundPlan]:
    """Decide what each call of a new round may do; returns the state to store.

    ``copy=False`` changes ``state`` in place: for a caller that owns it (the
    guard, which has just read it), a copy would only cost time.
    ``fairness_key`` (already checked) becomes the run's if it has none yet: a
    run is one tenant's, so the key is named once and a framework's later calls,
    which know only the run id, still wait in that tenant's lane.
    """
    if state is None:
        state = RunState.new(budget or RunBudget(), now)
    elif copy:
        state = copy_state(state)
    if budget is not None:
        state.budget = budget
    if state.fairness_key is None:
        state.fairness_key = fairness_key
    if state.ended is None:
        spent = spent_budget(state, now)
        if spent is not None:
            state.ended = exhausted(state, now, spent)
    if state.ended is not None:
        return state, _refused_round(state, state.ended, calls, run_id)
    state.round += 1
    state.disabled = {t: d for t, d in state.disabled.items() if d.until_round >= state.round}
    decisions = [_decide(state, tool, arguments, alternatives) for tool, arguments in calls]
    stuck = next((d.finding for d in decisions if d.ruling is Ruling.ABORT), None)
    if stuck is not None:
        state.ended = aborted(state, now, stuck)
        return state, _refused_round(state, state.ended, calls, run_id)
    wall = state.budget.max_wall_s
    timeout = None if wall is None else state.started_at + wall - now
    offered = tuple(alternatives)
    return state, RoundPlan(
        run_id,
        state.round,
        tuple(decisions),
        timeout,
        None,
        offered,
        fairness_key=state.fairness_key,
    )


def _refused_round(
    state: RunState, ended: RunEnd, calls: Sequence[tuple[str, Any]], run_id: str
) -> RoundPlan:
    """A round of an ended run: nothing runs, every call gets the run's end."""
    ruling = Ruling.EXHAUSTED if ended.type is ErrorType.RUN_BUDGET_EXHAUSTED else Ruling.ABORT
    decisions = tuple(Decision(t, a, call_key(t, a), ruling) for t, a in calls)
    return RoundPlan(run_id, state.round, decisions, None, ended, fairness_key=state.fairness_key)


def _record(state: RunState, decision: Decision, result: ToolResult) -> bool:
    """Count one result; True if it told the run something new."""
    mark = fingerprint(result)
    new = mark not in state.seen
    if new:
        state.seen = [*state.seen, mark][-MAX_SEEN:]
    shown = excerpt(result.for_model(), EXCERPT_CHARS)
    record = state.calls.get(decision.key)
    if record is not None:
        record.ran += 1
        record.status = result.status
        record.result = shown
    if result.ok:
        state.consecutive_failures = 0
    else:
        state.errors += 1
        state.consecutive_failures += 1
    entry = {"tool": decision.tool, "call": decision.key, "result": shown}
    others = [e for e in state.last_results if e.get("call") != entry["call"]]
    state.last_results = [*others, entry][-LAST_RESULTS:]  # the latest of distinct calls
    return new


def _reset_rungs(state: RunState, progress: bool, fresh: set[str]) -> None:
    """Progress sends a key back to the bottom of its ladder.

    A key that climbed this round stays, unless the call that made it climb
    itself returned something new (a poll whose answer changed is no loop).
    """
    keep = {}
    for name, rung in state.ladder.items():
        if rung.round < state.round and progress:
            continue
        if (
            rung.round == state.round
            and rung.key in fresh
            and rung.pattern is not Pattern.NO_PROGRESS
        ):
            continue
        keep[name] = rung
    state.ladder = keep


def _apply_stall(
    state: RunState, items: list[GuardedResult], plan: RoundPlan, stall: Finding, level: int
) -> list[GuardedResult]:
    """No progress seen after the round: nudge its results, or disable its tools."""
    if level == 1:
        return [nudged(i, stall, None) if i.ruling.runs else i for i in items]
    ran = [d.tool for i, d in zip(items, plan.decisions, strict=True) if i.ruling.runs]
    for tool in ran:
        state.disabled[tool] = DisabledTool(until_round=state.round + 1, reason=stall.why)
    out = []
    for item, decision in zip(items, plan.decisions, strict=True):
        if not item.ruling.runs:
            out.append(item)
            continue
        others = alternatives_to(state, decision.tool, plan.offered)
        refused = replace(decision, reason=stall.why, also_next=True, alternatives=others)
        out.append(disabled_result(refused, plan.run_id, item.result.for_model()))
    return out


def settle_round(
    state: RunState | None,
    plan: RoundPlan,
    results: Sequence[ToolResult | None],
    *,
    now: float,
    copy: bool = True,
) -> tuple[RunState, list[GuardedResult]]:
    """Record what a round's calls returned and turn them into what the model reads."""
    if len(results) != len(plan.decisions):
        raise UsageError(f"{len(plan.decisions)} calls were planned, {len(results)} results given")
    if state is None:
        state = RunState.new(RunBudget(), now)
    elif copy:
        state = copy_state(state)
    if plan.ended is not None:
        return state, [ended_result(plan.ended, d, plan.run_id) for d in plan.decisions]
    ran = [
        (d, r)
        for d, r in zip(plan.decisions, results, strict=True)
        if r is not None and d.ruling.runs
    ]
    fresh = {d.key for d, r in ran if _record(state, d, r)}
    items = [guarded(d, r, plan.run_id) for d, r in zip(plan.decisions, results, strict=True)]
    stall = stalled(state, ran) if ran else None
    level = climb(state, stall, ran[0][0].tool, ran[0][0].key) if stall else 0
    _reset_rungs(state, bool(fresh), fresh)
    if stall is not None and level >= MAX_LEVEL:
        state.ended = aborted(state, now, stall)
        return state, [ended_result(state.ended, d, plan.run_id) for d in plan.decisions]
    if stall is not None and level:
        items = _apply_stall(state, items, plan, stall, level)
    return state, items
