"""The layers around a tool body: the contract, and the layers that have no package
of their own.

``contract`` is what a layer is (hooks, attempts, verdicts; re-exported here);
``batch`` the shared round trips of admission and settlement. Each other module
is one layer with its store: ``ratelimit``, ``retry_budget``, ``retry_after``,
``faults``, ``approvals``. The layers with packages of their own are
``breaker.layer``, ``idempotency.layer``, ``payloads.offload`` and
``fallback.cache``; ``tasks.runtime`` composes them all.
"""

from toolexec.layers.contract import (
    Attempt,
    Batch,
    Defer,
    Final,
    Layer,
    NoReply,
    Outcome,
    Proceed,
    Retry,
    Verdict,
    compose,
)

__all__ = [
    "Attempt",
    "Batch",
    "Defer",
    "Final",
    "Layer",
    "NoReply",
    "Outcome",
    "Proceed",
    "Retry",
    "Verdict",
    "compose",
]
