"""The run guard: budgets, loop detection and an escalation ladder, kept in Redis per run.

A model does not remember that it made the same call three times, and a tool
process forgets everything when it ends; so the counting that stops an agent
from looping lives in the harness, under the run id. Any client process can
pick a run up: the state is one JSON document in Redis (:meth:`Keys.run`),
read, changed in Python and written back with a Lua compare-and-set, so two
processes advancing the same run never lose an update.

A round is one model response's tool calls. :meth:`RunGuard.begin_round`
decides, before anything runs, what each call may do (its :class:`Ruling`);
:meth:`RunGuard.end_round` records what came back and may still escalate (no
progress is only visible in results). The decisions are pure functions of the
stored state, the calls and the time (:func:`plan_round`, :func:`settle_round`),
testable without Redis.

What counts as stuck, each keyed so that it climbs a ladder of its own::

    repeat       the same (tool, normalised arguments) k times in the last W calls
    cycle        the last n calls repeat the n before them (A→B→A→B), n = 2..N
    no_progress  a round's results are the same as the previous rounds', R in a row

    detection 1 ──> nudge     the call runs; its result carries a hint and the
                              previous result of the same call
    detection 2 ──> disable   the call is refused (``tool_disabled``: why, and
                              what to use instead); the tool stays refused next round
    detection 3 ──> abort     the whole run is refused from now on (``run_aborted``,
                              with a summary of the completed calls, the stuck
                              point and the last results)

A key climbs at most one rung per round, and falls back to the bottom when a
round brings progress (a result never seen before in the run). A spent budget
(steps, wall time, consecutive failures, tool errors, tokens) ends the run
with ``run_budget_exhausted``. Budgets are checked when a round begins, so the
round that spends one still gets its results.

``model`` holds the state and the values a round produces, ``detection`` the
patterns and the ladder, ``planning`` the two round functions, ``rendering``
what the model reads, ``store`` the Redis side (:class:`RunGuard`).
"""

from toolexec.guard.model import (
    Decision,
    GuardedResult,
    Pattern,
    RoundPlan,
    Ruling,
    RunState,
    RunView,
    fingerprint,
)
from toolexec.guard.planning import plan_round, settle_round
from toolexec.guard.store import RunGuard

__all__ = [
    "Decision",
    "GuardedResult",
    "Pattern",
    "RoundPlan",
    "Ruling",
    "RunGuard",
    "RunState",
    "RunView",
    "fingerprint",
    "plan_round",
    "settle_round",
]
