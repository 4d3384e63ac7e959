"""The agent-side SDK: call tools by name, get a :class:`ToolResult` back.

The client needs no tool code. It validates arguments against the catalog the
workers publish, routes each call to its tool's queue, and waits on a reply
list until the call's deadline. It raises only when it is misused or when
Redis or the broker cannot be reached; a tool's failure is a result.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis
import redis.asyncio
from celery import Celery
from kombu.exceptions import OperationalError

from toolexec import catalog as catalog_mod
from toolexec.adapters import Format, arun_round, run_round
from toolexec.app import create_app
from toolexec.breaker import BreakerPolicy, CircuitBreaker
from toolexec.breaker.gate import refusal_for
from toolexec.clock import Clock, SystemClock
from toolexec.connection import (
    async_redis_client,
    fail_fast_client,
    redis_client,
    redis_url,
    unavailable,
)
from toolexec.context import CallContext
from toolexec.errors import BrokerUnavailableError, CircuitOpenError, ErrorType, UsageError
from toolexec.execution import error_info, error_result
from toolexec.fallback.state import FALLBACK_TASK, ChainState
from toolexec.guard import RunBudget, RunGuard
from toolexec.keys import REPLY_TTL_S, Keys
from toolexec.payloads import Offloader, PayloadPage, PayloadReader, open_store, store_arguments
from toolexec.redaction import REPR_LIMIT, secret_names, shown_kwargs
from toolexec.replies import ReplyBox
from toolexec.results import ErrorInfo, PayloadRef, ToolResult
from toolexec.settings import Settings
from toolexec.validation import validate_against_schema

__all__ = ["CallHandle", "ToolClient"]

CallSpec = tuple[str, Mapping[str, Any] | str]

_SEND_A_REFERENCE = "Pass a reference (a URL or an id) instead of the content itself."

#: Celery's own cap (``kwargsrepr_maxsize``) on the repr shown in logs, events, Flower.
_REPR_LIMIT = REPR_LIMIT


@dataclass(frozen=True)
class _Prepared:
    """A call that passed the client's checks, or the result that ends it early."""

    ctx: CallContext
    arguments: dict[str, Any] | None
    queue: str | None
    early: ToolResult | None
    #: Argument names the tool's schema marks secret, redacted in ``kwargsrepr``.
    secrets: frozenset[str] = frozenset()
    #: The task to send instead of the tool's own: its fallback chain, while its breaker is open.
    task: str | None = None


class CallHandle:
    """A submitted call; :meth:`result` waits for it, at most until its deadline."""

    def __init__(self, client: ToolClient, prepared: _Prepared) -> None:
        self._client = client
        self._prepared = prepared
        self._result = prepared.early
        self._lock = threading.Lock()

    @property
    def call_id(self) -> str:
        return self._prepared.ctx.call_id

    def result(self, timeout: float | None = None) -> ToolResult:
        """The call's result; past ``timeout`` (or the deadline) a ``deadline_exceeded`` one."""
        with self._lock:
            if self._result is None:
                self._result = self._client._collect([self._prepared], timeout)[0]
            return self._result


