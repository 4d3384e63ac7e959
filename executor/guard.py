"""Run guardrails: budgets, loop detection and an escalation ladder, kept in Redis per run.

A model does not remember that it made the same call three times, and a tool
process forgets everything when it ends; so the counting that stops an agent
from looping lives in the harness, under the run id. Any client process can
pick a run up: the state is one JSON document in Redis (:meth:`Keys.run`),
read, changed in Python and written back with a Lua compare-and-set, so two
processes advancing the same run never lose an update.

A round is one model response's tool calls. :meth:`RunGuard.begin_round`
decides, before anything runs, what each call may do; :meth:`RunGuard.end_round`
records what came back and may still escalate (no progress is only visible in
results). The decisions are pure functions of the stored state, the calls and
the time (:func:`plan_round`, :func:`settle_round`), testable without Redis.

What counts as stuck, each keyed so that it climbs a ladder of its own::

    repeat       the same (tool, normalised arguments) k times in the last W calls
    cycle        the last n calls repeat the n before them (A→B→A→B), n = 2..N
    no_progress  a round's results are the same as the previous rounds', R in a row

    detection 1 ──> nudge     the call runs; its result carries a hint and the
                              previous result of the same call
    detection 2 ──> disable   the call is refused (``tool_disabled``: why, and
                              what to use instead); the tool stays refused next round
    detection 3 ──> abort     the whole run is refused from now on (``run_aborted``,
                              with a summary of the completed calls, the stuck
                              point and the last results)

A key climbs at most one rung per round, and falls back to the bottom when a
round brings progress (a result never seen before in the run). A spent budget
(steps, wall time, consecutive failures, tool errors, tokens) ends the run
with ``run_budget_exhausted``. Budgets are checked when a round begins, so the
round that spends one still gets its results.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

import redis
from pydantic import BaseModel, Field

from toolexec.clock import Clock, SystemClock
from toolexec.connection import unavailable
from toolexec.errors import ConfigurationError, ErrorType, UsageError
from toolexec.keys import RUN_IDLE_TTL_S, Keys
from toolexec.normalize import arguments_hash, canonical_json, normalize
from toolexec.results import ErrorInfo, ToolResult

__all__ = [
    "Decision",
    "GuardedResult",
    "Pattern",
    "RoundPlan",
    "RunBudget",
    "RunGuard",
    "RunState",
    "RunView",
    "Verdict",
    "fingerprint",
    "plan_round",
    "settle_round",
]

T = TypeVar("T")

#: How much of a result or an argument list the state keeps; the model gets it back
#: as ``previous_result`` and in an abort's summary, so it must stay readable.
_EXCERPT_CHARS = 2_000
_ARGUMENTS_CHARS = 500
#: Distinct calls remembered for an abort's summary; the least recently made go first.
#: The whole state is read and written every round, so it must stay small.
_MAX_CALLS = 50
#: Result fingerprints remembered to tell progress from repetition.
_MAX_SEEN = 300
_LAST_RESULTS = 3
_MAX_ALTERNATIVES = 8
_MAX_LEVEL = 3
_TRANSACTION_TRIES = 50


class Verdict(StrEnum):
    """What the guard made of one call."""

    RUN = "run"
    NUDGE = "nudge"
    DISABLE = "disable"
    ABORT = "abort"
    EXHAUSTED = "exhausted"

    @property
    def runs(self) -> bool:
        return self in (Verdict.RUN, Verdict.NUDGE)


class Pattern(StrEnum):
    """The kinds of being stuck the guard recognises."""

    REPEAT = "repeat"
    CYCLE = "cycle"
    NO_PROGRESS = "no_progress"


_LADDER = {1: Verdict.NUDGE, 2: Verdict.DISABLE, 3: Verdict.ABORT}


@dataclass(frozen=True)
class RunBudget:
    """The limits of one run, and how eagerly repetition counts as a loop.

    A step is one round: one model response's tool calls, however many. ``None``
    turns a limit off. The budget is stored with the run, so a guard built
    later without one adopts it; a guard built with one replaces it (that is
    how an operator extends a run).
    """

    max_steps: int | None = 25
    max_wall_s: float | None = 600.0
    max_consecutive_failures: int | None = 5
    max_tool_errors: int | None = 15
    max_tokens: int | None = None
    repeat_threshold: int = 3
    repeat_window: int = 10
    cycle_max_length: int = 3
    cycle_repeats: int = 2
    no_progress_rounds: int = 3

    def __post_init__(self) -> None:
        problems = [message for bad, message in self._checks() if bad]
        if problems:
            raise ConfigurationError("invalid run budget: " + "; ".join(problems))

    def _checks(self) -> list[tuple[bool, str]]:
        limits = {
            "max_steps": self.max_steps,
            "max_wall_s": self.max_wall_s,
            "max_consecutive_failures": self.max_consecutive_failures,
            "max_tool_errors": self.max_tool_errors,
            "max_tokens": self.max_tokens,
        }
        checks = [
            (value is not None and not value > 0, f"{name} must be positive or None, not {value}")
            for name, value in limits.items()
        ]
        return [
            *checks,
            (
                self.repeat_threshold < 2,
                f"repeat_threshold must be >= 2, not {self.repeat_threshold}",
            ),
            (
                self.repeat_window < self.repeat_threshold,
                f"repeat_window must be >= repeat_threshold, not {self.repeat_window}",
            ),
            (
                self.cycle_max_length < 2,
                f"cycle_max_length must be >= 2, not {self.cycle_max_length}",
            ),
            (self.cycle_repeats < 2, f"cycle_repeats must be >= 2, not {self.cycle_repeats}"),
            (
                self.no_progress_rounds < 2,
                f"no_progress_rounds must be >= 2, not {self.no_progress_rounds}",
            ),
        ]

    @property
    def window(self) -> int:
        """Calls of history the detectors need: enough for the longest repeated cycle."""
        return max(self.repeat_window, self.cycle_max_length * self.cycle_repeats)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunBudget:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


# -- the stored state ----------------------------------------------------------


class _CallRecord(BaseModel):
    """One distinct call of the run: what it was, how often, what it last returned."""

    tool: str
    arguments: Any = None
    requested: int = 0
    ran: int = 0
    status: str | None = None
    result: Any = None


class _Rung(BaseModel):
    """Where one stuck key stands on the ladder, and the round it last climbed."""

    level: int
    round: int
    pattern: Pattern
    tool: str
    key: str


class _Disabled(BaseModel):
    until_round: int
    reason: str


class _Ended(BaseModel):
    """Why the run is over; every later call gets this as its error."""

    type: ErrorType
    message: str
    suggestion: str
    details: dict[str, Any] = Field(default_factory=dict)


class RunState(BaseModel):
    """Everything the guard knows of one run; stored as JSON under :meth:`Keys.run`."""

    budget: RunBudget
    started_at: float
    round: int = 0
    tokens: int = 0
    errors: int = 0
    consecutive_failures: int = 0
    window: list[str] = Field(default_factory=list)
    calls: dict[str, _CallRecord] = Field(default_factory=dict)
    ladder: dict[str, _Rung] = Field(default_factory=dict)
    disabled: dict[str, _Disabled] = Field(default_factory=dict)
    seen: list[str] = Field(default_factory=list)
    last_fingerprint: str | None = None
    streak: int = 0
    last_results: list[dict[str, Any]] = Field(default_factory=list)
    ended: _Ended | None = None

    @classmethod
    def new(cls, budget: RunBudget, now: float) -> RunState:
        return cls(budget=budget, started_at=now)


# -- what a round gets -----------------------------------------------------------


@dataclass(frozen=True)
class _Finding:
    """One detector's verdict on a call: the ladder key it climbs and why."""

    ladder_key: str
    pattern: Pattern
    why: str
    stuck: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """What one call of a round may do, decided before it runs."""

    tool: str
    arguments: Any
    key: str
    verdict: Verdict
    finding: _Finding | None = None
    previous: Any = None
    reason: str | None = None
    alternatives: tuple[str, ...] = ()
    also_next: bool = False


