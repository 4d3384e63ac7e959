"""Running a fallback chain: which step comes next, and what it answers.

The decisions are here and know nothing of Celery: :class:`ChainRunner`
returns an :data:`Action`, either a message to send (the next step runs as
its own task: ``tools.<alternative>``, or :data:`~toolexec.fallback.state.FALLBACK_TASK`
for the cache and explanation steps) or a result to deliver to the caller's
reply list. The tasks in ``tasks/`` carry the actions out.

The path of one chain::

    tools.<primary> fails (retries spent, breaker open, no time left)
      └─ toolexec.fallback on the primary's queue  (the client sends this one
         │                                          itself when the breaker is open)
         ├─ Alternative: skipped (no time / its breaker open / no such tool)
         │  or sent as tools.<alternative>; it answers, or hands back to
         │  toolexec.fallback for the next step
         ├─ LastGood: the cached result with its age, or the next step
         └─ Explain: the last word

Every message keeps the caller's call id and reply list, so whichever step
answers delivers to the handle the caller already holds; no ``Task.replace``
and no errbacks (which fire only on final failure and run inline, docs/background.md, Celery).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pydantic
import redis

from toolexec.breaker import CircuitBreaker
from toolexec.breaker.gate import refusal_for
from toolexec.clock import Clock
from toolexec.context import CallContext
from toolexec.errors import CircuitOpenError
from toolexec.fallback.cache import LastGoodCache
from toolexec.fallback.state import FALLBACK_TASK, ChainState, falls_back
from toolexec.fallback.steps import Alternative, Explain, FallbackStep, LastGood, complete_chain
from toolexec.keys import Keys
from toolexec.policies import BreakerPolicy
from toolexec.redaction import redact, secret_names, shown_kwargs
from toolexec.results import ErrorInfo, FallbackInfo, StepNote, ToolResult, error_result
from toolexec.settings import Settings

if TYPE_CHECKING:  # a type only: the registry imports the fallback steps
    from toolexec.registry import Registry, ToolSpec

__all__ = ["Action", "ChainRunner", "Deliver", "Lookup", "Send", "catalog_lookup"]

log = logging.getLogger("toolexec.fallback")

#: A tool's catalog entry by name (description, schema, policy), or None.
Lookup = Callable[[str], dict[str, Any] | None]


@dataclass(frozen=True)
class Send:
    """One task message the worker sends: a chain's next step, or a call handed over.

    ``shown`` is its ``kwargsrepr``, secrets redacted; ``retries`` is Celery's
    count for a handed-over call (``WorkerRuntime.hand_over``), None for a step.
    """

    task: str
    kwargs: dict[str, Any]
    task_id: str
    queue: str | None
    shown: str
    retries: int | None = None


@dataclass(frozen=True)
class Deliver:
    """The call is over: push ``result`` to the caller's reply list."""

    result: ToolResult


Action = Send | Deliver


def catalog_lookup(client: redis.Redis, keys: Keys) -> Lookup:
    """Entries of the published catalog, one ``HGET`` each: for tools this worker lacks."""

    def entry(tool: str) -> dict[str, Any] | None:
        raw = client.hget(keys.catalog(), tool)
        return None if raw is None else dict(json.loads(raw))

    return entry


#: Joins a caller's idempotency key and an alternative's name into the alternative's key.
KEY_JOIN = "/fallback/"


def _message(
    ctx: CallContext, state: ChainState, arguments: Any, tool: str | None = None
) -> dict[str, Any]:
    """A step's kwargs; ``tool``: the alternative it runs, if any.

    An alternative gets an idempotency key of its own, derived from the
    caller's: the caller's key names the primary's call, and the same key on
    other arguments would be refused as a mismatch.
    """
    key = ctx.idempotency_key
    if key is not None and tool is not None:
        key = key.partition(KEY_JOIN)[0] + KEY_JOIN + tool
    step_ctx = replace(ctx, previous_delay=None, fallback=state, idempotency_key=key)
    return {"arguments": arguments, "context": step_ctx.to_json()}


