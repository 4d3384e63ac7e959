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

from toolexec.context import ChainState
from toolexec.errors import ErrorType
from toolexec.results import ErrorInfo

__all__ = ["AGENT_FIXABLE", "FALLBACK_TASK", "ChainState", "falls_back"]

# ChainState lives with the context it travels in; it is this module's subject all the same.

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
        # a person said no, or no one said yes: another tool must not do it instead
        ErrorType.APPROVAL_DENIED,
        ErrorType.APPROVAL_TIMEOUT,
    }
)


def falls_back(error: ErrorInfo | None) -> bool:
    """Whether a final failure starts the tool's chain.

    Retries spent, an open breaker, a deadline with no time for another
    attempt, a crash: the tool cannot answer this call. An agent-fixable error
    goes back to the model instead, which can correct the call.
    """
    return error is not None and error.type not in AGENT_FIXABLE
