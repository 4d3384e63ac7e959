"""One typed result for every outcome of a tool call.

A model reasons better about a failure it can read than about a stack trace,
so every path (success, validation failure, retries spent, deadline passed,
no worker answering) ends in the same :class:`ToolResult`, which renders
itself as an OpenAI tool message or an Anthropic ``tool_result`` block.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from toolexec.content import anthropic_content, blocks_of, text_of
from toolexec.errors import ErrorType, ToolException, UsageError
from toolexec.redaction import redact, scrub_text

if TYPE_CHECKING:  # a type only: the context carries results' parts (ErrorInfo, StepNote)
    from toolexec.context import CallContext

__all__ = [
    "ErrorInfo",
    "FallbackInfo",
    "PayloadRef",
    "PayloadUnit",
    "Status",
    "StepNote",
    "Timings",
    "ToolResult",
    "elapsed_ms_for",
    "error_info",
    "error_result",
    "restamped",
    "timings_for",
]

Status = Literal["ok", "error", "unknown"]


class ErrorInfo(BaseModel):
    """Why a call failed, written for the model that made it."""

    model_config = ConfigDict(frozen=True)

    type: ErrorType
    message: str
    suggestion: str | None = None
    retryable: bool = False
    retry_after: float | None = Field(
        default=None, description="Seconds to wait before calling again, when known."
    )
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("message", "suggestion")
    @classmethod
    def _no_credentials(cls, text: str | None) -> str | None:
        """Messages quote URLs and exceptions; they reach the model, logs, events and Flower."""
        return None if text is None else scrub_text(text)

    @field_validator("details")
    @classmethod
    def _no_credential_details(cls, details: dict[str, Any]) -> dict[str, Any]:
        redacted: dict[str, Any] = redact(details)
        return redacted


class Timings(BaseModel):
    """Where the time of a call went, in milliseconds."""

    model_config = ConfigDict(frozen=True)

    queued_ms: float = 0.0
    run_ms: float = 0.0
    backoff_ms: float = 0.0


class StepNote(BaseModel):
    """One fallback step that did not answer, and why (``fallback/``)."""

    model_config = ConfigDict(frozen=True)

    source: str = Field(description="The step: an alternative tool's name, or cache.")
    outcome: Literal["failed", "skipped", "miss"]
    reason: str


class FallbackInfo(BaseModel):
    """Why a result is degraded: the primary tool's error and what was tried after it.

    The model weighs a degraded answer by it: a day-old cached forecast after
    a timeout reads differently from a fresh one.
    """

    model_config = ConfigDict(frozen=True)

    primary_error: ErrorInfo
    primary_attempts: int = 0
    tried: list[StepNote] = Field(default_factory=list)
    age_s: float | None = Field(
        default=None, description="Seconds since a cached result was stored (source cache)."
    )

    def for_model(self) -> dict[str, Any]:
        error = self.primary_error.model_dump(
            include={"type", "message", "retry_after"}, exclude_none=True
        )
        body: dict[str, Any] = {"primary_error": error}
        if self.age_s is not None:
            body["age_s"] = round(self.age_s, 1)
        if self.tried:
            body["tried"] = [note.model_dump() for note in self.tried]
        return body


PayloadUnit = Literal["lines", "items", "keys"]


class PayloadRef(BaseModel):
    """A claim check for a value too large to travel in messages (``toolexec.payloads``).

    Messages and replies carry this reference and a preview; the value itself
    waits in the payload store until ``expires_at`` (epoch seconds; None: never).
    """

    model_config = ConfigDict(frozen=True)

    key: str
    store: str = Field(description="Kind of store that holds it: redis, file or s3.")
    size_bytes: int
    content_type: str
    sha256: str
    index_sha256: str | None = Field(
        default=None,
        description="sha256 of the stored paging index, so a page read is verified too.",
    )
    expires_at: float | None = None
    unit: PayloadUnit = Field(description="What read_payload's offset and limit count.")
    count: int = Field(description="How many lines, items or keys the whole value has.")


class ToolResult(BaseModel):
    """The outcome of one tool call.

    When ``payload`` is set, ``data`` is only a preview of a large value kept
    in the payload store; :meth:`load` returns the whole value.
    """

    model_config = ConfigDict(frozen=True)

    status: Status
    tool: str
    call_id: str
    run_id: str | None = None
    data: Any = None
    error: ErrorInfo | None = None
    degraded: bool = False
    source: str | None = Field(default=None, description="What produced data, when not the tool.")
    attempts: int = Field(default=0, description="Times the tool body ran; 0 if it never did.")
    elapsed_ms: float = Field(default=0.0, description="From submission to this result.")
    timings: Timings = Field(default_factory=Timings)
    payload: PayloadRef | None = Field(
        default=None, description="Where the whole value is when data is a preview."
    )
    injected: bool = Field(
        default=False,
        description="An injected fault (toolexec.layers.faults: an error, latency or a replaced "
        "outcome) shaped some attempt of this call; only ever true in a test setup.",
    )
    _loader: Callable[[PayloadRef], Any] | None = PrivateAttr(default=None)
    fallback: FallbackInfo | None = Field(
        default=None, description="With degraded: the primary's error and the steps tried."
    )
    replayed: bool = Field(
        default=False,
        description="The tool did not run for this call: this is the outcome of an earlier or "
        "concurrent call with the same idempotency key (toolexec.idempotency).",
    )
    guard: dict[str, Any] | None = Field(
        default=None,
        description="The run guard's nudge on this call (a hint and the previous result of "
        "the same call), when it made one; the model reads it with the result.",
    )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def attach_loader(self, loader: Callable[[PayloadRef], Any]) -> ToolResult:
        """Let :meth:`load` fetch this result's payload (the client does this)."""
        self._loader = loader
        return self

    def load(self) -> Any:
        """The whole value: ``data`` itself, or the stored payload, checked against its sha256.

        Raises a :class:`~toolexec.errors.PayloadUnavailableError` when the
        payload has expired or is missing.
        """
        if self.payload is None:
            return self.data
        if self._loader is None:
            raise UsageError(
                "this result was not returned by a ToolClient, so it cannot fetch its payload; "
                "use ToolClient.fetch_payload(result.payload) instead"
            )
        return self._loader(self.payload)

    def for_model(self) -> dict[str, Any]:
        """The part of the result a model needs; bookkeeping such as ids stays out."""
        body = self._for_model()
        if self.guard:
            body["guard"] = self.guard
        return body

    def _for_model(self) -> dict[str, Any]:
        if self.status == "ok" and not self.degraded:
            ok: dict[str, Any] = {"status": "ok", "data": self.data}
            return {**ok, "replayed": True} if self.replayed else ok
        body: dict[str, Any] = {"status": self.status}
        if self.data is not None:
            body["data"] = self.data
        if self.error is not None:
            body["error"] = self.error.model_dump(exclude_none=True, exclude={"details"})
            if self.error.details:
                body["error"]["details"] = self.error.details
        if self.degraded:
            body["degraded"] = True
            body["source"] = self.source
            if self.fallback is not None:
                body["fallback"] = self.fallback.for_model()
        if self.replayed:
            body["replayed"] = True
        body["attempts"] = self.attempts
        return body

    def content(self) -> str:
        """The result as the text of a tool message (a rich result's blocks described)."""
        body = self.for_model()
        blocks = self.blocks()
        if blocks is not None:
            body["data"] = text_of(blocks)
        return json.dumps(body, ensure_ascii=False, default=str)

    def blocks(self) -> list[dict[str, Any]] | None:
        """The content blocks of a rich result (``toolexec.content``), or None."""
        if self.status != "ok" or self.payload is not None:
            return None
        return blocks_of(self.data)

    def to_openai_message(self, tool_call_id: str) -> dict[str, Any]:
        """A chat-completions ``role: tool`` message answering ``tool_call_id``."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.content()}

    def to_anthropic_block(self, tool_use_id: str) -> dict[str, Any]:
        """A Messages API ``tool_result`` content block answering ``tool_use_id``."""
        blocks = self.blocks()
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            # a rich result's images go as image blocks, which a tool result may hold
            "content": self.content() if blocks is None else anthropic_content(blocks),
        }
        if self.status != "ok":
            block["is_error"] = True
        return block


# -- results made for a call: its ids and its own timings ------------------------
# Here, not in the executor, because the client builds failed results too
# (refused before sending, no answer by the deadline) and must not load the
# worker's attempt pipeline to do it (docs/architecture.md, Boundaries).


def error_info(error: ToolException) -> ErrorInfo:
    return ErrorInfo(
        type=error.error_type,
        message=error.message,
        suggestion=error.suggestion,
        retryable=error.retryable,
        retry_after=getattr(error, "retry_after", None),
        details=error.details,
    )


def error_result(
    ctx: CallContext, info: ErrorInfo, *, attempts: int, now: float, status: str = "error"
) -> ToolResult:
    """A failed result with the timings the context has gathered."""
    return ToolResult(
        status=status,  # type: ignore[arg-type]
        tool=ctx.tool,
        call_id=ctx.call_id,
        run_id=ctx.run_id,
        error=info,
        injected=ctx.injected,
        attempts=attempts,
        elapsed_ms=elapsed_ms_for(ctx, now),
        timings=timings_for(ctx, now),
    )


def restamped(result: ToolResult, ctx: CallContext, now: float, **changes: Any) -> ToolResult:
    """``result`` as the answer to the call ``ctx``: its ids and its own timings.

    A stored or shared result (``toolexec.idempotency``) goes to callers other
    than the one it was made for.
    """
    update = {
        "call_id": ctx.call_id,
        "run_id": ctx.run_id,
        "elapsed_ms": elapsed_ms_for(ctx, now),
        "timings": timings_for(ctx, now),
        **changes,
    }
    return result.model_copy(update=update)


def elapsed_ms_for(ctx: CallContext, now: float) -> float:
    """Milliseconds since the call was submitted."""
    return round(max(0.0, now - ctx.submitted_at) * 1000, 3)


def timings_for(ctx: CallContext, now: float) -> Timings:
    """Where the call's time went so far: queued, running, backing off."""
    elapsed = max(0.0, now - ctx.submitted_at)
    queued = max(0.0, elapsed - ctx.run_s - ctx.backoff_s)
    return Timings(
        queued_ms=round(queued * 1000, 3),
        run_ms=round(ctx.run_s * 1000, 3),
        backoff_ms=round(ctx.backoff_s * 1000, 3),
    )