def _fallback_info(state: ChainState, age_s: float | None = None) -> FallbackInfo:
    return FallbackInfo(
        primary_error=state.error,
        primary_attempts=state.primary_attempts,
        tried=list(state.tried),
        age_s=age_s,
    )


class ChainRunner:
    """Decides each step of the chains of the tools in ``registry``.

    ``lookup`` finds an alternative's catalog entry (its queue, timeout and
    breaker) when this process does not have the tool itself; ``breakers``
    lets a step skip an alternative whose own breaker is open without a
    queue round trip.
    """

    def __init__(
        self,
        registry: Registry,
        lookup: Lookup,
        breakers: CircuitBreaker,
        cache: LastGoodCache,
        clock: Clock,
        default_queue: str,
    ) -> None:
        self.registry = registry
        self.lookup = lookup
        self.breakers = breakers
        self.cache = cache
        self.clock = clock
        self.default_queue = default_queue

    @classmethod
    def for_worker(
        cls, settings: Settings, client: redis.Redis, registry: Registry, clock: Clock
    ) -> ChainRunner:
        """The chains of a worker's tools, on the worker's Redis client and clock."""
        keys = Keys(settings.key_prefix)
        breakers = CircuitBreaker(client, keys, on_redis_error=settings.breaker_on_redis_error)
        return cls(
            registry,
            catalog_lookup(client, keys),
            breakers,
            LastGoodCache(client, keys, clock),
            clock,
            settings.default_queue,
        )

    # -- where a tool task's final result goes --------------------------------

    def after_final(
        self, spec: ToolSpec, arguments: Any, ctx: CallContext, result: ToolResult
    ) -> Action | None:
        """What follows a tool task's final result; None: deliver it as it is.

        Inside a chain, an alternative's success is the (degraded) answer and
        its failure hands on to the next step. Outside one, a failure the model
        cannot fix starts the tool's chain, if it has one. A chain that cannot
        go on (Redis unreachable) never leaves the caller without an answer:
        the primary's own result, or the chain's explanation.
        """
        try:
            return self._after_final(spec, arguments, ctx, result)
        except Exception as exc:
            log.exception("fallback chain of call %s could not go on", ctx.call_id)
            if ctx.fallback is None:
                return None
            return Deliver(self.explain_now(ctx, f"{type(exc).__name__}: {exc}"))

    def _after_final(
        self, spec: ToolSpec, arguments: Any, ctx: CallContext, result: ToolResult
    ) -> Action | None:
        if ctx.fallback is not None:
            return self._after_alternative(spec, ctx, result)
        spec = self.registry.get(spec.name) or spec  # set_fallbacks may have come later
        if not spec.policy.fallbacks or not falls_back(result.error):
            return None
        assert result.error is not None
        queue = spec.policy.queue or self.default_queue
        state = ChainState.begin(spec.name, queue, result.error, result.attempts, arguments)
        return self._hand_on(ctx, state)

    def _after_alternative(self, spec: ToolSpec, ctx: CallContext, result: ToolResult) -> Action:
        state = _state_of(ctx).ran(result.attempts)
        if result.ok:
            answer = result.model_copy(
                update={
                    "degraded": True,
                    "source": spec.name,
                    "attempts": state.attempts,
                    "fallback": _fallback_info(state),
                }
            )
            return Deliver(answer)
        error = result.error
        reason = "no result" if error is None else f"{error.type}: {error.message}"
        return self._hand_on(
            ctx, state.noted(StepNote(source=spec.name, outcome="failed", reason=reason))
        )

    def _hand_on(self, ctx: CallContext, state: ChainState) -> Send:
        """The rest of the chain runs as ``toolexec.fallback`` where the primary's code is.

        The call's arguments travel as the message's own ``arguments``, not a
        second time in the context.
        """
        bare = replace(state, arguments=None)
        return self._send(FALLBACK_TASK, state.queue, ctx, bare, state.arguments)

    def _send(
        self, task: str, queue: str | None, ctx: CallContext, state: ChainState, arguments: Any
    ) -> Send:
        state = state.sent()
        alternative = task.removeprefix("tools.") if task != FALLBACK_TASK else None
        kwargs = _message(ctx, state, arguments, alternative)
        tools = {state.primary, task.removeprefix("tools.")}
        secrets = frozenset().union(*(self._secret_names(tool) for tool in tools))
        return Send(task, kwargs, state.task_id(ctx.call_id), queue, _shown(kwargs, secrets))

    def _secret_names(self, tool: str) -> frozenset[str]:
        """Arguments the tool's schema marks secret: kept out of logs, events and Flower."""
        entry = self._entry(tool)
        return secret_names(entry.get("parameters")) if entry else frozenset()

    def explain_now(self, ctx: CallContext, reason: str) -> ToolResult:
        """The chain's last word at once, when its next step cannot be sent (broker down)."""
        state = _state_of(ctx)
        note = StepNote(source=FALLBACK_TASK, outcome="failed", reason=reason)
        explain = complete_chain(self._chain(state.primary))[-1]
        assert isinstance(explain, Explain)
        return self._explanation(explain, ctx, state.noted(note))

    # -- toolexec.fallback -----------------------------------------------------

    def advance(self, ctx: CallContext, arguments: Any = None) -> Action:
        """Run the chain from its next step until one sends a message or answers.

        ``arguments`` are the call's, as ``toolexec.fallback`` received them.
        """
        state = _state_of(ctx)
        if state.arguments is None:
            state = replace(state, arguments=arguments)
        chain = self._chain(state.primary)
        spec = self.registry.get(state.primary)
        for index in range(state.next, len(chain)):
            step, state = chain[index], state.at(index + 1)
            try:
                action, state = self._step(step, spec, ctx, state)
            except Exception as exc:  # e.g. Redis unreachable: the next step may still answer
                log.exception("fallback step %s of call %s failed", step.source, ctx.call_id)
                reason = f"{type(exc).__name__}: {exc}"
                action, state = (
                    None,
                    state.noted(StepNote(source=step.source, outcome="failed", reason=reason)),
                )
            if action is not None:
                return action
        raise AssertionError("a completed chain ends in Explain, which always answers")

    def _chain(self, primary: str) -> tuple[FallbackStep, ...]:
        spec = self.registry.get(primary)
        if spec is None:
            log.warning(
                "fallback chain of %s reached a worker that does not have the tool; "
                "only its explanation step can run here",
                primary,
            )
            return complete_chain(())
        return complete_chain(spec.policy.fallbacks)

    def _step(
        self, step: FallbackStep, spec: ToolSpec | None, ctx: CallContext, state: ChainState
    ) -> tuple[Action | None, ChainState]:
        if isinstance(step, Alternative):
            return self._alternative(step, spec, ctx, state)
        if isinstance(step, LastGood):
            return self._cached(step, spec, ctx, state)
        return Deliver(self._explanation(step, ctx, state)), state

    def _alternative(
        self, step: Alternative, spec: ToolSpec | None, ctx: CallContext, state: ChainState
    ) -> tuple[Action | None, ChainState]:
        entry = self._entry(step.tool)
        if entry is None:
            return None, _skip(state, step, "no worker has published this tool")
        policy = entry["policy"]
        needs = step.needs_s if step.needs_s is not None else float(policy["timeout"])
        left = ctx.deadline - self.clock.now()
        if left < needs:
            return None, _skip(state, step, f"deadline: needs {needs:.1f} s, {left:.1f} s left")
        try:
            arguments = _mapped(step, spec, state.arguments)
        except Exception as exc:  # the mapping is the tool author's code
            return None, _skip(state, step, f"argument mapping failed: {type(exc).__name__}: {exc}")
        refusal = _breaker_refusal(self.breakers, step.tool, policy, arguments)
        if refusal is not None:
            return None, _skip(state, step, f"circuit_open: {refusal.message}")
        queue = policy.get("queue") or self.default_queue
        return self._send(f"tools.{step.tool}", queue, ctx, state, arguments), state

    def _entry(self, tool: str) -> dict[str, Any] | None:
        local = self.registry.get(tool)
        if local is not None:
            return local.catalog_entry(self.default_queue)
        return self.lookup(tool)

    def _cached(
        self, step: LastGood, spec: ToolSpec | None, ctx: CallContext, state: ChainState
    ) -> tuple[Action | None, ChainState]:
        now = self.clock.now()
        if now >= ctx.deadline:
            return None, _skip(state, step, "deadline: the call's deadline has passed")
        arguments = _validated(spec, state.arguments)
        found = (
            None
            if arguments is None
            else self.cache.lookup(state.primary, arguments, step, ctx.tenant)
        )
        if found is None:
            note = StepNote(source="cache", outcome="miss", reason="no result younger than ttl_s")
            return None, state.noted(note)
        result = error_result(ctx, state.error, attempts=state.attempts, now=now)
        update: dict[str, Any] = {
            "status": "ok",
            "error": None,
            "data": found.data,
            "degraded": True,
            "source": "cache",
            "fallback": _fallback_info(state, found.age(now)).model_dump(mode="json"),
        }
        if found.payload is not None:  # a large value: the data is its preview
            update["payload"] = found.payload
        answer = ToolResult.model_validate({**result.model_dump(mode="json"), **update})
        return Deliver(answer), state

    def _explanation(self, step: Explain, ctx: CallContext, state: ChainState) -> ToolResult:
        primary = state.error
        info = ErrorInfo(
            type=primary.type,
            message=step.message
            or f"the tool {state.primary!r} is unavailable right now and no fallback could "
            f"answer ({primary.type}: {primary.message})",
            suggestion=step.instead,
            retryable=primary.retryable,
            retry_after=primary.retry_after,
        )
        result = error_result(ctx, info, attempts=state.attempts, now=self.clock.now())
        answer: ToolResult = result.model_copy(
            update={"degraded": True, "source": "explanation", "fallback": _fallback_info(state)}
        )
        return answer


