"""Layers around the tool body: the breaker, idempotency, caches, ...

Each layer wraps the next, as in a Polly pipeline or ASGI middleware: it
receives the :class:`Attempt` and a ``proceed`` callable that runs the rest of
the stack (ultimately the tool body), and returns an :class:`Outcome`. A layer
can answer without proceeding (an open breaker, a replayed result), look at
the outcome on the way back (record it, cache it), or both. The executor
builds the stack once; layers know nothing of Celery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toolexec.context import CallContext
from toolexec.errors import ToolException
from toolexec.registry import ToolSpec
from toolexec.results import PayloadRef

__all__ = ["Attempt", "Layer", "Outcome", "Proceed", "compose"]


@dataclass(frozen=True)
class Attempt:
    """One attempt of one call, arguments already validated."""

    spec: ToolSpec
    ctx: CallContext
    number: int
    arguments: dict[str, Any]  # validated, as JSON: what keys are derived from
    limit: float  # seconds this attempt may run: min(tool timeout, time left)

    @property
    def tool(self) -> str:
        return self.spec.name


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
    injected: bool = False  # an injected fault (toolexec.faults) shaped this outcome

    @property
    def ok(self) -> bool:
        return self.failure is None


Proceed = Callable[[], Outcome]


class Layer(Protocol):
    """Wraps the rest of the stack for one attempt."""

    def __call__(self, attempt: Attempt, proceed: Proceed) -> Outcome: ...


def compose(layers: Sequence[Layer], attempt: Attempt, body: Proceed) -> Outcome:
    """Run ``body`` inside ``layers``, the first layer outermost."""

    def step(index: int) -> Outcome:
        if index == len(layers):
            return body()
        return layers[index](attempt, lambda: step(index + 1))

    return step(0)
