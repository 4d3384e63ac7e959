"""What a fallback chain carries from step to step, inside the call's context.

Each step is its own Celery message, so everything a later step needs rides
in :attr:`CallContext.fallback <toolexec.context.CallContext.fallback>`: the
primary's error (every degraded answer keeps it), where the chain runs, and a
note for each step that did not answer. The call's own arguments (for the
cache key and the next argument mapping) are the ``arguments`` of each
``toolexec.fallback`` message; only while an alternative runs, on arguments
mapped for it, do they ride in the state. The caller's call id and reply list
stay the same throughout, so whichever step answers last delivers to the
handle the caller already holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from toolexec.errors import ErrorType
from toolexec.results import ErrorInfo, StepNote

__all__ = ["AGENT_FIXABLE", "FALLBACK_TASK", "ChainState", "falls_back"]

#: The Celery task that starts a chain and runs its cache and explanation steps.
FALLBACK_TASK = "toolexec.fallback"

#: Errors the model can fix by changing its call: a fallback would hide its mistake.
AGENT_FIXABLE = frozenset(
    {
        ErrorType.INVALID_ARGUMENTS,
        ErrorType.NOT_FOUND,
        ErrorType.UNAUTHORIZED,
        ErrorType.FORBIDDEN,
        ErrorType.CLIENT_ERROR,
        ErrorType.UNKNOWN_TOOL,
    }
)


def falls_back(error: ErrorInfo | None) -> bool:
    """Whether a final failure starts the tool's chain.

    Retries spent, an open breaker, a deadline with no time for another
    attempt, a crash: the tool cannot answer this call. An agent-fixable error
    goes back to the model instead, which can correct the call.
    """
    return error is not None and error.type not in AGENT_FIXABLE


@dataclass(frozen=True)
class ChainState:
    """One chain in progress; JSON in the call's context.

    ``attempts`` counts every tool body run for the call so far (primary and
    alternatives); ``hop`` counts the messages the chain has sent, to give
    each its own task id.
    """

    primary: str
    queue: str | None
    error: ErrorInfo
    primary_attempts: int
    arguments: Any
    attempts: int = 0
    next: int = 0
    hop: int = 0
    tried: tuple[StepNote, ...] = ()

    @classmethod
    def begin(
        cls, primary: str, queue: str | None, error: ErrorInfo, attempts: int, arguments: Any
    ) -> ChainState:
        return cls(primary, queue, error, attempts, arguments, attempts=attempts)

    def noted(self, note: StepNote) -> ChainState:
        return replace(self, tried=(*self.tried, note))

    def at(self, index: int) -> ChainState:
        return replace(self, next=index)

    def sent(self) -> ChainState:
        return replace(self, hop=self.hop + 1)

    def ran(self, attempts: int) -> ChainState:
        return replace(self, attempts=self.attempts + attempts)

    def task_id(self, call_id: str) -> str:
        """The id of the message this chain sends next (after :meth:`sent`)."""
        return f"{call_id}-fb{self.hop}"

    def to_json(self) -> dict[str, Any]:
        return {
            "primary": self.primary,
            "queue": self.queue,
            "error": self.error.model_dump(mode="json"),
            "primary_attempts": self.primary_attempts,
            "arguments": self.arguments,
            "attempts": self.attempts,
            "next": self.next,
            "hop": self.hop,
            "tried": [note.model_dump(mode="json") for note in self.tried],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ChainState:
        return cls(
            primary=raw["primary"],
            queue=raw.get("queue"),
            error=ErrorInfo.model_validate(raw["error"]),
            primary_attempts=int(raw.get("primary_attempts", 0)),
            arguments=raw.get("arguments"),
            attempts=int(raw.get("attempts", 0)),
            next=int(raw.get("next", 0)),
            hop=int(raw.get("hop", 0)),
            tried=tuple(StepNote.model_validate(n) for n in raw.get("tried", ())),
        )