def _shown(kwargs: dict[str, Any], secrets: frozenset[str]) -> str:
    """``kwargsrepr`` of a step: the call's arguments a step carries in its context redacted too."""
    chain = kwargs["context"].get("fallback") or {}
    if chain.get("arguments") is None:
        return shown_kwargs(kwargs, secrets)
    hidden = {**chain, "arguments": redact(chain["arguments"], secrets)}
    return shown_kwargs({**kwargs, "context": {**kwargs["context"], "fallback": hidden}}, secrets)


def _skip(state: ChainState, step: Alternative | LastGood, reason: str) -> ChainState:
    return state.noted(StepNote(source=step.source, outcome="skipped", reason=reason))


def _validated(spec: ToolSpec | None, arguments: Any) -> dict[str, Any] | None:
    """The primary's arguments as its model reads them: the form cache keys use."""
    if spec is None:
        return None
    try:
        return spec.arguments.model_validate(arguments or {}).model_dump(mode="json")
    except pydantic.ValidationError:
        return None


def _mapped(step: Alternative, spec: ToolSpec | None, arguments: Any) -> Any:
    """The alternative's arguments: the caller's, or what the step's mapping makes of them."""
    if step.arguments is None:
        return arguments
    validated = _validated(spec, arguments)
    if validated is None:
        raise ValueError("the call's arguments do not fit the primary tool's model")
    return dict(step.arguments(validated))


def _breaker_refusal(
    breakers: CircuitBreaker, tool: str, policy: dict[str, Any], arguments: Any
) -> CircuitOpenError | None:
    """The alternative's own breaker, checked without a permit (its worker takes one)."""
    if "breaker" not in policy or not isinstance(arguments, dict):
        return None
    return refusal_for(
        breakers,
        tool,
        BreakerPolicy.from_json(policy["breaker"]),
        policy.get("breaker_key"),
        arguments,
    )


def _state_of(ctx: CallContext) -> ChainState:
    """The chain a fallback step belongs to; only steps of a chain are sent with one."""
    if ctx.fallback is None:
        raise ValueError(f"call {ctx.call_id}: a fallback step arrived without its chain")
    return ctx.fallback
