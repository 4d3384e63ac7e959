"""Plain calls under a run's guard: ``call``, ``acall``, ``submit`` and ``call_many``.

Agent frameworks call one tool at a time through ``client.call(..., run_id=R)``,
never through ``run_tool_calls``; without this the run guard would see none of
their loops. Each such call is a round of one (and ``call_many`` a round of its
batch), planned before anything is queued and settled when the results are in,
exactly as :func:`toolexec.adapters.run_round` does for a model response. The
ruling shows in the :class:`ToolResult` itself: a refusal is an error result
(``tool_disabled``, ``run_aborted``, ``run_budget_exhausted``), and a nudge is
the result's ``guard`` note, which :meth:`ToolResult.content` renders for the model.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolexec.errors import InfrastructureError
from toolexec.fairness import Lane
from toolexec.guard import GuardedResult, RoundPlan, RunGuard
from toolexec.results import ToolResult

if TYPE_CHECKING:
    from toolexec.client.sdk import ToolClient

__all__ = ["GuardedRound", "begin_round", "noted", "run_lane"]


def _guard_arguments(arguments: Any) -> Any:
    """What the guard compares: the arguments object, even when given as JSON text."""
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError, RecursionError):
            decoded = json.loads(arguments)
            if isinstance(decoded, dict):
                return decoded
    return arguments


def noted(outcome: GuardedResult) -> ToolResult:
    """The result the caller gets: the guard's nudge, if any, rides on it as ``guard``."""
    if not outcome.note:
        return outcome.result
    noted_result = outcome.result.model_copy(update={"guard": outcome.note})
    loader = outcome.result._loader
    return noted_result.attach_loader(loader) if loader is not None else noted_result


@dataclass(frozen=True)
class GuardedRound:
    """One round of plain calls: which may run, and how to turn results into rulings."""

    guard: RunGuard
    plan: RoundPlan

    @property
    def to_run(self) -> list[int]:
        return self.plan.to_run

    def timeout(self, asked: float | None) -> float | None:
        """The call's own limit, bounded by what is left of the run's wall time."""
        limits = [t for t in (self.plan.timeout, asked) if t is not None]
        return min(limits) if limits else None

    def settle(self, ran: Sequence[ToolResult]) -> list[ToolResult]:
        """Every call's result in order, given those of the calls that ran (``to_run``'s)."""
        got = dict(zip(self.to_run, ran, strict=True))
        results: list[ToolResult | None] = [got.get(i) for i in range(len(self.plan.decisions))]
        return [noted(o) for o in self.guard.end_round(self.plan, results)]

    def abandon(self) -> None:
        """Nothing went out (Redis or the broker failed): the round must not count."""
        with contextlib.suppress(InfrastructureError):  # the caller's error says more
            self.guard.abandon_round(self.plan)

    def settler(self, index: int) -> Callable[[ToolResult], ToolResult]:
        """For a round of one: what turns the call's result into the ruled one."""
        assert index == 0 and len(self.plan.decisions) == 1
        return lambda result: self.settle([result])[0]


def begin_round(
    client: ToolClient,
    run_id: str | None,
    calls: Sequence[tuple[str, Any]],
    guarded: bool,
    fairness_key: str | None = None,
) -> GuardedRound | None:
    """The round these calls make in run ``run_id``; None without a run id or when opted out.

    ``fairness_key`` becomes the run's when it has none yet (see :func:`run_lane`).
    """
    if not guarded or run_id is None or not calls:
        return None
    guard = client.run_guard(run_id)
    pairs = [(tool, _guard_arguments(arguments)) for tool, arguments in calls]
    plan = guard.begin_round(
        pairs, alternatives=sorted(client.catalog()), fairness_key=fairness_key
    )
    return GuardedRound(guard, plan)


def run_lane(round_: GuardedRound | None, lane: Lane) -> Lane:
    """The lane the round's calls wait in: a call naming no fairness key takes the run's.

    The run's key is in the state the guard has just read, so inheriting it costs
    no round trip; a framework that knows only the run id still sends the
    tenant's calls in the tenant's lane.
    """
    inherited = round_.plan.fairness_key if round_ is not None else None
    if lane.fairness_key is not None or inherited is None:
        return lane
    return Lane(inherited, lane.priority)
