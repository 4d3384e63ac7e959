"""toolexec: a distributed executor for LLM agents' tool calls, on Celery and Redis.

Declare tools with :func:`tool` in a module the worker imports; call them by
name from anywhere with :class:`ToolClient`. Every call ends in one typed
:class:`ToolResult`.
"""

from toolexec.caller import Answer, elicit, log, sample
from toolexec.client import CallHandle, ToolClient
from toolexec.clock import Clock, ManualClock, SystemClock
from toolexec.content import Audio, Content, Image, Resource, Text
from toolexec.errors import (
    BrokerUnavailableError,
    ClientError,
    ConfigurationError,
    ErrorType,
    ForbiddenError,
    InfrastructureError,
    InvalidArgumentsError,
    NotFoundError,
    PayloadExpiredError,
    PayloadIntegrityError,
    PayloadMissingError,
    PayloadStoreUnavailableError,
    PayloadUnavailableError,
    PermanentError,
    RateLimitedError,
    RedisUnavailableError,
    ToolConnectionError,
    ToolException,
    ToolexecError,
    ToolTimeoutError,
    TransientError,
    UnauthorizedError,
    UnavailableError,
    UsageError,
)
from toolexec.policies import (
    ApprovalPolicy,
    BreakerPolicy,
    Jitter,
    RateLimitPolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    RunBudget,
    ToolPolicy,
)
from toolexec.registry import Registry, ToolSpec, default_registry, tool
from toolexec.resources import notify_updated, resource
from toolexec.results import ErrorInfo, PayloadRef, Timings, ToolResult
from toolexec.retry import RetryDecision
from toolexec.settings import Settings

__all__ = [
    "Answer",
    "ApprovalPolicy",
    "Audio",
    "BreakerPolicy",
    "BrokerUnavailableError",
    "CallHandle",
    "ClientError",
    "Clock",
    "ConfigurationError",
    "Content",
    "ErrorInfo",
    "ErrorType",
    "ForbiddenError",
    "Image",
    "InfrastructureError",
    "InvalidArgumentsError",
    "Jitter",
    "ManualClock",
    "NotFoundError",
    "PayloadExpiredError",
    "PayloadIntegrityError",
    "PayloadMissingError",
    "PayloadRef",
    "PayloadStoreUnavailableError",
    "PayloadUnavailableError",
    "PermanentError",
    "RateLimitPolicy",
    "RateLimitedError",
    "RedisUnavailableError",
    "Registry",
    "Resource",
    "RetryBudgetPolicy",
    "RetryDecision",
    "RetryPolicy",
    "RunBudget",
    "Settings",
    "SystemClock",
    "Text",
    "Timings",
    "ToolClient",
    "ToolConnectionError",
    "ToolException",
    "ToolPolicy",
    "ToolResult",
    "ToolSpec",
    "ToolTimeoutError",
    "ToolexecError",
    "TransientError",
    "UnauthorizedError",
    "UnavailableError",
    "UsageError",
    "default_registry",
    "elicit",
    "log",
    "notify_updated",
    "resource",
    "sample",
    "tool",
]
