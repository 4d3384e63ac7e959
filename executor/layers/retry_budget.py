"""Retry budgets: how much load retries may add to a tool, for the whole fleet at once.

A per-call limit does not bound load. When a service fails for everyone, each
call retries up to ``max_attempts`` and the service gets about three times its
load exactly when it can least take it; five layers of three retries make 243
(docs/background.md, Retry storms). A retry budget caps retries as a share of all calls, counted for
every worker together in Redis, so an outage costs ``1 + ratio`` times the
load instead, and a blip still gets its retries.

Two kinds, chosen per tool by :class:`RetryBudgetPolicy`:

``ratio`` (Google SRE book; Finagle's RetryBudget)
    the retries of the last ``window_s`` seconds never exceed
    ``max(min_retries, ratio * calls)``; ``calls`` counts each call once (its
    first attempt), so retries stay within ``ratio`` of what agents asked for:
    at most ``1 + ratio`` times the load while everything fails.
    ``min_retries`` lets a quiet tool retry its rare failures.
``tokens`` (gRPC A6 retry throttling)
    a bucket starts full at ``max_tokens``; every transient failure takes one
    token, every success gives back ``token_ratio``; retries are allowed only
    while the bucket holds more than half.

The executor asks :meth:`RetryBudget.spend` only once the retry policy has
decided to retry, so a retry that would not happen costs no budget. State is
one Redis hash per budget and every read-modify-write is one Lua script; time
comes from the injected clock, else from Redis ``TIME`` so that hosts' clock
skew cannot move the window. While Redis is unreachable budgets step aside
(retries follow the retry policy alone) and a warning is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from toolexec.breaker.policy import breaker_name, counts_as_failure
from toolexec.clock import Clock
from toolexec.errors import RetryBudgetExhaustedError, ToolException
from toolexec.keys import BUDGET_IDLE_TTL_S, Keys
from toolexec.layers import Attempt, Layer, Outcome, Proceed, Verdict
from toolexec.layers.batch import Batch
from toolexec.lua import register, script_source
from toolexec.policies import RetryBudgetPolicy
from toolexec.stores.failopen import FailOpen
from toolexec.stores.tally import Tally, Writer
from toolexec.waits import budget_wait, failing_share

__all__ = ["BudgetView", "RetryBudget", "RetryBudgetLayer", "budget_name"]

#: A ratio window is counted in this many buckets: exact to a tenth of the window.
BUCKETS = 10


@dataclass(frozen=True)
class BudgetView:
    """One budget as a script saw it; ``allowed`` answers the question asked.

    Ratio budgets fill ``calls``, ``retries`` and ``allowance`` (retries the
    window allows); token budgets fill ``tokens``.
    """

    name: str
    kind: str
    allowed: bool
    calls: float = 0.0
    retries: float = 0.0
    allowance: float = 0.0
    tokens: float | None = None
    #: Retries that settled in the window: those that worked and those that failed.
    succeeded: float = 0.0
    failed: float = 0.0
    #: Seconds until the oldest retry the window holds leaves it (0: none).
    frees_in: float = 0.0

    def describe(self, window_s: float) -> str:
        """The numbers a refusal reports: how many retries, how many failing, for what."""
        if self.tokens is not None:
            return f"{self.tokens:.1f} tokens left, retries need more than half"
        share = failing_share(self.failed, self.succeeded)
        failing = "" if share is None else f", {share:.0%} of those settled failing"
        return (
            f"{self.retries:.0f} retries in flight or failed in the last {window_s:g} s for "
            f"{self.name!r}{failing}; the allowance is {self.allowance:.1f} "
            f"for {self.calls:.0f} calls"
        )


def budget_name(tool: str, policy: RetryBudgetPolicy, arguments: Mapping[str, Any]) -> str:
    """``tool``, or ``tool@host`` for a budget kept per downstream host."""
    return breaker_name(tool, policy.key_argument, arguments)


class RetryBudget:
    """Retry budgets in one Redis, under one key prefix; safe to share between threads."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys | None = None,
        *,
        clock: Clock | None = None,
        idle_ttl_s: int = BUDGET_IDLE_TTL_S,
    ) -> None:
        self.redis = client
        self.keys = keys or Keys()
        self.clock = clock
        self.idle_ttl_s = idle_ttl_s
        self.fail_open = FailOpen("retry budgets", clock=clock)
        self._ratio = register(client, script_source("budget_ratio"))
        self._tokens = register(client, script_source("budget_tokens"))

    def record(
        self, name: str, policy: RetryBudgetPolicy, *, first_attempt: bool, failed: bool
    ) -> BudgetView | None:
        """Feed the budget one attempt that reached the service (None: nothing to record).

        Ratio budgets count first attempts only (the view then carries the calls,
        not the retries: ask :meth:`peek` for those); token budgets count every
        outcome, a transient failure costing a token and a success refunding.
        """
        if policy.kind == "ratio":
            return self._ask(name, policy, "call") if first_attempt else None
        return self._ask(name, policy, "fail" if failed else "succeed")

    def spend(
        self,
        name: str,
        policy: RetryBudgetPolicy,
        batch: Batch | None = None,
        retry_id: str = "",
    ) -> BudgetView:
        """Whether one retry may go ahead now; a ratio budget counts it if so.

        With ``batch``, its queued commands (the attempt's own count) go in the
        same round trip, first. ``retry_id`` names the retry so that its outcome
        (:meth:`settle_into`) can give its place back when it works.
        """
        return self._ask(name, policy, "spend", batch, retry_id)

    def spend_into(
        self,
        batch: Batch,
        name: str,
        policy: RetryBudgetPolicy,
        retry_id: str,
        answer: Callable[[BudgetView], None],
    ) -> None:
        """:meth:`spend` queued on ``batch``; ``answer`` gets the view when it runs."""
        if not policy.enabled or self.fail_open.down():
            answer(BudgetView(name=name, kind=policy.kind, allowed=True))
            return
        self._queue(
            batch,
            name,
            policy,
            "spend",
            lambda raw: answer(_view(name, policy, raw)),
            None,
            retry_id,
        )

    def settle_into(
        self, batch: Batch, name: str, policy: RetryBudgetPolicy, retry_id: str, outcome: str
    ) -> None:
        """A granted retry's outcome on a ratio budget: ``ok`` gives its place back (it paid
        its way), ``fail`` keeps it for the window, ``release`` returns an unused grant."""
        if policy.kind == "ratio" and policy.enabled and not self.fail_open.down():
            self._queue(batch, name, policy, outcome, None, None, retry_id)

    def peek(self, name: str, policy: RetryBudgetPolicy) -> BudgetView:
        """Whether a retry would be allowed now, changing nothing."""
        return self._ask(name, policy, "peek")

    def record_into(
        self,
        batch: Batch,
        name: str,
        policy: RetryBudgetPolicy,
        *,
        first_attempt: bool,
        failed: bool,
        write: tuple[str, float] | None = None,
        amount: int = 1,
    ) -> None:
        """:meth:`record` queued on ``batch``, its reply unneeded.

        ``write`` (an id, and until when to remember it) makes it a held write
        that counts once however often it is sent (``toolexec.layers.batch``).
        ``amount``: how many such attempts it stands for (a worker's sum of its
        calls or successes, ``toolexec.stores.tally``).
        """
        if policy.kind == "ratio" and not first_attempt:
            return
        op = "call" if policy.kind == "ratio" else ("fail" if failed else "succeed")
        if policy.enabled and not self.fail_open.down():
            self._queue(batch, name, policy, op, None, write, amount=amount)

    def _ask(
        self,
        name: str,
        policy: RetryBudgetPolicy,
        op: str,
        batch: Batch | None = None,
        retry_id: str = "",
    ) -> BudgetView:
        blind = BudgetView(name=name, kind=policy.kind, allowed=True)
        if not policy.enabled or self.fail_open.down():
            return blind
        views = [blind]
        batch = Batch() if batch is None else batch
        self._queue(
            batch,
            name,
            policy,
            op,
            lambda raw: views.append(_view(name, policy, raw)),
            None,
            retry_id,
        )
        batch.execute()
        return views[-1]

    def _queue(
        self,
        batch: Batch,
        name: str,
        policy: RetryBudgetPolicy,
        op: str,
        on_reply: Callable[[Any], None] | None,
        write: tuple[str, float] | None = None,
        retry_id: str = "",
        amount: int = 1,
    ) -> None:
        now = "" if self.clock is None else repr(float(self.clock.now()))
        keys = [self.keys.budget(name), self.keys.budget_retries(name), self.keys.budget_done(name)]
        if policy.kind == "ratio":
            script = self._ratio
            args: list[Any] = [now, op, policy.window_s, policy.ratio, policy.min_retries, BUCKETS]
        else:
            script = self._tokens
            args = [now, op, policy.max_tokens, policy.token_ratio, self.idle_ttl_s]
        held = None
        if write is not None:
            args += [write[0], repr(float(write[1]))]
            held = "retry budget record"
        elif retry_id:
            args += ["", "0"]
        if retry_id and policy.kind == "ratio":
            args.append(retry_id)  # a settle lost with its connection keeps the place: safe
        if amount != 1:
            width = 9 if policy.kind == "ratio" else 7
            args += [""] * (width - len(args)) + [amount]  # after the optional ones
        batch.script(self.redis, script, keys, args, on_reply, self._failed, held=held)

    def _failed(self, exc: Exception) -> None:
        self.fail_open.failed(exc, "retries follow the retry policy alone meanwhile")

    def reset(self, name: str) -> None:
        """Forget a budget's history (tests, and an operator after an incident)."""
        self.redis.delete(self.keys.budget(name), self.keys.budget_retries(name))


