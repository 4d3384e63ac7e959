"""What an idempotency record is: its modes, its id, and the values the store returns.

Plain data and pure functions, shared by the store, the layer and the sweeper.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.registry import ToolSpec
from toolexec.results import ToolResult

__all__ = [
    "REQUEUE_LEASES",
    "UNCERTAIN_TYPES",
    "Claim",
    "ClaimKind",
    "FinalState",
    "Finished",
    "Lease",
    "Message",
    "Mode",
    "call_mode",
    "record_id",
]

#: ``lease``: a read-only call, held only so that a dead worker's call is handed on.
Mode = Literal["idempotent", "coalesce", "lease"]
ClaimKind = Literal["acquired", "joined", "duplicate", "replay", "mismatch"]
FinalState = Literal["succeeded", "failed", "unknown", "released"]

#: Failures after which a write may or may not have happened: the request may
#: have reached the service before the time ran out or the connection broke.
UNCERTAIN_TYPES = frozenset({ErrorType.TIMEOUT, ErrorType.CONNECTION_ERROR})

#: How many leases a call handed to another worker may wait in the queue before
#: a sweeper hands it over again.
REQUEUE_LEASES = 3


def call_mode(spec: ToolSpec, ctx: CallContext) -> Mode:
    """How a call is held: a caller's key or side effects make it idempotent.

    Every other call holds a lease too (``lease``), so that the sweeper hands
    a dead worker's call on within seconds instead of the broker's visibility
    timeout: at least once, which a read-only tool can afford.
    """
    if ctx.idempotency_key or spec.policy.side_effects:
        return "idempotent"
    return "coalesce" if spec.policy.coalesce else "lease"


def record_id(mode: Mode, args_hash: str, ctx: CallContext) -> str:
    """The record a call belongs to; ``args_hash`` is :func:`arguments_hash` of the call.

    A caller's key names it within its tool (the same key with other arguments
    is a mismatch; with another tool it is another record, so one tool's keys
    cannot replay or block another's). Otherwise the run id, the tool and the
    normalised arguments; a call without a run id is scoped to its own call id,
    which still protects it against redelivery and retries. Coalesced reads are
    shared by everyone: tool and arguments only. Every basis starts with the
    caller's tenant (``TOOLEXEC_TENANT``), so tenants never share a record.
    """
    tenant = f"tenant\0{ctx.tenant or ''}\0"
    if ctx.idempotency_key:
        basis = f"key\0{ctx.tool}\0{ctx.idempotency_key}"
    elif mode == "lease":
        basis = f"lease\0{ctx.call_id}"
    elif mode == "coalesce":
        basis = f"coalesce\0{args_hash}"
    else:
        scope = f"run\0{ctx.run_id}" if ctx.run_id else f"call\0{ctx.call_id}"
        basis = f"{scope}\0{args_hash}"
    return hashlib.sha256((tenant + basis).encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Lease:
    """The right to run one call and store its outcome; ``token`` only ever grows."""

    record: str
    owner: str
    token: int


@dataclass(frozen=True)
class Message:
    """What a sweeper publishes to hand a call whose holder died to another worker."""

    task: str
    queue: str
    arguments: dict[str, Any]
    context: dict[str, Any]
    attempt: int

    @property
    def call_id(self) -> str:
        return str(self.context["call_id"])

    def kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments, as the client sends them."""
        return {"arguments": self.arguments, "context": self.context}


@dataclass(frozen=True)
class Claim:
    """What :meth:`IdempotencyStore.begin` found.

    ``acquired``: this run holds the lease (``uncertain``: an earlier run may
    have written already); ``joined``: another call is running it and will
    answer this one too; ``duplicate``: another copy of this very call is
    running; ``replay``: it is over and ``stored`` is the result;
    ``mismatch``: the key was used with other arguments.
    """

    kind: ClaimKind
    lease: Lease | None = None
    uncertain: bool = False
    state: str | None = None
    stored: ToolResult | None = None


@dataclass(frozen=True)
class Finished:
    """Whether the outcome was stored, and the calls that joined and wait for it."""

    stored: bool
    waiters: list[CallContext]