@dataclass(frozen=True)
class RoundPlan:
    """The decisions of one round, and the time its calls may take.

    ``timeout`` is the run's remaining wall time (None without a wall-time
    budget): it becomes each call's deadline, so no call outlives the run.
    """

    run_id: str
    round: int
    decisions: tuple[Decision, ...]
    timeout: float | None = None
    ended: _Ended | None = None
    offered: tuple[str, ...] = ()
    #: The stored state (JSON) before and after planning: the end of the round is
    #: written against the latter, and a round whose calls never went out is taken
    #: back to the former (:meth:`RunGuard.abandon_round`).
    undo: tuple[str | None, str] | None = field(default=None, compare=False, repr=False)

    @property
    def to_run(self) -> list[int]:
        """Indexes of the calls that may run."""
        return [i for i, d in enumerate(self.decisions) if d.verdict.runs]


@dataclass(frozen=True)
class GuardedResult:
    """A call's result with the guard's verdict; renders what the model reads.

    ``note`` is the nudge (a hint and the previous result of the same call);
    refusals are ordinary error results of type ``tool_disabled``,
    ``run_aborted`` or ``run_budget_exhausted``.
    """

    result: ToolResult
    verdict: Verdict = Verdict.RUN
    note: dict[str, Any] | None = None

    def for_model(self) -> dict[str, Any]:
        body = self.result.for_model()
        if self.note:
            body["guard"] = self.note
        return body

    def content(self) -> str:
        return json.dumps(self.for_model(), ensure_ascii=False, default=str)

    def to_openai_message(self, tool_call_id: str) -> dict[str, Any]:
        """A chat-completions ``role: tool`` message; the nudge is part of its content."""
        return {**self.result.to_openai_message(tool_call_id), "content": self.content()}

    def to_anthropic_block(self, tool_use_id: str) -> dict[str, Any]:
        """A Messages API ``tool_result`` block; refusals carry ``is_error``."""
        return {**self.result.to_anthropic_block(tool_use_id), "content": self.content()}