class ToolClient:
    """Calls tools through toolexec's workers."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        celery_app: Celery | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self._url = redis_url(self.settings)
        self.redis = redis_client(self._url)
        self.keys = Keys(self.settings.key_prefix)
        self.app = celery_app or create_app(self.settings)
        self.clock = clock or SystemClock()
        self.breakers = CircuitBreaker(
            fail_fast_client(self._url),
            self.keys,
            on_redis_error=self.settings.breaker_on_redis_error,
        )
        self._catalog: catalog_mod.Catalog = {}
        self._catalog_read_at = float("-inf")
        self._catalog_lock = threading.Lock()

    @classmethod
    def from_env(cls, **overrides: Any) -> ToolClient:
        """A client for the ``TOOLEXEC_*`` settings of this environment."""
        return cls(Settings.from_env(**overrides))

    def close(self) -> None:
        self.redis.close()
        self.breakers.redis.close()

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the catalog -------------------------------------------------------

    def catalog(self, refresh: bool = False) -> catalog_mod.Catalog:
        """Every tool the workers have published: description, schema, policy."""
        with self._catalog_lock:
            fresh = time.monotonic() - self._catalog_read_at < self.settings.catalog_cache_s
            if refresh or not fresh or not self._catalog:
                try:
                    self._catalog = catalog_mod.read(self.redis, self.keys)
                except redis.RedisError as exc:
                    raise unavailable(self._url, exc) from exc
                self._catalog_read_at = time.monotonic()
            return self._catalog

    def tool_definitions(
        self, format: Literal["openai", "anthropic"] = "openai"
    ) -> list[dict[str, Any]]:
        """The tools as an OpenAI ``tools=`` list or Anthropic ``tools=`` list."""
        return catalog_mod.to_definitions(self.catalog(), format)

    def _entry(self, tool: str) -> dict[str, Any] | None:
        entry = self.catalog().get(tool)
        if entry is None:  # a worker with this tool may have started just now
            entry = self.catalog(refresh=True).get(tool)
        return entry

    # -- calling -----------------------------------------------------------

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """Run ``tool`` and wait for its result, at most ``timeout`` seconds.

        ``idempotency_key`` makes the call run at most once per key: a repeat
        with the same key joins the call in flight or gets its stored result
        (``replayed: true``); other arguments under the same key are refused
        with ``idempotency_mismatch``. Tools with ``side_effects=True`` derive a
        key from the run id, the tool and the arguments when none is given.
        """
        return self.submit(
            tool,
            arguments,
            run_id=run_id,
            timeout=timeout,
            call_id=call_id,
            idempotency_key=idempotency_key,
        ).result()

    def submit(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> CallHandle:
        """Enqueue a call and return at once with a handle to its result."""
        prepared = self._prepare(
            tool, arguments, run_id, timeout, call_id, None, idempotency_key=idempotency_key
        )
        self._publish([prepared])
        return CallHandle(self, prepared)

    def call_many(
        self,
        calls: Iterable[CallSpec],
        *,
        run_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ToolResult]:
        """Run independent calls in parallel; results come back in the calls' order."""
        batch = self._prepare_many(calls, run_id, timeout)
        self._publish(batch)
        return self._collect(batch, None)

    async def acall(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """The asyncio form of :meth:`call`; waiting does not hold a thread."""
        prepared = await asyncio.to_thread(
            self._prepare, tool, arguments, run_id, timeout, call_id, None, idempotency_key
        )
        await asyncio.to_thread(self._publish, [prepared])
        return (await self._acollect([prepared]))[0]

    async def acall_many(
        self,
        calls: Iterable[CallSpec],
        *,
        run_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ToolResult]:
        """The asyncio form of :meth:`call_many`."""
        batch = await asyncio.to_thread(self._prepare_many, list(calls), run_id, timeout)
        await asyncio.to_thread(self._publish, batch)
        return await self._acollect(batch)

    # -- a model's tool calls, under the run's guard -------------------------

    def run_guard(
        self, run_id: str, budget: RunBudget | None = None, *, clock: Clock | None = None
    ) -> RunGuard:
        """The guardrails of run ``run_id``, kept in this client's Redis (see toolexec.guard)."""
        return RunGuard(run_id, budget, redis=self.redis, keys=self.keys, clock=clock or self.clock)

    def run_tool_calls(
        self,
        tool_calls: Any,
        *,
        run_id: str | None = None,
        format: Format = "openai",
        budget: RunBudget | None = None,
        timeout: float | None = None,
        guard: RunGuard | None = None,
    ) -> list[dict[str, Any]]:
        """Run a model response's tool calls in parallel; the replies, in the calls' order.

        ``tool_calls`` is OpenAI's ``tool_calls`` or Anthropic's content blocks
        (dicts or SDK objects; the assistant message or whole response works
        too). Returns ``role: tool`` messages or ``tool_result`` blocks. With a
        ``run_id`` (or a ``guard``) the run's guard counts steps, time and
        failures in Redis and answers loops with a nudge, then
        ``tool_disabled``, then ``run_aborted``; a spent budget answers
        ``run_budget_exhausted``. Without either, the calls just run.
        """
        guard = guard or (self.run_guard(run_id, budget) if run_id is not None else None)
        return run_round(self, tool_calls, format=format, guard=guard, timeout=timeout).messages

    async def arun_tool_calls(
        self,
        tool_calls: Any,
        *,
        run_id: str | None = None,
        format: Format = "openai",
        budget: RunBudget | None = None,
        timeout: float | None = None,
        guard: RunGuard | None = None,
    ) -> list[dict[str, Any]]:
        """The asyncio form of :meth:`run_tool_calls`."""
        guard = guard or (self.run_guard(run_id, budget) if run_id is not None else None)
        outcome = await arun_round(self, tool_calls, format=format, guard=guard, timeout=timeout)
        return outcome.messages

    # -- internals ---------------------------------------------------------

    def _prepare_many(
        self, calls: Iterable[CallSpec], run_id: str | None, timeout: float | None
    ) -> list[_Prepared]:
        reply_to = uuid.uuid4().hex
        batch = []
        for item in calls:
            if not (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str)):
                raise UsageError(f"call_many takes (tool_name, arguments) pairs; got {item!r}")
            batch.append(self._prepare(item[0], item[1], run_id, timeout, None, reply_to))
        return batch

    def _deadline(self, timeout: float | None, now: float) -> float:
        if timeout is None:
            return now + self.settings.default_timeout
        if timeout <= 0:
            raise UsageError(f"timeout must be a positive number of seconds, not {timeout}")
        return now + min(timeout, self.settings.max_timeout)

    def _prepare(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None,
        run_id: str | None,
        timeout: float | None,
        call_id: str | None,
        reply_to: str | None,
        idempotency_key: str | None = None,
    ) -> _Prepared:
        if not isinstance(tool, str) or not tool:
            raise UsageError(f"the tool name must be a non-empty string, not {tool!r}")
        now = self.clock.now()
        call_id = call_id or uuid.uuid4().hex
        ctx = CallContext(
            call_id=call_id,
            tool=tool,
            deadline=self._deadline(timeout, now),
            submitted_at=now,
            reply_to=reply_to or call_id,
            run_id=run_id,
            idempotency_key=_checked_key(idempotency_key),
        )
        parsed, problem = _parse_arguments(arguments, self.settings.payload_max_bytes)
        if problem is not None:
            return self._early(
                ctx,
                ErrorType.INVALID_ARGUMENTS,
                problem,
                "Send the arguments as a JSON object matching the tool's schema.",
            )
        entry = self._entry(tool)
        if entry is None:
            known = ", ".join(sorted(self.catalog())) or "none: no worker has published a catalog"
            return self._early(
                ctx,
                ErrorType.UNKNOWN_TOOL,
                f"there is no tool named {tool!r}",
                f"Use one of the available tools: {known}.",
            )
        problem = validate_against_schema(parsed or {}, entry["parameters"])
        if problem is not None:
            return self._early(
                ctx,
                ErrorType.INVALID_ARGUMENTS,
                problem,
                "Fix the fields named above and call the tool again.",
            )
        refusal = self._breaker_refusal(tool, entry["policy"], parsed or {})
        if refusal is not None:
            chain = self._fallback_instead(ctx, entry, parsed or {}, refusal)
            if chain is not None:
                return chain
            result = error_result(ctx, error_info(refusal), attempts=0, now=self.clock.now())
            return _Prepared(ctx, None, None, result)
        inline, problem = self._store_large_arguments(ctx, parsed or {})
        if problem is not None:
            return self._early(ctx, ErrorType.INVALID_ARGUMENTS, problem, _SEND_A_REFERENCE)
        return _Prepared(
            ctx, inline, entry["policy"]["queue"], None, secret_names(entry["parameters"])
        )

    def _fallback_instead(
        self,
        ctx: CallContext,
        entry: dict[str, Any],
        arguments: dict[str, Any],
        refusal: CircuitOpenError,
    ) -> _Prepared | None:
        """While the breaker is open, a tool with a fallback chain starts it instead of failing.

        The primary never runs; ``toolexec.fallback`` goes to the primary's queue,
        where workers have the code of the chain's argument mappings.
        """
        policy = entry["policy"]
        if not policy.get("fallbacks"):
            return None
        # the arguments travel once, as the message's own (toolexec.fallback reads them there)
        state = ChainState.begin(ctx.tool, policy["queue"], error_info(refusal), 0, None)
        started = replace(ctx, fallback=state.to_json())
        secrets = secret_names(entry["parameters"])
        return _Prepared(started, arguments, policy["queue"], None, secrets, task=FALLBACK_TASK)

    def _breaker_refusal(
        self, tool: str, policy: dict[str, Any], arguments: dict[str, Any]
    ) -> CircuitOpenError | None:
        """Fail fast, without a queue round trip, while the tool's breaker is open."""
        if "breaker" not in policy:  # published by a worker that predates breakers
            return None
        return refusal_for(
            self.breakers,
            tool,
            BreakerPolicy.from_json(policy["breaker"]),
            policy.get("breaker_key"),
            arguments,
        )

    def _early(self, ctx: CallContext, kind: ErrorType, message: str, suggestion: str) -> _Prepared:
        info = ErrorInfo(type=kind, message=message, suggestion=suggestion, retryable=False)
        result = error_result(ctx, info, attempts=0, now=self.clock.now())
        return _Prepared(ctx, None, None, result)

    def _publish(self, batch: Sequence[_Prepared]) -> None:
        """Send every call that passed the checks, over one producer connection."""
        todo = [p for p in batch if p.early is None]
        if not todo:
            return
        try:
            with self.app.producer_or_acquire() as producer:
                for p in todo:
                    kwargs = {"arguments": p.arguments, "context": p.ctx.to_json()}
                    self.app.send_task(
                        p.task or f"tools.{p.ctx.tool}",
                        kwargs=kwargs,
                        kwargsrepr=_shown(kwargs, p.secrets),
                        task_id=p.ctx.call_id,
                        queue=p.queue,
                        producer=producer,
                        ignore_result=True,
                    )
        except (OperationalError, OSError) as exc:
            raise BrokerUnavailableError(
                f"the broker did not accept the call ({type(exc).__name__}: {exc}); "
                "nothing was run. Check TOOLEXEC_BROKER_URL / TOOLEXEC_REDIS_URL and "
                "that the server is up."
            ) from exc

    def _group(self, batch: Sequence[_Prepared]) -> dict[str, ReplyBox]:
        boxes: dict[str, ReplyBox] = {}
        for p in batch:
            if p.early is None:
                box = boxes.setdefault(p.ctx.reply_to, ReplyBox(self.keys, p.ctx.reply_to, ()))
                box.pending.add(p.ctx.call_id)
        return boxes

    def _wait_for(self, batch: Sequence[_Prepared], timeout: float | None) -> float:
        latest = max((p.ctx.deadline for p in batch if p.early is None), default=0.0)
        wait = latest + self.settings.reply_grace - self.clock.now()
        return max(0.0, wait if timeout is None else min(wait, timeout))

    def _collect(self, batch: Sequence[_Prepared], timeout: float | None) -> list[ToolResult]:
        boxes = self._group(batch)
        wait = self._wait_for(batch, timeout)
        end = time.monotonic() + wait
        try:
            for box in boxes.values():
                box.collect(self.redis, max(0.0, end - time.monotonic()))
        except redis.RedisError as exc:
            raise unavailable(self._url, exc) from exc
        return self._assemble(batch, boxes)

    async def _acollect(self, batch: Sequence[_Prepared]) -> list[ToolResult]:
        boxes = self._group(batch)
        wait = self._wait_for(batch, None)
        end = time.monotonic() + wait
        client = async_redis_client(self._url)
        try:
            for box in boxes.values():
                await box.acollect(client, max(0.0, end - time.monotonic()))
        except redis.RedisError as exc:
            raise unavailable(self._url, exc) from exc
        finally:
            await client.aclose()
        return self._assemble(batch, boxes)

    def _assemble(self, batch: Sequence[_Prepared], boxes: dict[str, ReplyBox]) -> list[ToolResult]:
        out = []
        for p in batch:
            if p.early is not None:
                out.append(p.early)
                continue
            found = boxes[p.ctx.reply_to].results.get(p.ctx.call_id)
            if found is not None and found.payload is not None:
                found.attach_loader(self.load_payload)
            out.append(found if found is not None else self._no_reply(p))
        return out

    # -- large results and arguments (toolexec.payloads) --------------------

    def _payload_io(self) -> tuple[Offloader, PayloadReader]:
        """The payload store, opened on first use (an S3 client takes a while to build)."""
        with self._catalog_lock:
            io: tuple[Offloader, PayloadReader] | None = getattr(self, "_payloads", None)
            if io is None:
                store = open_store(self.settings, self._url, self.clock)
                io = (Offloader(store, self.clock), PayloadReader(store, self.clock))
                self._payloads = io
            return io

    def fetch_payload(self, ref: PayloadRef) -> bytes:
        """A stored payload's bytes, checked against its sha256.

        Raises :class:`~toolexec.errors.PayloadExpiredError` or
        :class:`~toolexec.errors.PayloadMissingError` when it is gone.
        """
        return self._payload_io()[1].fetch(ref)

    def load_payload(self, ref: PayloadRef) -> Any:
        """A stored payload as the value the tool returned (what ``result.load()`` calls)."""
        return self._payload_io()[1].load(ref)

    def read_payload(self, ref: PayloadRef | str, offset: int = 0, limit: int = 100) -> PayloadPage:
        """``limit`` lines (text), items (arrays) or keys (objects) of a payload from ``offset``.

        ``ref`` may be the reference or just its key, as a model quotes it from a
        preview; ``page.next_offset`` says where to read on.
        """
        return self._payload_io()[1].read(ref, offset, limit)

    def _store_large_arguments(
        self, ctx: CallContext, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """Arguments with each one over the threshold stored, or why they cannot be sent."""
        threshold = self.settings.payload_threshold_bytes
        size = len(json.dumps(arguments))
        if size <= threshold:
            return arguments, None
        ttl = max(self.settings.payload_ttl_s, ctx.deadline - self.clock.now() + REPLY_TTL_S)
        inline = store_arguments(arguments, self._payload_io()[0], threshold, ttl)
        size = len(json.dumps(inline))
        if size > self.settings.max_argument_bytes:
            return inline, (
                f"the arguments are {size:,} bytes of JSON even with the large ones stored "
                f"apart; the limit is {self.settings.max_argument_bytes:,}"
            )
        return inline, None

    def _no_reply(self, p: _Prepared) -> ToolResult:
        """No worker answered before the deadline: say why that may be."""
        now = self.clock.now()
        alive = catalog_mod.workers_seen(self.redis, self.keys, now - 60)
        hint = (
            f"{len(alive)} worker(s) sent a heartbeat in the last minute"
            if alive
            else "no worker has sent a heartbeat in the last minute"
        )
        info = ErrorInfo(
            type=ErrorType.DEADLINE_EXCEEDED,
            message=f"no result arrived before the call's deadline ({hint}; queue {p.queue!r})",
            suggestion="The tool may be overloaded or no worker is running; try again later "
            "or continue without this result.",
            retryable=True,
        )
        return error_result(p.ctx, info, attempts=0, now=now)


def _shown(kwargs: dict[str, Any], secrets: frozenset[str] = frozenset()) -> str:
    """The repr of a call's kwargs that logs, events and Flower show, secrets redacted.

    The kwargs are JSON (checked in :func:`_parse_arguments`), so the cheap
    built-in ``repr`` of :func:`shown_kwargs` shows what ``saferepr`` would.
    """
    return shown_kwargs(kwargs, secrets)


#: Stripe's limit too: a key is an id (a UUID, an order number), not a payload.
_MAX_KEY_LENGTH = 255


def _checked_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_LENGTH:
        raise UsageError(
            f"idempotency_key must be a non-empty string of at most {_MAX_KEY_LENGTH} "
            f"characters (a UUID, say), not {key!r:.80}"
        )
    return key


def _parse_arguments(
    arguments: Mapping[str, Any] | str | None, limit: int
) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as a dict (models often send a JSON string), or what is wrong."""
    if arguments is None:
        return {}, None
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as exc:
            return None, f"the arguments are not valid JSON: {exc}"
    if not isinstance(arguments, Mapping):
        return None, f"the arguments must be a JSON object, not {type(arguments).__name__}"
    try:
        encoded = json.dumps(arguments)
    except (TypeError, ValueError) as exc:
        return None, f"the arguments cannot be sent as JSON: {exc}"
    if len(encoded) > limit:
        return None, (
            f"the arguments are {len(encoded):,} bytes of JSON; the limit is {limit:,}. "
            "Pass a reference (a URL or an id) instead of the content itself"
        )
    return dict(arguments), None
