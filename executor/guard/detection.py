"""How the guard tells that a run is stuck or spent: pure functions of the state.

A repeat and a cycle are found in the window of recent calls before a round;
no progress only after it, from its results. Each finding climbs a ladder of
its own, one rung a round at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolexec.guard.model import (
    MAX_LEVEL,
    Decision,
    Finding,
    Pattern,
    Rung,
    RunState,
    digest,
    fingerprint,
)
from toolexec.policies import RunBudget
from toolexec.results import ToolResult

__all__ = ["climb", "escalate", "findings", "spent_budget", "stalled"]


def spent_budget(state: RunState, now: float) -> tuple[str, float, float, str] | None:
    """The first budget the run has used up: (name, used, limit, how to say it)."""
    b = state.budget
    elapsed = now - state.started_at
    checks: list[tuple[str, float, float | None, str]] = [
        ("max_steps", state.round, b.max_steps, "{used:g} of {limit:g} steps used"),
        ("max_wall_s", round(elapsed, 3), b.max_wall_s, "{used:g} s of {limit:g} s wall time used"),
        ("max_tokens", state.tokens, b.max_tokens, "{used:g} of {limit:g} tokens used"),
        (
            "max_consecutive_failures",
            state.consecutive_failures,
            b.max_consecutive_failures,
            "the last {used:g} tool calls failed (limit {limit:g})",
        ),
        (
            "max_tool_errors",
            state.errors,
            b.max_tool_errors,
            "{used:g} tool calls failed in all (limit {limit:g})",
        ),
    ]
    for name, used, limit, text in checks:
        if limit is not None and used >= limit:
            return name, used, limit, text.format(used=used, limit=limit)
    return None


def _cycle(window: Sequence[str], budget: RunBudget) -> tuple[str, ...] | None:
    """The shortest run of 2..N distinct-enough calls that the window's tail repeats."""
    for n in range(2, budget.cycle_max_length + 1):
        span = n * budget.cycle_repeats
        if len(window) < span:
            return None
        tail = list(window[-span:])
        gram = tail[:n]
        if len(set(gram)) > 1 and tail == gram * budget.cycle_repeats:
            return tuple(gram)
    return None


def _canonical_rotation(gram: tuple[str, ...]) -> tuple[str, ...]:
    """A→B and B→A are the same cycle entered at another point."""
    return min(gram[i:] + gram[:i] for i in range(len(gram)))


def _described(state: RunState, key: str) -> dict[str, Any]:
    record = state.calls.get(key)
    if record is None:
        return {"tool": "?", "call": key}
    return {"tool": record.tool, "call": key}


def findings(state: RunState, key: str) -> list[Finding]:
    budget, window = state.budget, state.window
    record = state.calls[key]
    found = []
    count = window[-budget.repeat_window :].count(key)
    if count >= budget.repeat_threshold:
        found.append(
            Finding(
                f"repeat:{key}",
                Pattern.REPEAT,
                f"{record.tool} was called with the same arguments {count} times in the "
                f"last {min(len(window), budget.repeat_window)} calls",
                {
                    "pattern": "repeat",
                    "tool": record.tool,
                    "call": key,
                    "times": count,
                },
            )
        )
    gram = _cycle(window, budget)
    if gram is not None:
        calls = [_described(state, k) for k in gram]
        path = " → ".join(c["tool"] for c in calls)
        found.append(
            Finding(
                f"cycle:{digest(list(_canonical_rotation(gram)))}",
                Pattern.CYCLE,
                f"the calls {path} repeated {budget.cycle_repeats} times in a row with the "
                "same arguments",
                {"pattern": "cycle", "calls": calls, "repeats": budget.cycle_repeats},
            )
        )
    return found


def stalled(state: RunState, ran: Sequence[tuple[Decision, ToolResult]]) -> Finding | None:
    """The round's results equal the previous rounds': no progress for R rounds in a row."""
    mark = digest(sorted(fingerprint(r) for _, r in ran))
    state.streak = state.streak + 1 if mark == state.last_fingerprint else 1
    state.last_fingerprint = mark
    if state.streak < state.budget.no_progress_rounds:
        return None
    calls = [{"tool": d.tool, "call": d.key} for d, _ in ran]
    return Finding(
        f"no_progress:{mark}",
        Pattern.NO_PROGRESS,
        f"the last {state.streak} rounds of tool calls returned exactly the same results",
        {"pattern": "no_progress", "rounds": state.streak, "calls": calls},
    )


def climb(state: RunState, finding: Finding, tool: str, key: str) -> int:
    """One rung up the finding's ladder, at most once per round."""
    rung = state.ladder.get(finding.ladder_key)
    if rung is not None and rung.round == state.round:
        return rung.level
    level = min(MAX_LEVEL, (rung.level if rung else 0) + 1)
    state.ladder[finding.ladder_key] = Rung(
        level=level, round=state.round, pattern=finding.pattern, tool=tool, key=key
    )
    return level


def escalate(
    state: RunState, findings: Sequence[Finding], tool: str, key: str
) -> tuple[int, Finding | None]:
    top, worst = 0, None
    for finding in findings:
        level = climb(state, finding, tool, key)
        if level > top:
            top, worst = level, finding
    return top, worst
