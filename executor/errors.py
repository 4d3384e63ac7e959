"""The one exception tree of toolexec, and the error types a model sees.

Two audiences raise and catch these. Tool authors raise :class:`ToolException`
subclasses to say how a failure should be treated; the executor turns every
failure into an :class:`ErrorType` on a :class:`~toolexec.results.ToolResult`.
Callers of the client only ever see :class:`ToolexecError` subclasses that mean
misuse or broken infrastructure, never a tool's own failure::

    ToolexecError                      raised to callers of toolexec itself
    ├── ConfigurationError             settings or a tool declaration are wrong
    ├── UsageError                     the client was called wrongly
    ├── InfrastructureError            toolexec cannot reach what it runs on
    │   ├── RedisUnavailableError
    │   ├── BrokerUnavailableError
    │   └── PayloadStoreUnavailableError  the payload store (Redis, directory, S3) fails
    ├── PayloadUnavailableError        a stored payload cannot be read back
    │   ├── PayloadExpiredError            its TTL has passed
    │   ├── PayloadMissingError            deleted, or another store than the writer's
    │   └── PayloadIntegrityError          its bytes do not match the reference's sha256
    └── ToolException                  raised inside tools; becomes a ToolResult
        ├── TransientError             worth retrying: the same call may succeed
        │   ├── ToolTimeoutError           timeout
        │   ├── ToolConnectionError        connection_error
        │   ├── RateLimitedError           rate_limited (honours retry_after)
        │   │   └── ThrottledError             rate_limited by toolexec's own shared limit
        │   ├── UnavailableError           unavailable (5xx)
        │   ├── CircuitOpenError           circuit_open (the tool's breaker refused the call)
        │   └── RetryBudgetExhaustedError  retry_budget_exhausted (too many retries fleet-wide)
        └── PermanentError             retrying the same call cannot help
            ├── InvalidArgumentsError      invalid_arguments (400, 422, schema)
            ├── UnauthorizedError          unauthorized (401)
            ├── ForbiddenError             forbidden (403)
            ├── NotFoundError              not_found (404)
            ├── ClientError                client_error (other 4xx)
            ├── IdempotencyMismatchError   idempotency_mismatch (a key reused with other arguments)
            ├── ResultTooLargeError        result_too_large (past the tool's result size limit)
            ├── UnknownToolError           unknown_tool (a remote MCP server does not have it)
            └── WorkerLostError            worker_lost (a crashed write that cannot be checked)

Decisions (retry, and later breaker and fallback) look at ``error_type`` and
``retryable``, never at a message.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

__all__ = [
    "TRANSIENT_TYPES",
    "BrokerUnavailableError",
    "CircuitOpenError",
    "ClientError",
    "ConfigurationError",
    "ErrorType",
    "ForbiddenError",
    "IdempotencyMismatchError",
    "InfrastructureError",
    "InvalidArgumentsError",
    "NotFoundError",
    "PayloadExpiredError",
    "PayloadIntegrityError",
    "PayloadMissingError",
    "PayloadStoreUnavailableError",
    "PayloadUnavailableError",
    "PermanentError",
    "RateLimitedError",
    "RedisUnavailableError",
    "ResultTooLargeError",
    "RetryBudgetExhaustedError",
    "ThrottledError",
    "ToolConnectionError",
    "ToolException",
    "ToolTimeoutError",
    "ToolexecError",
    "TransientError",
    "UnauthorizedError",
    "UnavailableError",
    "UnknownToolError",
    "UsageError",
    "WorkerLostError",
]


class ErrorType(StrEnum):
    """What went wrong, as the model and the operator see it."""

    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CLIENT_ERROR = "client_error"
    TOOL_ERROR = "tool_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL_ERROR = "internal_error"
    CIRCUIT_OPEN = "circuit_open"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
    # Answered by the client: no live worker serves the tool's queue (toolexec.stores.liveness).
    NO_WORKER = "no_worker"
    # The run guard's verdicts (toolexec.guard): not failures of a tool, so never retried.
    TOOL_DISABLED = "tool_disabled"
    RUN_ABORTED = "run_aborted"
    RUN_BUDGET_EXHAUSTED = "run_budget_exhausted"
    # Idempotency (toolexec.idempotency): never retried.
    IDEMPOTENCY_MISMATCH = "idempotency_mismatch"
    WORKER_LOST = "worker_lost"
    # A result past the tool's size limit (toolexec.payloads, http_request): not stored.
    RESULT_TOO_LARGE = "result_too_large"
    # Human approval (toolexec.layers.approvals): the call never ran; never retried, never falls
    # back.
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMEOUT = "approval_timeout"


#: Failures that the same call may not meet again: retried by default.
TRANSIENT_TYPES = frozenset(
    {ErrorType.TIMEOUT, ErrorType.CONNECTION_ERROR, ErrorType.RATE_LIMITED, ErrorType.UNAVAILABLE}
)


class ToolexecError(Exception):
    """Base of every exception toolexec raises."""


class ConfigurationError(ToolexecError):
    """Settings or a tool declaration are wrong; fix them and restart."""


class UsageError(ToolexecError, ValueError):
    """The client API was called with something it cannot accept."""


class InfrastructureError(ToolexecError):
    """Redis or the broker cannot be reached; the call was not made."""


class RedisUnavailableError(InfrastructureError):
    """toolexec's Redis does not answer."""


