"""What the model reads when the guard steps in: hints, refusals and the run's summary.

Refusals are ordinary error results (``tool_disabled``, ``run_aborted``,
``run_budget_exhausted``) written for the model: why, and what to do instead.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from toolexec.errors import ErrorType, UsageError
from toolexec.guard.model import (
    LAST_RESULTS,
    Decision,
    Finding,
    GuardedResult,
    Pattern,
    Ruling,
    RunEnd,
    RunState,
)
from toolexec.results import ErrorInfo, ToolResult

__all__ = ["aborted", "disabled_result", "ended_result", "exhausted", "guarded", "nudged"]


def _refusal(
    tool: str,
    run_id: str | None,
    kind: ErrorType,
    message: str,
    suggestion: str,
    details: dict[str, Any],
) -> ToolResult:
    info = ErrorInfo(
        type=kind, message=message, suggestion=suggestion, retryable=False, details=details
    )
    return ToolResult(
        status="error", tool=tool, call_id=uuid.uuid4().hex, run_id=run_id, error=info, attempts=0
    )


_STOP = (
    "Stop calling tools. Answer with what the completed calls returned (details.summary: "
    "completed_calls and last_results), and say plainly what could not be done."
)


def _summary(state: RunState, now: float, stuck: dict[str, Any] | None) -> dict[str, Any]:
    """What the model needs to wrap up: what ran, where it got stuck, the last results."""
    completed = [
        {"tool": r.tool, "call": key, "times": r.ran, "last_status": r.status}
        for key, r in state.calls.items()
        if r.ran
    ]
    return {
        "rounds": state.round,
        "elapsed_s": round(max(0.0, now - state.started_at), 3),
        "stuck_on": stuck,
        "completed_calls": completed[-20:],
        "last_results": state.last_results[-LAST_RESULTS:],
    }


def exhausted(state: RunState, now: float, spent: tuple[str, float, float, str]) -> RunEnd:
    name, used, limit, text = spent
    return RunEnd(
        type=ErrorType.RUN_BUDGET_EXHAUSTED,
        message=f"the run's budget is spent: {text}; no more tool calls will run",
        suggestion=_STOP,
        details={
            "budget": name,
            "used": used,
            "limit": limit,
            "summary": _summary(state, now, None),
        },
    )


def aborted(state: RunState, now: float, finding: Finding) -> RunEnd:
    return RunEnd(
        type=ErrorType.RUN_ABORTED,
        message=(
            f"the run was stopped because it is stuck: {finding.why}, after a hint and a "
            "disabled turn changed nothing; no more tool calls will run"
        ),
        suggestion=_STOP,
        details={"summary": _summary(state, now, finding.stuck)},
    )


def _hint(finding: Finding) -> str:
    if finding.pattern is Pattern.REPEAT:
        return (
            f"You just made this same call ({finding.why}). Its previous result is attached "
            "as previous_result; calling it again will not tell you anything new. Use that "
            "result, change the arguments, or try another tool."
        )
    if finding.pattern is Pattern.CYCLE:
        return (
            f"You are going in circles: {finding.why}. The results do not change; use what "
            "you have (previous_result is this call's last result) or try something different."
        )
    return (
        f"You are not making progress: {finding.why}. Change approach, or answer with what "
        "you have."
    )


def nudged(item: GuardedResult, finding: Finding, previous: Any) -> GuardedResult:
    if item.note:  # already nudged for this call: one hint is enough
        return item
    note: dict[str, Any] = {"verdict": "nudge", "pattern": str(finding.pattern)}
    note["hint"] = _hint(finding)
    if previous is not None:
        note["previous_result"] = previous
    return replace(item, ruling=Ruling.NUDGE, note=note)


def disabled_result(decision: Decision, run_id: str, previous: Any) -> GuardedResult:
    others = (
        f" or another tool ({', '.join(decision.alternatives)})" if decision.alternatives else ""
    )
    when = "this turn and your next one" if decision.also_next else "this turn"
    details: dict[str, Any] = {"reason": decision.reason}
    if previous is not None:
        details["previous_result"] = previous
    result = _refusal(
        decision.tool,
        run_id,
        ErrorType.TOOL_DISABLED,
        f"{decision.tool} is disabled for {when}: {decision.reason}; this call was not made",
        f"Use the result you already have (details.previous_result){others}. "
        f"{decision.tool} is refused for {when}, whatever its arguments.",
        details,
    )
    return GuardedResult(result, Ruling.DISABLE)


def ended_result(e: RunEnd, decision: Decision, run_id: str) -> GuardedResult:
    result = _refusal(decision.tool, run_id, e.type, e.message, e.suggestion, e.details)
    ruling = Ruling.EXHAUSTED if e.type is ErrorType.RUN_BUDGET_EXHAUSTED else Ruling.ABORT
    return GuardedResult(result, ruling)


def guarded(decision: Decision, result: ToolResult | None, run_id: str) -> GuardedResult:
    """The pre-run decision applied: nudged results, refusals for disabled tools."""
    if decision.ruling is Ruling.DISABLE:
        return disabled_result(decision, run_id, decision.previous)
    if result is None:
        raise UsageError(f"the call of {decision.tool} was allowed to run but has no result")
    item = GuardedResult(result)
    if decision.ruling is Ruling.NUDGE and decision.finding is not None:
        item = nudged(item, decision.finding, decision.previous)
    return item
