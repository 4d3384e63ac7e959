"""The attempt pipeline: layers around the tool body, each with named hooks.

A layer is a class with three hooks, each a no-op by default, in the manner of
dramatiq's middleware: a protection overrides only the hooks it needs, and the
executor (``toolexec.pipeline.execution``) calls every hook of every layer at a fixed
point of an attempt, so nothing is found by name or passed through a side door.

``around(attempt, proceed)``
    Wraps the rest of the stack, as in a Polly pipeline or ASGI middleware:
    it may answer without proceeding (an open breaker, a deferral), look at
    the outcome on the way back (record it, cache it), or both. Outermost
    first.
``allow_retry(attempt, failure)``
    Asked only when the retry policy wants another attempt: None lets it go
    ahead, an error ends the call with that error instead (a spent retry
    budget). Outermost first; the first refusal wins.
``settle(attempt, outcome, verdict)``
    Shown the executor's verdict once it exists, innermost first, and may
    replace it: what a layer stores can depend on whether the call ends or
    retries, which is known only after every ``around`` has returned.

Two more hooks let the layers share round trips (``toolexec.layers.batch``):

``admit(attempt, batch)``
    Before any ``around``, outermost first: queue what the layer asks Redis
    before the attempt (a lease, a breaker permit) on the admission batch;
    the reply arrives in a callback, which keeps it in the attempt's notes
    for ``around``. The batch runs once, in one round trip, before the first
    ``around``; a layer whose ``around`` is then never reached (an outer
    layer answered) gives back what it took in ``record``.
``record(attempt, outcome, verdict, batch)``
    After every ``settle``: queue the writes whose replies change nothing
    about the verdict (a breaker's or a budget's count) on the settlement
    batch, which the worker sends in the round trip that answers the call.

A layer that must carry something of its own from ``around`` to ``settle``
(the idempotency layer's lease) keeps it in :attr:`Attempt.notes` under its
own name, as a Polly ``ResilienceContext`` keeps properties: the attempt is
the one object both hooks see, and no other layer reads those notes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolexec.context import CallContext
from toolexec.errors import ToolException
from toolexec.keys import WRITE_ID_MARGIN_S
from toolexec.layers.batch import Batch
from toolexec.results import PayloadRef, ToolResult

if TYPE_CHECKING:  # only types here: the registry imports the policies of layer modules,
    # and the idempotency package builds on this module
    from toolexec.idempotency.records import Lease
    from toolexec.registry import ToolSpec

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


@dataclass(frozen=True)
class Attempt:
    """One attempt of one call, arguments already validated."""

    spec: ToolSpec
    ctx: CallContext
    number: int
    arguments: dict[str, Any]  # validated, as JSON: what keys are derived from
    limit: float  # seconds this attempt may run: min(tool timeout, time left)
    #: Per-attempt data a layer hands from its ``around`` to its ``settle``, under its name.
    notes: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tool(self) -> str:
        return self.spec.name

    @property
    def write(self) -> tuple[str, float]:
        """This attempt's write id and until when a script must remember it.

        A held write (``toolexec.layers.batch``) carries it, so that sent again after
        a broken connection it is counted once.
        """
        return f"{self.ctx.call_id}:{self.number}", self.ctx.deadline + WRITE_ID_MARGIN_S


@dataclass(frozen=True)
class Outcome:
    """What an attempt produced: data, or a classified failure.

    ``ran`` is False when a layer answered without running the body. With
    ``payload`` set, ``data`` is a preview and the value is in the payload
    store: a layer that records outcomes keeps the reference, not the value.
    """

    data: Any = None
    failure: ToolException | None = None
    duration_s: float = 0.0
    ran: bool = True
    payload: PayloadRef | None = None
    injected: bool = False  # an injected fault (toolexec.layers.faults) shaped this outcome

    @property
    def ok(self) -> bool:
        return self.failure is None


# --- the verdict: what an attempt comes to ------------------------------------


@dataclass(frozen=True)
class Final:
    """The call is over; ``result`` goes back to the caller.

    ``joined`` are the other calls that waited on this one (duplicates joined
    to a side-effecting call, coalesced reads): the one delivery answers them
    with the same result, after the fallback decision, so that every caller of
    a shared execution gets the same answer. ``release`` is a read-only call's
    lease, released in the same round trip as the delivery: the lease every
    call holds then costs one round trip of its own, to take it.
    """

    result: ToolResult
    joined: tuple[CallContext, ...] = ()
    release: Lease | None = None


@dataclass(frozen=True)
class Retry:
    """Try again after ``delay`` seconds, carrying ``context`` forward."""

    delay: float
    error: ToolException
    context: CallContext


@dataclass(frozen=True)
class NoReply:
    """This attempt ends without answering the caller: another worker does.

    A duplicate that joined the same call in flight, a second copy of a call
    that is running, or a worker whose lease was taken over while it ran
    (``toolexec.idempotency``).
    """

    reason: str


@dataclass(frozen=True)
class Defer:
    """Run this same attempt again after ``delay`` seconds; it used no attempt.

    A shared rate limit reserved a slot that far ahead (``toolexec.layers.ratelimit``):
    the call waits in the queue instead of calling the service.
    """

    delay: float
    context: CallContext


Verdict = Final | Retry | NoReply | Defer

Proceed = Callable[[], Outcome]


class Layer:
    """A protection around the tool body; override only the hooks it needs."""

    #: The key of this layer's :attr:`Attempt.notes`, and its name in logs.
    name = "layer"

    def admit(self, attempt: Attempt, batch: Batch) -> None:
        """Queues what this layer asks Redis before the attempt; the default asks nothing."""

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        """Wraps the rest of the stack; the default just proceeds."""
        return proceed()

    def allow_retry(self, attempt: Attempt, failure: ToolException) -> ToolException | None:
        """None lets a retry the policy wants go ahead; an error ends the call instead."""
        return None

    def settle(self, attempt: Attempt, outcome: Outcome, verdict: Verdict) -> Verdict:
        """Sees the verdict; returns it, or the one that replaces it."""
        return verdict

    def record(self, attempt: Attempt, outcome: Outcome, verdict: Verdict, batch: Batch) -> None:
        """Queues the writes that follow the verdict; the default writes nothing."""


def compose(layers: Sequence[Layer], attempt: Attempt, body: Proceed) -> Outcome:
    """Run ``body`` inside ``layers``' ``around`` hooks, the first layer outermost."""

    def step(index: int) -> Outcome:
        if index == len(layers):
            return body()
        return layers[index].around(attempt, lambda: step(index + 1))

    return step(0)