@dataclass(frozen=True)
class RunView:
    """A run as the guard sees it now, for dashboards and for the agent loop."""

    run_id: str
    exists: bool
    budget: RunBudget
    rounds: int = 0
    tokens: int = 0
    tool_errors: int = 0
    consecutive_failures: int = 0
    elapsed_s: float = 0.0
    remaining_s: float | None = None
    ended: ErrorType | None = None
    message: str | None = None
    disabled: tuple[str, ...] = field(default_factory=tuple)


# -- small helpers ---------------------------------------------------------------


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def _call_key(tool: str, arguments: Any) -> str:
    """The identity of a call, shortened: 64 bits keep collisions out of reach of one run."""
    return arguments_hash(tool, arguments)[:16]


def _copy(state: RunState) -> RunState:
    """A private copy to change; through JSON, many times faster than ``deepcopy``."""
    return RunState.model_validate_json(state.model_dump_json())


def fingerprint(result: ToolResult) -> str:
    """What a result says, without ids or timings: equal fingerprints, no new information.

    Errors count by their type only: messages carry times and ids that differ
    while the answer does not.
    """
    return _digest(
        {
            "tool": result.tool,
            "status": result.status,
            "data": result.data,
            "error": None if result.error is None else str(result.error.type),
            "degraded": result.degraded,
        }
    )


def _excerpt(value: Any, limit: int) -> Any:
    """``value`` itself if its JSON is short, else the start of its JSON as text."""
    text = canonical_json(value)
    return normalize(value) if len(text) <= limit else text[:limit] + "…"


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
        {"tool": r.tool, "arguments": r.arguments, "times": r.ran, "last_status": r.status}
        for r in state.calls.values()
        if r.ran
    ]
    return {
        "rounds": state.round,
        "elapsed_s": round(max(0.0, now - state.started_at), 3),
        "stuck_on": stuck,
        "completed_calls": completed[-20:],
        "last_results": state.last_results[-_LAST_RESULTS:],
    }


# -- budgets -----------------------------------------------------------------------


def _spent(state: RunState, now: float) -> tuple[str, float, float, str] | None:
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


