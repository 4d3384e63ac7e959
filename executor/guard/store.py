"""The run guard's Redis side: one JSON document per run, changed by compare-and-set.

Read, decide in Python, write back with ``lua/run_state_cas.lua``; a concurrent
writer makes the guard read and decide again, so no update is lost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.connection import unavailable
from toolexec.errors import UsageError
from toolexec.fairness import checked_fairness_key
from toolexec.guard.model import GuardedResult, RoundPlan, RunState, RunView
from toolexec.guard.planning import plan_round, settle_round
from toolexec.keys import RUN_IDLE_TTL_S, Keys
from toolexec.lua import register, script_source
from toolexec.policies import RunBudget
from toolexec.results import ToolResult
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = ["RunGuard"]


T = TypeVar("T")


_TRANSACTION_TRIES = 50


def _sha(raw: str | None) -> str:
    return "" if raw is None else hashlib.sha1(raw.encode()).hexdigest()


class RunGuard:
    """One run's guardrails, with its state in Redis under the run id.

    Cheap to build: a new process (or a restarted client) makes a new guard
    for the same run id and carries on where the last one stopped. Updates are
    optimistic: read, decide in Python, then a Lua compare-and-set that fails
    if anyone wrote in between (then read again and decide again). A round
    costs three round trips when nobody else drives the run: a read and a write
    to begin it, one write to end it (the guard knows what it wrote).
    """

    def __init__(
        self,
        run_id: str,
        budget: RunBudget | None = None,
        *,
        redis: redis.Redis,
        keys: Keys | None = None,
        clock: Clock | None = None,
        fairness_key: str | None = None,
    ) -> None:
        if not isinstance(run_id, str) or not run_id or len(run_id) > 200:
            raise UsageError(f"a run id must be a string of 1-200 characters, not {run_id!r}")
        self.run_id = run_id
        self.budget = budget
        #: Given to the run when it has no fairness key yet (see :func:`plan_round`).
        self.fairness_key = checked_fairness_key(fairness_key)
        self.redis = redis
        self.keys = keys or Keys()
        self.clock: Clock = clock or SystemClock()
        self._cas = register(redis, script_source("run_state_cas", prelude=False))

    @property
    def key(self) -> str:
        return self.keys.run(self.run_id)

    def begin_round(
        self,
        calls: Sequence[tuple[str, Any]],
        *,
        alternatives: Sequence[str] = (),
        fairness_key: str | None = None,
    ) -> RoundPlan:
        """Decide each call's fate before any runs.

        ``alternatives`` are the tools the model may use instead of one the
        guard disables (usually the catalog's names). ``fairness_key`` (the
        round's, else the guard's) becomes the run's if it has none; the plan's
        ``fairness_key`` is the run's, for the calls that name none.
        """
        key = checked_fairness_key(fairness_key) or self.fairness_key

        def change(state: RunState | None) -> tuple[RunState, RoundPlan]:
            return plan_round(
                state,
                calls,
                run_id=self.run_id,
                budget=self.budget,
                now=self.clock.now(),
                alternatives=alternatives,
                copy=False,
                fairness_key=key,
            )

        plan, before, written = self._transact(change)
        return replace(plan, undo=(before, written or ""))

    def abandon_round(self, plan: RoundPlan) -> bool:
        """Take back a begun round whose calls never went out (the broker or Redis failed).

        Broken infrastructure is not the model's doing: the round must not count
        as a step, nor its calls as repeats when the loop sends them again. Only
        done if nothing changed the run since; returns whether it was.
        """
        if plan.undo is None:
            return False
        before, written = plan.undo
        ttl = RUN_IDLE_TTL_S if before is None else self._ttl(RunState.model_validate_json(before))
        return self._swap(written, before or "", ttl)

    def end_round(
        self, plan: RoundPlan, results: Sequence[ToolResult | None]
    ) -> list[GuardedResult]:
        """Record the results of a planned round (None for calls that did not run)."""

        def change(state: RunState | None) -> tuple[RunState, list[GuardedResult]]:
            return settle_round(state, plan, results, now=self.clock.now(), copy=False)

        known = plan.undo[1] if plan.undo else None
        return self._transact(change, known=known)[0]

    def report_tokens(self, tokens: int) -> RunView:
        """Add the tokens a model response used; the token budget is checked next round."""
        # a model API's usage numbers: an int, or NaN and infinity would poison the run's state
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= 10**12:
            raise UsageError(f"tokens must be a whole number from 0 to 10**12, not {tokens!r:.40}")

        def change(state: RunState | None) -> tuple[RunState, None]:
            now = self.clock.now()
            state = RunState.new(self.budget or RunBudget(), now) if state is None else state
            state.tokens += tokens
            return state, None

        self._transact(change)
        return self.view()

    def view(self) -> RunView:
        """The run now; a run nobody has started shows its budget and no counts."""
        raw = self._call(self._read)
        if raw is None:
            return RunView(self.run_id, exists=False, budget=self.budget or RunBudget())
        state = RunState.model_validate_json(raw)
        return _view(self.run_id, state, self.clock.now())

    def forget(self) -> None:
        """Delete the run's state: the next round starts a new run under the same id."""
        self._call(lambda: self.redis.delete(self.key))

    # -- internals -----------------------------------------------------------

    def _ttl(self, state: RunState) -> int:
        wall = state.budget.max_wall_s or 0
        return int(max(RUN_IDLE_TTL_S, wall + 3600))

    def _read(self) -> str | None:
        raw = self.redis.get(self.key)
        return raw.decode() if isinstance(raw, bytes) else raw

    def _transact(
        self,
        change: Callable[[RunState | None], tuple[RunState | None, T]],
        known: str | None = None,
    ) -> tuple[T, str | None, str | None]:
        """Change the state (None: leave it); returns (outcome, value read, value written).

        ``known`` is the value this guard last wrote: tried without reading first.
        """
        raw = known if known is not None else self._call(self._read)
        for _ in range(_TRANSACTION_TRIES):
            state = None if raw is None else RunState.model_validate_json(raw)
            new, out = change(state)
            if new is None:
                return out, raw, raw
            text = new.model_dump_json()
            if self._swap(raw, text, self._ttl(new)):
                return out, raw, text
            raw = self._call(self._read)  # someone else wrote: decide again on theirs
        raise UsageError(
            f"run {self.run_id!r} changed under {_TRANSACTION_TRIES} attempts to update it: "
            "is more than one agent loop driving it at once?"
        )

    def _swap(self, expected: str | None, text: str, ttl: int) -> bool:
        """Write ``text`` ('' deletes) if the stored value is still ``expected``."""
        args: list[str | int] = [_sha(expected), text, ttl]
        return bool(self._call(lambda: self._cas(keys=[self.key], args=args)))

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except REDIS_ERRORS as exc:
            kwargs = self.redis.connection_pool.connection_kwargs
            where = kwargs.get("path") or f"redis://{kwargs.get('host')}:{kwargs.get('port')}"
            raise unavailable(str(where), exc) from exc


def _view(run_id: str, state: RunState, now: float) -> RunView:
    b = state.budget
    elapsed = max(0.0, now - state.started_at)
    return RunView(
        run_id=run_id,
        exists=True,
        budget=b,
        rounds=state.round,
        tokens=state.tokens,
        tool_errors=state.errors,
        consecutive_failures=state.consecutive_failures,
        elapsed_s=round(elapsed, 3),
        remaining_s=None if b.max_wall_s is None else max(0.0, b.max_wall_s - elapsed),
        ended=None if state.ended is None else state.ended.type,
        message=None if state.ended is None else state.ended.message,
        disabled=tuple(sorted(t for t, d in state.disabled.items() if d.until_round > state.round)),
        fairness_key=state.fairness_key,
    )