@dataclass
class _Owed:
    """A retry the budget refused earlier, asked for again in this attempt's admission."""

    view: BudgetView | None = None
    used: bool = False


def retry_id(attempt: Attempt, number: int) -> str:
    """The name of a call's retry that is attempt ``number``: its place in the budget."""
    return f"{attempt.ctx.call_id}:{number}"


class RetryBudgetLayer(Layer):
    """Feeds each tool's budget on the way back, and has a say in its retries.

    ``around`` notes attempts that reached the service (not those a breaker
    or the rate limiter refused), and ``record`` counts them in the
    attempt's settlement round trip: a first attempt as a call, a retry as
    worked (its place in the budget given back: it paid its way) or failed
    (its place kept for the window). ``allow_retry`` answers whether a retry
    the policy wants may spend the budget, counting the attempt first in the
    same round trip (a retry is the one path where the budget costs a round
    trip of its own). A refused retry may wait for budget (``toolexec.waits``):
    the call comes back owing it (``CallContext.budget_for``), and that
    attempt asks for it in its admission round trip before it runs.
    Tools that cannot retry (``max_attempts`` 1) are left alone. With a
    ``tally`` (a worker's), a first attempt's count on a ratio budget and a
    success on a token budget are added up in the process and written with its
    next flush (``toolexec.stores.tally``); a failure or a retry's outcome is written
    with its call, after the counts still pending.
    """

    name = "retry_budget"
    owed = "retry_budget.owed"

    def __init__(self, budget: RetryBudget, *, tally: Tally | None = None) -> None:
        self.budget = budget
        self.tally = tally

    def admit(self, attempt: Attempt, batch: Batch) -> None:
        if attempt.ctx.budget_for != attempt.number or not _budgeted(attempt):
            return
        owed = _Owed()
        attempt.notes[self.owed] = owed
        policy = attempt.spec.policy.retry_budget
        name = budget_name(attempt.tool, policy, attempt.arguments)

        def answer(view: BudgetView) -> None:
            owed.view = view

        self.budget.spend_into(batch, name, policy, retry_id(attempt, attempt.number), answer)

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        owed = attempt.notes.get(self.owed)
        if isinstance(owed, _Owed) and owed.view is not None and not owed.view.allowed:
            last = attempt.ctx.last_error or {}
            return Outcome(failure=self._refusal(attempt, owed.view, last), ran=False)
        if isinstance(owed, _Owed):
            owed.used = True
        outcome = proceed()
        if outcome.ran and _budgeted(attempt):
            attempt.notes[self.name] = outcome  # recorded by allow_retry or record
        return outcome

    def record(self, attempt: Attempt, outcome: Outcome, verdict: Verdict, batch: Batch) -> None:
        """Feed the budget in the settlement round trip, unless ``allow_retry`` already did."""
        owed = attempt.notes.pop(self.owed, None)
        policy = attempt.spec.policy.retry_budget
        name = budget_name(attempt.tool, policy, attempt.arguments)
        if isinstance(owed, _Owed) and not owed.used and owed.view and owed.view.allowed:
            # granted in the admission, but an outer layer answered first: give it back
            self.budget.settle_into(
                batch, name, policy, retry_id(attempt, attempt.number), "release"
            )
        self._queue_seen(attempt, name, batch, attempt.write)

    def _queue_seen(
        self, attempt: Attempt, name: str, batch: Batch, write: tuple[str, float] | None
    ) -> None:
        """Count the attempt the service saw: a call, or a retry that worked or failed."""
        seen = attempt.notes.pop(self.name, None)
        if not isinstance(seen, Outcome):
            return
        policy = attempt.spec.policy.retry_budget
        failed = counts_as_failure(seen.failure)
        first = attempt.number == 1
        if self.tally is not None:
            summed = first if policy.kind == "ratio" else not failed
            if summed and write is not None:
                self.tally.add(("budget", name), {"n": 1}, self._summed(name, policy, first))
                return
            self.tally.take_into(batch, ("budget", name))  # they came first
        self.budget.record_into(
            batch, name, policy, first_attempt=first, failed=failed, write=write
        )
        if attempt.number > 1:
            outcome = "fail" if failed else "ok"
            self.budget.settle_into(batch, name, policy, retry_id(attempt, attempt.number), outcome)

    def _summed(self, name: str, policy: RetryBudgetPolicy, first: bool) -> Writer:
        """The tally's writer of ``name``'s counts: one record standing for all of them."""

        def write(batch: Batch, counts: Mapping[str, int], write: tuple[str, float]) -> None:
            self.budget.record_into(
                batch,
                name,
                policy,
                first_attempt=first,
                failed=False,
                write=write,
                amount=counts["n"],
            )

        return write

    def allow_retry(
        self, attempt: Attempt, failure: ToolException
    ) -> RetryBudgetExhaustedError | None:
        """None when the retry may go ahead; else the error that ends the call, or makes it
        wait for budget when its ``wait_s`` is set."""
        if not _budgeted(attempt):
            return None
        policy = attempt.spec.policy.retry_budget
        name = budget_name(attempt.tool, policy, attempt.arguments)
        batch = Batch()  # the count and the question in one round trip
        self._queue_seen(attempt, name, batch, None)
        view = self.budget.spend(name, policy, batch, retry_id(attempt, attempt.number + 1))
        if view.allowed:
            return None
        last = {"type": str(failure.error_type), "message": failure.message}
        return self._refusal(attempt, view, last)

    @staticmethod
    def _refusal(
        attempt: Attempt, view: BudgetView, last: dict[str, Any]
    ) -> RetryBudgetExhaustedError:
        """``retry_budget_exhausted``: toolexec's budget, its numbers, when it frees a place."""
        policy = attempt.spec.policy.retry_budget
        wait = None
        if view.kind == "ratio":
            wait = budget_wait(
                retries=view.retries,
                failed=view.failed,
                succeeded=view.succeeded,
                frees_in=view.frees_in,
                max_wait_s=policy.max_wait_s,
                waited_s=attempt.ctx.waited_s,
            )
        reopens = round(view.frees_in, 3) if view.kind == "ratio" and view.retries else None
        when = f"; it allows a retry again in {reopens:.1f} s" if reopens is not None else ""
        share = failing_share(view.failed, view.succeeded)
        error = RetryBudgetExhaustedError(
            f"retry_budget_exhausted: not retried by toolexec's retry budget: "
            f"{view.describe(policy.window_s)}{when}; last error: "
            f"{last.get('type')}: {last.get('message')}",
            retry_after=reopens,
            suggestion="The service is failing for many callers and toolexec has stopped "
            "retrying it so it can recover: use another tool or answer without this one, "
            "and call it again later if still needed.",
            details={
                "defence": "retry_budget",
                "budget": view.name,
                "retries": view.retries,
                "failed": view.failed,
                "succeeded": view.succeeded,
                "failing_share": None if share is None else round(share, 3),
                "calls": view.calls,
                "allowance": view.allowance,
                "window_s": policy.window_s,
                "reopens_in_s": reopens,
                "waited_s": round(attempt.ctx.waited_s, 3),
                "last_error": last,
            },
        )
        error.wait_s = wait
        return error


def _view(name: str, policy: RetryBudgetPolicy, raw: Any) -> BudgetView:
    if policy.kind == "ratio":
        return BudgetView(
            name=name,
            kind="ratio",
            allowed=bool(int(raw[0])),
            calls=float(raw[1]),
            retries=float(raw[2]),
            allowance=float(raw[3]),
            succeeded=float(raw[4]),
            failed=float(raw[5]),
            frees_in=float(raw[6]),
        )
    return BudgetView(name=name, kind="tokens", allowed=bool(int(raw[0])), tokens=float(raw[1]))


def _budgeted(attempt: Attempt) -> bool:
    """Only tools that can retry have a budget to ask."""
    policy = attempt.spec.policy
    return policy.retry_budget.enabled and policy.retry.max_attempts > 1
