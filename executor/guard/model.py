"""What the run guard knows and decides: a run's stored state, its budget, and the
values a round produces (decisions, plans, guarded results).

One JSON document per run (pydantic models, so it round-trips exactly); the
constants bound its size, because the whole state is read and written every round.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from toolexec.errors import ErrorType
from toolexec.normalize import arguments_hash, canonical_json, digest_bytes, normalize
from toolexec.policies import RunBudget
from toolexec.results import ToolResult

__all__ = [
    "ARGUMENTS_CHARS",
    "EXCERPT_CHARS",
    "LAST_RESULTS",
    "MAX_ALTERNATIVES",
    "MAX_CALLS",
    "MAX_LEVEL",
    "MAX_SEEN",
    "CallRecord",
    "Decision",
    "DisabledTool",
    "Finding",
    "GuardedResult",
    "Pattern",
    "RoundPlan",
    "Ruling",
    "RunEnd",
    "RunState",
    "RunView",
    "Rung",
    "call_key",
    "copy_state",
    "digest",
    "excerpt",
    "fingerprint",
]


#: How much of a result or an argument list the state keeps; the model gets it back
#: as ``previous_result`` and in an abort's summary, so it must stay readable.
EXCERPT_CHARS = 2_000


ARGUMENTS_CHARS = 500


#: Distinct calls remembered for an abort's summary; the least recently made go first.
#: The whole state is read and written every round, so it must stay small.
MAX_CALLS = 50


#: Result fingerprints remembered to tell progress from repetition.
MAX_SEEN = 300


LAST_RESULTS = 3


MAX_ALTERNATIVES = 8


MAX_LEVEL = 3


class Ruling(StrEnum):
    """What the guard made of one call."""

    RUN = "run"
    NUDGE = "nudge"
    DISABLE = "disable"
    ABORT = "abort"
    EXHAUSTED = "exhausted"

    @property
    def runs(self) -> bool:
        return self in (Ruling.RUN, Ruling.NUDGE)


class Pattern(StrEnum):
    """The kinds of being stuck the guard recognises."""

    REPEAT = "repeat"
    CYCLE = "cycle"
    NO_PROGRESS = "no_progress"


class CallRecord(BaseModel):
    """One distinct call of the run: what it was, how often, what it last returned."""

    tool: str
    #: Left empty: the call's key (a hash of tool and arguments) stands for them. Still
    #: read from states written before, which held the arguments themselves.
    arguments: Any = None
    requested: int = 0
    ran: int = 0
    status: str | None = None
    result: Any = None


class Rung(BaseModel):
    """Where one stuck key stands on the ladder, and the round it last climbed."""

    level: int
    round: int
    pattern: Pattern
    tool: str
    key: str


class DisabledTool(BaseModel):
    until_round: int
    reason: str


class RunEnd(BaseModel):
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
    calls: dict[str, CallRecord] = Field(default_factory=dict)
    ladder: dict[str, Rung] = Field(default_factory=dict)
    disabled: dict[str, DisabledTool] = Field(default_factory=dict)
    seen: list[str] = Field(default_factory=list)
    last_fingerprint: str | None = None
    streak: int = 0
    last_results: list[dict[str, Any]] = Field(default_factory=list)
    ended: RunEnd | None = None
    #: The run's tenant for the workers' fair dispatch: its calls that name no
    #: fairness key wait under this one (the first key a round of the run gave).
    fairness_key: str | None = None

    @classmethod
    def new(cls, budget: RunBudget, now: float) -> RunState:
        return cls(budget=budget, started_at=now)


@dataclass(frozen=True)
class Finding:
    """One detector's finding on a call: the ladder key it climbs and why."""

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
    ruling: Ruling
    finding: Finding | None = None
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
    ended: RunEnd | None = None
    offered: tuple[str, ...] = ()
    #: The run's fairness key, inherited by its calls that give none.
    fairness_key: str | None = None
    #: The stored state (JSON) before and after planning: the end of the round is
    #: written against the latter, and a round whose calls never went out is taken
    #: back to the former (:meth:`RunGuard.abandon_round`).
    undo: tuple[str | None, str] | None = field(default=None, compare=False, repr=False)

    @property
    def to_run(self) -> list[int]:
        """Indexes of the calls that may run."""
        return [i for i, d in enumerate(self.decisions) if d.ruling.runs]


@dataclass(frozen=True)
class GuardedResult:
    """A call's result with the guard's ruling; renders what the model reads.

    ``note`` is the nudge (a hint and the previous result of the same call);
    refusals are ordinary error results of type ``tool_disabled``,
    ``run_aborted`` or ``run_budget_exhausted``.
    """

    result: ToolResult
    ruling: Ruling = Ruling.RUN
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
    fairness_key: str | None = None


def digest(value: Any) -> str:
    return hashlib.sha256(digest_bytes(canonical_json(value))).hexdigest()[:16]


def call_key(tool: str, arguments: Any) -> str:
    """The identity of a call, shortened: 64 bits keep collisions out of reach of one run."""
    return arguments_hash(tool, arguments)[:16]


def copy_state(state: RunState) -> RunState:
    """A private copy to change; through JSON, many times faster than ``deepcopy``."""
    return RunState.model_validate_json(state.model_dump_json())


def fingerprint(result: ToolResult) -> str:
    """What a result says, without ids or timings: equal fingerprints, no new information.

    Errors count by their type only: messages carry times and ids that differ
    while the answer does not.
    """
    return digest(
        {
            "tool": result.tool,
            "status": result.status,
            "data": result.data,
            "error": None if result.error is None else str(result.error.type),
            "degraded": result.degraded,
        }
    )


def excerpt(value: Any, limit: int) -> Any:
    """``value`` itself if its JSON is short, else the start of its JSON as text."""
    text = canonical_json(value)
    return normalize(value) if len(text) <= limit else text[:limit] + "…"
