"""Human approval of a tool's calls, across a shared fleet: ``@tool(approval=...)``.

Before the first attempt of such a call, a worker looks for a decision
(``Keys.approval``). Without one, the call is noted as waiting
(``Keys.approvals``: what ``toolexec approvals list`` shows), its caller is
asked when it can answer (an MCP client, by elicitation, through the front's
relay), and the call is parked: the worker defers its message by
``ApprovalPolicy.poll_s`` like a rate limit's deferral, so no worker slot is
held while a person thinks, and a worker killed meanwhile loses nothing (the
message is in the queue, the decision in Redis). The call then runs once on
``approved``, ends with ``approval_denied`` on ``denied``, and with
``approval_timeout`` when no one decides within ``timeout_s`` or its deadline.

The decision is keyed by the call, and a side-effecting call repeated in the
same run is answered from its idempotency record (an outer layer), so a replay
never runs the tool again nor asks again. The first decision written wins.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis

from toolexec.caller import push_ask
from toolexec.clock import Clock
from toolexec.context import CallContext
from toolexec.errors import ApprovalDeniedError, AwaitingApprovalError
from toolexec.keys import APPROVAL_DECISION_TTL_S, Keys
from toolexec.layers import Attempt, Layer, Outcome
from toolexec.policies import ApprovalPolicy

__all__ = ["ApprovalLayer", "ApprovalStore", "Decision", "Pending", "ask_caller", "ruling"]

Decision = Literal["approved", "denied"]


@dataclass(frozen=True)
class Pending:
    """A call waiting for approval, as an approver sees it."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    run_id: str | None
    prompt: str
    requested_at: float
    expires_at: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Pending:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__})


class ApprovalStore:
    """Pending calls and decisions in Redis; thin I/O around :func:`ruling`."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys

    def decision(self, call_id: str) -> dict[str, Any] | None:
        raw = self.client.get(self.keys.approval(call_id))
        if raw is None:
            return None
        found = json.loads(raw)
        return found if isinstance(found, dict) else None

    def park(self, pending: Pending) -> Pending:
        """Note the call as waiting (once); the entry already there wins."""
        key = self.keys.approvals()
        self.client.hsetnx(key, pending.call_id, json.dumps(pending.to_json()))
        raw = self.client.hget(key, pending.call_id)
        return pending if raw is None else Pending.from_json(json.loads(raw))

    def decide(self, call_id: str, decision: Decision, by: str, reason: str | None = None) -> bool:
        """Record a decision; False when the call was decided already (the first one stands)."""
        body = json.dumps({"decision": decision, "by": by, "reason": reason})
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.approval(call_id), body, nx=True, ex=APPROVAL_DECISION_TTL_S)
        pipe.hdel(self.keys.approvals(), call_id)
        written, _ = pipe.execute()
        return bool(written)

    def is_waiting(self, call_id: str) -> bool:
        return bool(self.client.hexists(self.keys.approvals(), call_id))

    def forget(self, call_id: str) -> None:
        self.client.hdel(self.keys.approvals(), call_id)

    def pending(self, now: float) -> list[Pending]:
        """The calls waiting now, oldest first; entries past their expiry are dropped."""
        raw: dict[str, str] = self.client.hgetall(self.keys.approvals())  # type: ignore[assignment]
        found: list[Pending] = []
        stale: list[Pending] = []
        for body in raw.values():
            entry = Pending.from_json(json.loads(body))
            (stale if entry.expires_at < now else found).append(entry)
        if stale:
            self.client.hdel(self.keys.approvals(), *[e.call_id for e in stale])
        return sorted(found, key=lambda e: e.requested_at)


def ruling(
    decision: Mapping[str, Any] | None, pending: Pending, policy: ApprovalPolicy, now: float
) -> Literal["run", "denied", "wait", "timeout"]:
    """What a parked call does now: run, end denied, wait again, or end for lack of a decision."""
    if decision is not None:
        return "run" if decision.get("decision") == "approved" else "denied"
    if now + policy.poll_s >= pending.expires_at:
        return "timeout"
    return "wait"


def _prompt(policy: ApprovalPolicy, tool: str, arguments: Mapping[str, Any]) -> str:
    if policy.prompt:
        return policy.prompt
    return f"Approve the call of {tool} with {json.dumps(dict(arguments), sort_keys=True)}?"


class ApprovalLayer(Layer):
    """Parks a call of a tool that needs approval until someone decides (see the module doc)."""

    def __init__(
        self, store: ApprovalStore, clock: Clock, ask: Callable[[CallContext, Pending], None]
    ) -> None:
        self.store, self.clock, self.ask = store, clock, ask

    def around(self, attempt: Attempt, proceed: Callable[[], Outcome]) -> Outcome:
        policy = attempt.spec.policy.approval
        if policy is None:
            return proceed()
        ctx, now = attempt.ctx, self.clock.now()
        decision = self.store.decision(ctx.call_id)
        pending = Pending(
            call_id=ctx.call_id,
            tool=attempt.tool,
            arguments=dict(attempt.arguments),
            run_id=ctx.run_id,
            prompt=_prompt(policy, attempt.tool, attempt.arguments),
            requested_at=now,
            expires_at=min(now + policy.timeout_s, ctx.deadline),
        )
        if decision is None:
            parked = self.store.park(pending)
            if parked.requested_at == pending.requested_at:  # the first time: ask the caller
                self.ask(ctx, parked)
            pending = parked
        verdict = ruling(decision, pending, policy, now)
        if verdict == "run":
            return proceed()
        if verdict == "denied":
            reason = (decision or {}).get("reason")
            return Outcome(failure=_denied(attempt.tool, reason), ran=False)
        waiting = AwaitingApprovalError(
            f"no one approved this call of {attempt.tool} in time; it did not run",
            suggestion="Ask the user to approve it, or go on without it.",
        )
        if verdict == "wait":
            waiting.wait_s = policy.poll_s
        else:
            self.store.forget(ctx.call_id)
        return Outcome(failure=waiting, ran=False)


def _denied(tool: str, reason: Any) -> ApprovalDeniedError:
    said = f": {reason}" if isinstance(reason, str) and reason else ""
    return ApprovalDeniedError(
        f"the call of {tool} was denied by its approver{said}; it did not run",
        suggestion="Do not repeat the call; tell the user it was not approved.",
    )


def ask_caller(
    client: redis.Redis, keys: Keys, clock: Clock
) -> Callable[[CallContext, Pending], None]:
    """The worker's way to put an approval question to the call's caller, when it can answer."""

    def ask(ctx: CallContext, pending: Pending) -> None:
        push_ask(client, keys, clock, ctx.call_id, ctx.deadline, "approve", pending.to_json())

    return ask