def _exhausted(state: RunState, now: float, spent: tuple[str, float, float, str]) -> _Ended:
    name, used, limit, text = spent
    return _Ended(
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


def _aborted(state: RunState, now: float, finding: _Finding) -> _Ended:
    return _Ended(
        type=ErrorType.RUN_ABORTED,
        message=(
            f"the run was stopped because it is stuck: {finding.why}, after a hint and a "
            "disabled turn changed nothing; no more tool calls will run"
        ),
        suggestion=_STOP,
        details={"summary": _summary(state, now, finding.stuck)},
    )


# -- detection -----------------------------------------------------------------------


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
        return {"tool": "?", "arguments": None}
    return {"tool": record.tool, "arguments": record.arguments}


def _findings(state: RunState, key: str) -> list[_Finding]:
    budget, window = state.budget, state.window
    record = state.calls[key]
    found = []
    count = window[-budget.repeat_window :].count(key)
    if count >= budget.repeat_threshold:
        found.append(
            _Finding(
                f"repeat:{key}",
                Pattern.REPEAT,
                f"{record.tool} was called with the same arguments {count} times in the "
                f"last {min(len(window), budget.repeat_window)} calls",
                {
                    "pattern": "repeat",
                    "tool": record.tool,
                    "arguments": record.arguments,
                    "times": count,
                },
            )
        )
    gram = _cycle(window, budget)
    if gram is not None:
        calls = [_described(state, k) for k in gram]
        path = " → ".join(c["tool"] for c in calls)
        found.append(
            _Finding(
                f"cycle:{_digest(list(_canonical_rotation(gram)))}",
                Pattern.CYCLE,
                f"the calls {path} repeated {budget.cycle_repeats} times in a row with the "
                "same arguments",
                {"pattern": "cycle", "calls": calls, "repeats": budget.cycle_repeats},
            )
        )
    return found


def _climb(state: RunState, finding: _Finding, tool: str, key: str) -> int:
    """One rung up the finding's ladder, at most once per round."""
    rung = state.ladder.get(finding.ladder_key)
    if rung is not None and rung.round == state.round:
        return rung.level
    level = min(_MAX_LEVEL, (rung.level if rung else 0) + 1)
    state.ladder[finding.ladder_key] = _Rung(
        level=level, round=state.round, pattern=finding.pattern, tool=tool, key=key
    )
    return level


def _escalate(
    state: RunState, findings: Sequence[_Finding], tool: str, key: str
) -> tuple[int, _Finding | None]:
    top, worst = 0, None
    for finding in findings:
        level = _climb(state, finding, tool, key)
        if level > top:
            top, worst = level, finding
    return top, worst


# -- planning a round ------------------------------------------------------------------


def _remember_request(state: RunState, key: str, tool: str, arguments: Any) -> None:
    record = state.calls.pop(key, None) or _CallRecord(
        tool=tool, arguments=_excerpt(arguments, _ARGUMENTS_CHARS)
    )
    record.requested += 1
    state.calls[key] = record  # re-inserted: the dict's order is least recently used first
    while len(state.calls) > _MAX_CALLS:
        del state.calls[next(iter(state.calls))]
    state.window = [*state.window, key][-state.budget.window :]
    recent = set(state.window)
    for name, kept in state.calls.items():
        if name not in recent:  # only a call in the window can be nudged with its last result
            kept.result = None


def _alternatives(state: RunState, tool: str, offered: Sequence[str]) -> tuple[str, ...]:
    refused = {name for name, d in state.disabled.items() if d.until_round >= state.round}
    usable = [name for name in offered if name != tool and name not in refused]
    return tuple(usable[:_MAX_ALTERNATIVES])


def _decide(state: RunState, tool: str, arguments: Any, offered: Sequence[str]) -> Decision:
    key = _call_key(tool, arguments)
    previous = state.calls[key].result if key in state.calls else None
    _remember_request(state, key, tool, arguments)
    level, finding = _escalate(state, _findings(state, key), tool, key)
    base = Decision(tool, arguments, key, Verdict.RUN, finding, previous)
    if level >= _MAX_LEVEL:
        return replace(base, verdict=Verdict.ABORT)
    if level == 2 and finding is not None:
        state.disabled[tool] = _Disabled(until_round=state.round + 1, reason=finding.why)
    disabled = state.disabled.get(tool)
    if disabled is not None and disabled.until_round >= state.round:
        alternatives = _alternatives(state, tool, offered)
        return replace(
            base,
            verdict=Verdict.DISABLE,
            reason=disabled.reason,
            alternatives=alternatives,
            also_next=disabled.until_round > state.round,
        )
    return replace(base, verdict=Verdict.NUDGE if level == 1 else Verdict.RUN)


def plan_round(
    state: RunState | None,
    calls: Sequence[tuple[str, Any]],
    *,
    run_id: str,
    budget: RunBudget | None,
    now: float,
    alternatives: Sequence[str] = (),
    copy: bool = True,
) -> tuple[RunState, RoundPlan]:
    """Decide what each call of a new round may do; returns the state to store.

    ``copy=False`` changes ``state`` in place: for a caller that owns it (the
    guard, which has just read it), a copy would only cost time.
    """
    if state is None:
        state = RunState.new(budget or RunBudget(), now)
    elif copy:
        state = _copy(state)
    if budget is not None:
        state.budget = budget
    if state.ended is None:
        spent = _spent(state, now)
        if spent is not None:
            state.ended = _exhausted(state, now, spent)
    if state.ended is not None:
        return state, _refused_round(state, state.ended, calls, run_id)
    state.round += 1
    state.disabled = {t: d for t, d in state.disabled.items() if d.until_round >= state.round}
    decisions = [_decide(state, tool, arguments, alternatives) for tool, arguments in calls]
    stuck = next((d.finding for d in decisions if d.verdict is Verdict.ABORT), None)
    if stuck is not None:
        state.ended = _aborted(state, now, stuck)
        return state, _refused_round(state, state.ended, calls, run_id)
    wall = state.budget.max_wall_s
    timeout = None if wall is None else state.started_at + wall - now
    offered = tuple(alternatives)
    return state, RoundPlan(run_id, state.round, tuple(decisions), timeout, None, offered)


def _refused_round(
    state: RunState, ended: _Ended, calls: Sequence[tuple[str, Any]], run_id: str
) -> RoundPlan:
    """A round of an ended run: nothing runs, every call gets the run's end."""
    verdict = Verdict.EXHAUSTED if ended.type is ErrorType.RUN_BUDGET_EXHAUSTED else Verdict.ABORT
    decisions = tuple(Decision(t, a, _call_key(t, a), verdict) for t, a in calls)
    return RoundPlan(run_id, state.round, decisions, None, ended)


# -- settling a round -------------------------------------------------------------------


def _record(state: RunState, decision: Decision, result: ToolResult) -> bool:
    """Count one result; True if it told the run something new."""
    mark = fingerprint(result)
    new = mark not in state.seen
    if new:
        state.seen = [*state.seen, mark][-_MAX_SEEN:]
    shown = _excerpt(result.for_model(), _EXCERPT_CHARS)
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
    entry = {
        "tool": decision.tool,
        "arguments": _excerpt(decision.arguments, _ARGUMENTS_CHARS),
        "result": shown,
    }
    others = [
        e
        for e in state.last_results
        if (e["tool"], e["arguments"]) != (entry["tool"], entry["arguments"])
    ]
    state.last_results = [*others, entry][-_LAST_RESULTS:]  # the latest of distinct calls
    return new


def _stall(state: RunState, ran: Sequence[tuple[Decision, ToolResult]]) -> _Finding | None:
    """The round's results equal the previous rounds': no progress for R rounds in a row."""
    mark = _digest(sorted(fingerprint(r) for _, r in ran))
    state.streak = state.streak + 1 if mark == state.last_fingerprint else 1
    state.last_fingerprint = mark
    if state.streak < state.budget.no_progress_rounds:
        return None
    calls = [{"tool": d.tool, "arguments": _excerpt(d.arguments, _ARGUMENTS_CHARS)} for d, _ in ran]
    return _Finding(
        f"no_progress:{mark}",
        Pattern.NO_PROGRESS,
        f"the last {state.streak} rounds of tool calls returned exactly the same results",
        {"pattern": "no_progress", "rounds": state.streak, "calls": calls},
    )


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


def _hint(finding: _Finding) -> str:
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


def _nudged(item: GuardedResult, finding: _Finding, previous: Any) -> GuardedResult:
    if item.note:  # already nudged for this call: one hint is enough
        return item
    note: dict[str, Any] = {"verdict": "nudge", "pattern": str(finding.pattern)}
    note["hint"] = _hint(finding)
    if previous is not None:
        note["previous_result"] = previous
    return replace(item, verdict=Verdict.NUDGE, note=note)


def _disabled(decision: Decision, run_id: str, previous: Any) -> GuardedResult:
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
    return GuardedResult(result, Verdict.DISABLE)


def _ended(e: _Ended, decision: Decision, run_id: str) -> GuardedResult:
    result = _refusal(decision.tool, run_id, e.type, e.message, e.suggestion, e.details)
    verdict = Verdict.EXHAUSTED if e.type is ErrorType.RUN_BUDGET_EXHAUSTED else Verdict.ABORT
    return GuardedResult(result, verdict)


def _outcome(decision: Decision, result: ToolResult | None, run_id: str) -> GuardedResult:
    """The pre-run decision applied: nudged results, refusals for disabled tools."""
    if decision.verdict is Verdict.DISABLE:
        return _disabled(decision, run_id, decision.previous)
    if result is None:
        raise UsageError(f"the call of {decision.tool} was allowed to run but has no result")
    item = GuardedResult(result)
    if decision.verdict is Verdict.NUDGE and decision.finding is not None:
        item = _nudged(item, decision.finding, decision.previous)
    return item


def _apply_stall(
    state: RunState, items: list[GuardedResult], plan: RoundPlan, stall: _Finding, level: int
) -> list[GuardedResult]:
    """No progress seen after the round: nudge its results, or disable its tools."""
    if level == 1:
        return [_nudged(i, stall, None) if i.verdict.runs else i for i in items]
    ran = [d.tool for i, d in zip(items, plan.decisions, strict=True) if i.verdict.runs]
    for tool in ran:
        state.disabled[tool] = _Disabled(until_round=state.round + 1, reason=stall.why)
    out = []
    for item, decision in zip(items, plan.decisions, strict=True):
        if not item.verdict.runs:
            out.append(item)
            continue
        others = _alternatives(state, decision.tool, plan.offered)
        refused = replace(decision, reason=stall.why, also_next=True, alternatives=others)
        out.append(_disabled(refused, plan.run_id, item.result.for_model()))
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
        state = _copy(state)
    if plan.ended is not None:
        return state, [_ended(plan.ended, d, plan.run_id) for d in plan.decisions]
    ran = [
        (d, r)
        for d, r in zip(plan.decisions, results, strict=True)
        if r is not None and d.verdict.runs
    ]
    fresh = {d.key for d, r in ran if _record(state, d, r)}
    items = [_outcome(d, r, plan.run_id) for d, r in zip(plan.decisions, results, strict=True)]
    stall = _stall(state, ran) if ran else None
    level = _climb(state, stall, ran[0][0].tool, ran[0][0].key) if stall else 0
    _reset_rungs(state, bool(fresh), fresh)
    if stall is not None and level >= _MAX_LEVEL:
        state.ended = _aborted(state, now, stall)
        return state, [_ended(state.ended, d, plan.run_id) for d in plan.decisions]
    if stall is not None and level:
        items = _apply_stall(state, items, plan, stall, level)
    return state, items


# -- the guard ------------------------------------------------------------------------


#: Compare-and-set of a run's state. KEYS[1]: the state; ARGV: SHA-1 of the value the
#: caller read ('' = none), the new value ('' = delete), TTL in s. Writes only if the
#: value is still the one read, so a concurrent round is never overwritten: 1, else 0.
_CAS = r"""
local current = redis.call('GET', KEYS[1])
local seen = ''
if current then seen = redis.sha1hex(current) end
if seen ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
end
return 1
"""


def _sha(raw: str | None) -> str:
    return "" if raw is None else hashlib.sha1(raw.encode()).hexdigest()


class RunGuard:
    """One run's guardrails, with its state in Redis under the run id.

    Cheap to build: a new process (or a restarted client) makes a new guard
    for the same run id and carries on where the last one stopped. Updates are
    optimistic: read, decide in Python, then a Lua compare-and-set that fails
    if anyone wrote in between (then read again and decide again). A round
    costs three round trips when nobody else drives the run: a read and a write
    to begin it, one write to end it (the guard knows what it wrote).
    """

    def __init__(
        self,
        run_id: str,
        budget: RunBudget | None = None,
        *,
        redis: redis.Redis,
        keys: Keys | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(run_id, str) or not run_id or len(run_id) > 200:
            raise UsageError(f"a run id must be a string of 1-200 characters, not {run_id!r}")
        self.run_id = run_id
        self.budget = budget
        self.redis = redis
        self.keys = keys or Keys()
        self.clock: Clock = clock or SystemClock()
        self._cas = redis.register_script(_CAS)

    @property
    def key(self) -> str:
        return self.keys.run(self.run_id)

    def begin_round(
        self, calls: Sequence[tuple[str, Any]], *, alternatives: Sequence[str] = ()
    ) -> RoundPlan:
        """Decide each call's fate before any runs.

        ``alternatives`` are the tools the model may use instead of one the
        guard disables (usually the catalog's names).
        """

        def change(state: RunState | None) -> tuple[RunState, RoundPlan]:
            return plan_round(
                state,
                calls,
                run_id=self.run_id,
                budget=self.budget,
                now=self.clock.now(),
                alternatives=alternatives,
                copy=False,
            )

        plan, before, written = self._transact(change)
        return replace(plan, undo=(before, written or ""))

    def abandon_round(self, plan: RoundPlan) -> bool:
        """Take back a begun round whose calls never went out (the broker or Redis failed).

        Broken infrastructure is not the model's doing: the round must not count
        as a step, nor its calls as repeats when the loop sends them again. Only
        done if nothing changed the run since; returns whether it was.
        """
        if plan.undo is None:
            return False
        before, written = plan.undo
        ttl = RUN_IDLE_TTL_S if before is None else self._ttl(RunState.model_validate_json(before))
        return self._swap(written, before or "", ttl)

    def end_round(
        self, plan: RoundPlan, results: Sequence[ToolResult | None]
    ) -> list[GuardedResult]:
        """Record the results of a planned round (None for calls that did not run)."""

        def change(state: RunState | None) -> tuple[RunState, list[GuardedResult]]:
            return settle_round(state, plan, results, now=self.clock.now(), copy=False)

        known = plan.undo[1] if plan.undo else None
        return self._transact(change, known=known)[0]

    def report_tokens(self, tokens: int) -> RunView:
        """Add the tokens a model response used; the token budget is checked next round."""
        if tokens < 0:
            raise UsageError(f"tokens must be >= 0, not {tokens}")

        def change(state: RunState | None) -> tuple[RunState, None]:
            now = self.clock.now()
            state = RunState.new(self.budget or RunBudget(), now) if state is None else state
            state.tokens += tokens
            return state, None

        self._transact(change)
        return self.view()

    def view(self) -> RunView:
        """The run now; a run nobody has started shows its budget and no counts."""
        raw = self._call(self._read)
        if raw is None:
            return RunView(self.run_id, exists=False, budget=self.budget or RunBudget())
        state = RunState.model_validate_json(raw)
        return _view(self.run_id, state, self.clock.now())

    def forget(self) -> None:
        """Delete the run's state: the next round starts a new run under the same id."""
        self._call(lambda: self.redis.delete(self.key))

    # -- internals -----------------------------------------------------------

    def _ttl(self, state: RunState) -> int:
        wall = state.budget.max_wall_s or 0
        return int(max(RUN_IDLE_TTL_S, wall + 3600))

    def _read(self) -> str | None:
        raw = self.redis.get(self.key)
        return raw.decode() if isinstance(raw, bytes) else raw

    def _transact(
        self,
        change: Callable[[RunState | None], tuple[RunState | None, T]],
        known: str | None = None,
    ) -> tuple[T, str | None, str | None]:
        """Change the state (None: leave it); returns (outcome, value read, value written).

        ``known`` is the value this guard last wrote: tried without reading first.
        """
        raw = known if known is not None else self._call(self._read)
        for _ in range(_TRANSACTION_TRIES):
            state = None if raw is None else RunState.model_validate_json(raw)
            new, out = change(state)
            if new is None:
                return out, raw, raw
            text = new.model_dump_json()
            if self._swap(raw, text, self._ttl(new)):
                return out, raw, text
            raw = self._call(self._read)  # someone else wrote: decide again on theirs
        raise UsageError(
            f"run {self.run_id!r} changed under {_TRANSACTION_TRIES} attempts to update it: "
            "is more than one agent loop driving it at once?"
        )

    def _swap(self, expected: str | None, text: str, ttl: int) -> bool:
        """Write ``text`` ('' deletes) if the stored value is still ``expected``."""
        args: list[str | int] = [_sha(expected), text, ttl]
        return bool(self._call(lambda: self._cas(keys=[self.key], args=args)))

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            kwargs = self.redis.connection_pool.connection_kwargs
            where = kwargs.get("path") or f"redis://{kwargs.get('host')}:{kwargs.get('port')}"
            raise unavailable(str(where), exc) from exc


def _view(run_id: str, state: RunState, now: float) -> RunView:
    b = state.budget
    elapsed = max(0.0, now - state.started_at)
    return RunView(
        run_id=run_id,
        exists=True,
        budget=b,
        rounds=state.round,
        tokens=state.tokens,
        tool_errors=state.errors,
        consecutive_failures=state.consecutive_failures,
        elapsed_s=round(elapsed, 3),
        remaining_s=None if b.max_wall_s is None else max(0.0, b.max_wall_s - elapsed),
        ended=None if state.ended is None else state.ended.type,
        message=None if state.ended is None else state.ended.message,
        disabled=tuple(sorted(t for t, d in state.disabled.items() if d.until_round > state.round)),
    )
