"""Circuit breakers shared by every worker and client, exact across a fleet.

``policy`` is what a tool declares, ``views`` what the store answers,
``store`` the Redis state and its Lua transitions (``lua/breaker*.lua``),
``gate`` the client's pre-check (a local copy Redis invalidates). Two modules
are not re-exported here, so that importing a policy stays cheap:
``toolexec.breaker.layer`` (the worker's layer, which needs the attempt
pipeline) and ``toolexec.breaker.cli`` (``toolexec breakers``, which needs the
``ops`` extra).
"""

from toolexec.breaker.gate import BreakerGate, refusal_for
from toolexec.breaker.policy import breaker_name, counts_as_failure
from toolexec.breaker.store import CircuitBreaker
from toolexec.breaker.views import (
    Admission,
    BreakerState,
    BreakerView,
    Listener,
    Transition,
    TransitionReason,
)

__all__ = [
    "Admission",
    "BreakerGate",
    "BreakerState",
    "BreakerView",
    "CircuitBreaker",
    "Listener",
    "Transition",
    "TransitionReason",
    "breaker_name",
    "counts_as_failure",
    "refusal_for",
]