class BrokerUnavailableError(InfrastructureError):
    """The Celery broker does not accept messages."""


class PayloadStoreUnavailableError(InfrastructureError):
    """The store of large payloads (Redis, a directory, S3) cannot be reached."""


class PayloadUnavailableError(ToolexecError):
    """A stored payload (a large result or argument) cannot be read back.

    The message says which payload, why, and what to do; the reference itself
    stays valid as a record of what was stored.
    """


class PayloadExpiredError(PayloadUnavailableError):
    """The payload's time to live has passed and the store has dropped it."""


class PayloadMissingError(PayloadUnavailableError):
    """The store has no such payload: deleted, or written to another store."""


class PayloadIntegrityError(PayloadUnavailableError):
    """The stored bytes differ from what the reference's sha256 promises."""


class ToolException(ToolexecError):
    """A tool's failure, with what the model should make of it.

    ``suggestion`` is written for the model: what to do next. ``details`` is
    any JSON-able context (a status code, a field name).
    """

    error_type: ClassVar[ErrorType] = ErrorType.TOOL_ERROR
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        suggestion: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.suggestion = suggestion
        self.details = details or {}


class TransientError(ToolException):
    """The same call may succeed later; ``retry_after`` is a floor in seconds."""

    error_type = ErrorType.UNAVAILABLE
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        suggestion: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, suggestion=suggestion, details=details)
        # a tool may pass any number on: only a finite, bounded one travels on
        from toolexec.bounds import bounded_retry_after  # bounds builds on this module

        self.retry_after = bounded_retry_after(retry_after)


class ToolTimeoutError(TransientError):
    error_type = ErrorType.TIMEOUT


class ToolConnectionError(TransientError):
    error_type = ErrorType.CONNECTION_ERROR


class RateLimitedError(TransientError):
    error_type = ErrorType.RATE_LIMITED


class UnavailableError(TransientError):
    error_type = ErrorType.UNAVAILABLE


class ThrottledError(RateLimitedError):
    """toolexec's own shared rate limit held the call back; the service was not called.

    ``reserved`` means a slot ``retry_after`` seconds from now is kept for
    this call, and the worker defers it that long without using an attempt;
    False when no slot comes before the call's deadline (the call ends).
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float,
        reserved: bool,
        suggestion: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after, suggestion=suggestion, details=details)
        self.reserved = reserved


class RetryBudgetExhaustedError(TransientError):
    """A transient failure that was not retried: the tool's retry budget is spent.

    Retrying was refused to protect a service that fails for many callers at
    once (``toolexec.layers.retry_budget``), so the primary is as good as unavailable: a
    fallback chain treats this like ``unavailable`` or ``circuit_open``.
    ``details["last_error"]`` is the failure that was not retried.
    """

    error_type = ErrorType.RETRY_BUDGET_EXHAUSTED
    #: Seconds the call may wait for budget instead of ending (``toolexec.waits``); None: end.
    wait_s: float | None = None


class CircuitOpenError(TransientError):
    """The tool's circuit breaker is open: the tool body was not run.

    Retryable because the breaker closes again by itself; ``retry_after`` says
    when it may admit a call (``None`` when unknown: an operator isolates the
    tool, or the breaker cannot reach Redis and is set to refuse).
    """

    error_type = ErrorType.CIRCUIT_OPEN
    #: Seconds the call may wait for the breaker's next probe (``toolexec.waits``); None: end.
    wait_s: float | None = None


class ApprovalDeniedError(ToolException):
    """A person denied the call (``@tool(approval=...)``): the tool did not run."""

    error_type = ErrorType.APPROVAL_DENIED


class AwaitingApprovalError(ToolException):
    """The call waits for a person's approval, parked in the queue (``toolexec.layers.approvals``).

    ``wait_s`` is how long it stays parked before it looks again; None when the
    approval window is over, and the call ends with ``approval_timeout``.
    """

    error_type = ErrorType.APPROVAL_TIMEOUT
    wait_s: float | None = None


class PermanentError(ToolException):
    """The same call will fail again; the model must change something."""

    error_type = ErrorType.CLIENT_ERROR


class InvalidArgumentsError(PermanentError):
    error_type = ErrorType.INVALID_ARGUMENTS


class UnauthorizedError(PermanentError):
    error_type = ErrorType.UNAUTHORIZED


class ForbiddenError(PermanentError):
    error_type = ErrorType.FORBIDDEN


class NotFoundError(PermanentError):
    error_type = ErrorType.NOT_FOUND


class ClientError(PermanentError):
    error_type = ErrorType.CLIENT_ERROR


class ResultTooLargeError(PermanentError):
    """The tool's answer is larger than its limit; the same request gets the same answer,
    so the model must ask for less (a page, a filter, a narrower range)."""

    error_type = ErrorType.RESULT_TOO_LARGE


class IdempotencyMismatchError(PermanentError):
    """The idempotency key was used before for a call with other arguments."""

    error_type = ErrorType.IDEMPOTENCY_MISMATCH


class UnknownToolError(PermanentError):
    """The tool is not there: a remote MCP server answered that it has no such tool."""

    error_type = ErrorType.UNKNOWN_TOOL


class WorkerLostError(PermanentError):
    """The worker running a write died mid-call and the tool has no check.

    Permanent: repeating the call blindly could do the action twice; the result
    says ``status: unknown`` instead.
    """

    error_type = ErrorType.WORKER_LOST
