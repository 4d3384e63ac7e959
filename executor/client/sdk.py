"""The agent-side SDK: call tools by name, get a :class:`ToolResult` back.

The client needs no tool code. It validates arguments against the catalog the
workers publish, routes each call to its tool's queue, and waits on a reply
list until the call's deadline. It raises only when it is misused or when
Redis or the broker cannot be reached; a tool's failure is a result.

This class only wires the pieces together: ``catalog_cache``, ``prepare``
(checks before queueing), ``publish``, ``waiting`` (replies and deadlines) and
``payloads`` (large values). Celery is imported when a client is built, not
when ``toolexec`` is, so a process that only declares tools stays light.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from toolexec.adapters import Format, arun_round, run_round
from toolexec.bounds import checked_id
from toolexec.breaker import BreakerGate, CircuitBreaker
from toolexec.client.catalog_cache import CatalogCache
from toolexec.client.guarded import begin_round, run_lane
from toolexec.client.payloads import ClientPayloads
from toolexec.client.prepare import CallPreparer, CallSpec, PreparedCall
from toolexec.client.publish import WINDOW, broker_app, publish
from toolexec.client.waiting import ReplyWaiter
from toolexec.clock import Clock
from toolexec.connection import fail_fast_client, fleet_clock, redis_client, redis_url
from toolexec.errors import InfrastructureError
from toolexec.fairness import NO_LANE, Lane, is_amqp
from toolexec.guard import RunGuard
from toolexec.keys import Keys
from toolexec.payloads import PayloadPage
from toolexec.policies import RunBudget
from toolexec.results import PayloadRef, ToolResult
from toolexec.settings import Settings
from toolexec.stores import catalog
from toolexec.stores.catalog import DefinitionFormat
from toolexec.stores.fairness_store import AmqpLanes
from toolexec.stores.liveness import LiveQueues
from toolexec.stores.replies import ReplyBox
from toolexec.tracing import configure, end_call, start_call

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["CallHandle", "ToolClient"]


class CallHandle:
    """A submitted call; :meth:`result` waits for it, at most until its deadline.

    Under a run's guard, the first :meth:`result` also settles the call's round, so
    the ruling (a nudge's note, or a refusal) is part of what it returns; a handle
    the guard refused outright carries its refusal from the start.
    """

    def __init__(
        self,
        waiter: ReplyWaiter | None,
        prepared: PreparedCall | None,
        span: Span | None,
        *,
        settle: Callable[[ToolResult], ToolResult] | None = None,
        ready: ToolResult | None = None,
    ) -> None:
        self._waiter = waiter
        self._prepared = prepared
        self._span = span
        self._settle = settle
        self._result: ToolResult | None = ready
        self._lock = threading.Lock()

    @property
    def call_id(self) -> str:
        if self._prepared is None:
            assert self._result is not None
            return self._result.call_id
        return self._prepared.ctx.call_id

    def result(self, timeout: float | None = None) -> ToolResult:
        """The call's result; past ``timeout`` (or the deadline) a ``deadline_exceeded`` one."""
        with self._lock:
            if self._result is None:
                assert self._prepared is not None and self._waiter is not None
                assert self._span is not None
                found = self._prepared.early or self._waiter.collect([self._prepared], timeout)[0]
                found = _ended([self._span], [found])[0]
                self._result = self._settle(found) if self._settle is not None else found
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
        configure("toolexec-client")  # only when OTEL_* asks for traces, and only once
        self._url = redis_url(self.settings)
        self.redis = redis_client(self._url)
        self.keys = Keys(self.settings.key_prefix, tenant=self.settings.tenant)
        self.app = celery_app or broker_app(self.settings)
        # the deadline is compared on a worker's host: both read it on Redis TIME
        self.clock = clock or fleet_clock(self.redis)
        self.breakers = CircuitBreaker(
            fail_fast_client(self._url),
            self.keys,
            on_redis_error=self.settings.breaker_on_redis_error,
        )
        self.catalog_cache = CatalogCache(
            self.redis, self.keys, self._url, self.settings.catalog_cache_s
        )
        self.payloads = ClientPayloads(self.settings, self._url, self.clock)
        self.gate = BreakerGate(self._url, self.breakers, self.keys, self.clock)
        self.preparer = CallPreparer(
            self.settings,
            self.clock,
            self.catalog_cache,
            self.gate,
            self.payloads,
            LiveQueues(self.redis, self.keys, self.clock),
            self._amqp_lanes(),
        )
        self.waiter = ReplyWaiter(
            self.redis,
            self._url,
            self.keys,
            self.settings.reply_grace,
            self.clock,
            self.load_payload,
        )

    @classmethod
    def from_env(cls, **overrides: Any) -> ToolClient:
        """A client for the ``TOOLEXEC_*`` settings of this environment."""
        return cls(Settings.from_env(**overrides))

    def close(self) -> None:
        self.redis.close()
        self.breakers.redis.close()
        self.gate.close()
        self.waiter.close()

    def _amqp_lanes(self) -> AmqpLanes | None:
        """Per-key queues when the broker is RabbitMQ and they are on (docs/guides/fairness.md)."""
        if not (self.settings.rabbitmq_fairness and is_amqp(self.settings.broker_url or "")):
            return None
        return AmqpLanes(self.redis, self.keys, self.clock)

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the catalog -------------------------------------------------------

    def catalog(self, refresh: bool = False) -> catalog.Catalog:
        """Every tool the workers have published: description, schema, policy."""
        return self.catalog_cache.get(refresh)

    def tool_definitions(
        self, format: DefinitionFormat = "openai", *, strict: bool = False
    ) -> list[dict[str, Any]]:
        """The tools as a ``tools=`` list: ``openai`` (Chat Completions), ``openai-responses``
        (the Responses API) or ``anthropic``.

        ``strict=True`` (the OpenAI shapes) gives each tool its strict-mode schema
        (``toolexec.strict``); a model answering under it sends arguments in that form,
        which :func:`toolexec.strict.from_strict` turns back (``run_tool_calls(...,
        strict=True)`` does it for you). A published tool with no strict form is sent
        with ``strict: false`` and its own schema.
        """
        return catalog.to_definitions(self.catalog(), format, strict=strict)

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
        guard: bool = True,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> ToolResult:
        """Run ``tool`` and wait for its result, at most ``timeout`` seconds.

        ``idempotency_key`` makes the call run at most once per key: a repeat
        with the same key joins the call in flight or gets its stored result
        (``replayed: true``); other arguments under the same key are refused
        with ``idempotency_mismatch``. Tools with ``side_effects=True`` derive a
        key from the run id, the tool and the arguments when none is given.

        With a ``run_id`` the call is a round of one under the run guard, as a
        model response's calls are in :meth:`run_tool_calls`: repeats, cycles and
        budgets get a nudge (the result's ``guard`` note, in ``content()``), then
        ``tool_disabled``, ``run_aborted`` or ``run_budget_exhausted`` results.
        ``guard=False`` opts out: the run id then only labels the call.

        ``fairness_key`` (a tenant or user id) and ``priority`` (1 most urgent … 5;
        the tool's own, else 3) choose the call's lane: workers take higher
        priorities first and, within one, keys in proportion to their weights
        (``toolexec fairness set``; docs/guides/fairness.md).
        """
        return self.submit(
            tool,
            arguments,
            run_id=run_id,
            timeout=timeout,
            call_id=call_id,
            idempotency_key=idempotency_key,
            guard=guard,
            fairness_key=fairness_key,
            priority=priority,
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
        guard: bool = True,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> CallHandle:
        """Enqueue a call and return at once with a handle to its result.

        Under the run guard (a ``run_id``, ``guard=True``) the round is settled when
        the handle's result is first read; a handle never read leaves its round open,
        which costs the run nothing but a step.
        """
        start_ns = time.time_ns()
        run_id = checked_id(run_id, "run_id")
        lane = Lane.of(fairness_key, priority)
        round_ = begin_round(self, run_id, [(tool, arguments)], guard, lane.fairness_key)
        lane = run_lane(round_, lane)
        if round_ is not None and not round_.to_run:
            return CallHandle(None, None, None, ready=round_.settle([])[0])
        asked = timeout if round_ is None else round_.timeout(timeout)
        try:
            prepared = self.preparer.prepare(
                tool,
                arguments,
                run_id,
                asked,
                call_id,
                None,
                idempotency_key=idempotency_key,
                lane=lane,
            )
            spans = _started([prepared], start_ns)
            publish(self.app, [prepared], spans)
        except InfrastructureError:
            if round_ is not None:
                round_.abandon()
            raise
        settle = round_.settler(0) if round_ is not None else None
        return CallHandle(self.waiter, prepared, spans[0], settle=settle)

    def call_many(
        self,
        calls: Iterable[CallSpec],
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        guard: bool = True,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> list[ToolResult]:
        """Run independent calls in parallel; results come back in the calls' order.

        At most ``max_batch_calls`` calls (``TOOLEXEC_MAX_BATCH_CALLS``): a
        larger batch raises :class:`~toolexec.errors.UsageError` before anything
        is sent. The calls are prepared and sent in windows of
        :data:`~toolexec.client.publish.WINDOW`, and the answers already back
        are read between windows, so the first calls run while the last are
        still being prepared and none of their answers is lost; see docs/limits.md.
        With a ``run_id`` the batch is one round under the run guard (see :meth:`call`).
        ``fairness_key`` and ``priority`` apply to every call (see :meth:`call`).
        """
        start_ns = time.time_ns()
        calls = self.preparer.checked(calls)
        run_id = checked_id(run_id, "run_id")
        lane = Lane.of(fairness_key, priority)
        round_ = begin_round(self, run_id, calls, guard, lane.fairness_key)
        lane = run_lane(round_, lane)
        todo = list(range(len(calls))) if round_ is None else round_.to_run
        asked = timeout if round_ is None else round_.timeout(timeout)
        try:
            ran = self._run_batch([calls[i] for i in todo], run_id, asked, start_ns, lane)
        except InfrastructureError:
            if round_ is not None:
                round_.abandon()
            raise
        return ran if round_ is None else round_.settle(ran)

    def _run_batch(
        self,
        calls: list[CallSpec],
        run_id: str | None,
        timeout: float | None,
        start_ns: int,
        lane: Lane = NO_LANE,
    ) -> list[ToolResult]:
        if not calls:
            return []
        sent = self._send_batch(calls, run_id, timeout, start_ns, lane)
        return _ended(sent.spans, self.waiter.collect(sent.batch, None, sent.boxes, sent.unsent))

    def _send_batch(
        self,
        calls: Iterable[CallSpec],
        run_id: str | None,
        timeout: float | None,
        start_ns: int,
        lane: Lane = NO_LANE,
    ) -> _Sent:
        """Prepare and send ``calls`` a window at a time, reading answers in between."""
        sent = _Sent()
        for window in self.preparer.windows(calls, run_id, timeout, WINDOW, lane):
            spans = _started(window, start_ns)
            self.waiter.open(window, sent.boxes)
            sent.unsent |= publish(self.app, window, spans, clock=self.clock)
            sent.batch += window
            sent.spans += spans
            self.waiter.drain(sent.boxes)
        return sent

    async def acall(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        call_id: str | None = None,
        idempotency_key: str | None = None,
        guard: bool = True,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> ToolResult:
        """The asyncio form of :meth:`call`; waiting does not hold a thread."""
        start_ns = time.time_ns()
        run_id = checked_id(run_id, "run_id")
        lane = Lane.of(fairness_key, priority)
        round_ = await asyncio.to_thread(
            begin_round, self, run_id, [(tool, arguments)], guard, lane.fairness_key
        )
        lane = run_lane(round_, lane)
        if round_ is not None and not round_.to_run:
            return (await asyncio.to_thread(round_.settle, []))[0]
        asked = timeout if round_ is None else round_.timeout(timeout)
        try:
            prepared = await asyncio.to_thread(
                self.preparer.prepare,
                tool,
                arguments,
                run_id,
                asked,
                call_id,
                None,
                idempotency_key,
                lane,
            )
            spans = _started([prepared], start_ns)
            await asyncio.to_thread(publish, self.app, [prepared], spans)
        except InfrastructureError:
            if round_ is not None:
                await asyncio.to_thread(round_.abandon)
            raise
        result = _ended(spans, await self.waiter.acollect([prepared]))[0]
        return result if round_ is None else (await asyncio.to_thread(round_.settle, [result]))[0]

    async def acall_many(
        self,
        calls: Iterable[CallSpec],
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        guard: bool = True,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> list[ToolResult]:
        """The asyncio form of :meth:`call_many`."""
        start_ns = time.time_ns()
        calls = self.preparer.checked(calls)
        run_id = checked_id(run_id, "run_id")
        lane = Lane.of(fairness_key, priority)
        round_ = await asyncio.to_thread(begin_round, self, run_id, calls, guard, lane.fairness_key)
        lane = run_lane(round_, lane)
        todo = list(range(len(calls))) if round_ is None else round_.to_run
        asked = timeout if round_ is None else round_.timeout(timeout)
        try:
            ran = await self._arun_batch([calls[i] for i in todo], run_id, asked, start_ns, lane)
        except InfrastructureError:
            if round_ is not None:
                await asyncio.to_thread(round_.abandon)
            raise
        return ran if round_ is None else await asyncio.to_thread(round_.settle, ran)

    async def _arun_batch(
        self,
        calls: list[CallSpec],
        run_id: str | None,
        timeout: float | None,
        start_ns: int,
        lane: Lane = NO_LANE,
    ) -> list[ToolResult]:
        if not calls:
            return []
        sent = await asyncio.to_thread(self._send_batch, calls, run_id, timeout, start_ns, lane)
        results = await self.waiter.acollect(sent.batch, sent.boxes, sent.unsent)
        return _ended(sent.spans, results)

    # -- a model's tool calls, under the run guard ---------------------------

    def run_guard(
        self,
        run_id: str,
        budget: RunBudget | None = None,
        *,
        clock: Clock | None = None,
        fairness_key: str | None = None,
    ) -> RunGuard:
        """The guardrails of run ``run_id``, kept in this client's Redis (see toolexec.guard).

        ``fairness_key`` becomes the run's at its next round if it has none: every
        call of the run that names no key then waits in that key's lane.
        """
        return RunGuard(
            run_id,
            budget,
            redis=self.redis,
            keys=self.keys,
            clock=clock or self.clock,
            fairness_key=fairness_key,
        )

    def run_tool_calls(
        self,
        tool_calls: Any,
        *,
        run_id: str | None = None,
        format: Format = "openai",
        budget: RunBudget | None = None,
        timeout: float | None = None,
        guard: RunGuard | None = None,
        strict: bool = False,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> list[dict[str, Any]]:
        """Run a model response's tool calls in parallel; the replies, in the calls' order.

        ``tool_calls`` is OpenAI's ``tool_calls`` or Anthropic's content blocks
        (dicts or SDK objects; the assistant message or whole response works
        too). Returns ``role: tool`` messages or ``tool_result`` blocks. With a
        ``run_id`` (or a ``guard``) the run guard counts steps, time and
        failures in Redis and answers loops with a nudge, then
        ``tool_disabled``, then ``run_aborted``; a spent budget answers
        ``run_budget_exhausted``. Without either, the calls just run.
        ``strict=True`` when the model was given ``tool_definitions(strict=True)``:
        its arguments are turned back into the catalog's shape (``toolexec.strict``).
        ``fairness_key`` (typically the run's tenant) and ``priority`` apply to every
        call of the round (see :meth:`call`).
        """
        run_id = checked_id(run_id, "run_id")
        lane = Lane.of(fairness_key, priority)
        guard = guard or (self.run_guard(run_id, budget) if run_id is not None else None)
        return run_round(
            self,
            tool_calls,
            format=format,
            guard=guard,
            timeout=timeout,
            strict=strict,
            fairness_key=lane.fairness_key,
            priority=lane.priority,
        ).messages

    async def arun_tool_calls(
        self,
        tool_calls: Any,
        *,
        run_id: str | None = None,
        format: Format = "openai",
        budget: RunBudget | None = None,
        timeout: float | None = None,
        guard: RunGuard | None = None,
        strict: bool = False,
        fairness_key: str | None = None,
        priority: int | None = None,
    ) -> list[dict[str, Any]]:
        """The asyncio form of :meth:`run_tool_calls`."""
        run_id = checked_id(run_id, "run_id")
        lane = Lane.of(fairness_key, priority)
        guard = guard or (self.run_guard(run_id, budget) if run_id is not None else None)
        outcome = await arun_round(
            self,
            tool_calls,
            format=format,
            guard=guard,
            timeout=timeout,
            strict=strict,
            fairness_key=lane.fairness_key,
            priority=lane.priority,
        )
        return outcome.messages

    # -- large results (toolexec.payloads) -----------------------------------

    def fetch_payload(self, ref: PayloadRef) -> bytes:
        """A stored payload's bytes, checked against its sha256.

        Raises :class:`~toolexec.errors.PayloadExpiredError` or
        :class:`~toolexec.errors.PayloadMissingError` when it is gone.
        """
        return self.payloads.fetch(ref)

    def load_payload(self, ref: PayloadRef) -> Any:
        """A stored payload as the value the tool returned (what ``result.load()`` calls)."""
        return self.payloads.load(ref)

    def read_payload(self, ref: PayloadRef | str, offset: int = 0, limit: int = 100) -> PayloadPage:
        """``limit`` lines (text), items (arrays) or keys (objects) of a payload from ``offset``.

        ``ref`` may be the reference or just its key, as a model quotes it from a
        preview; ``page.next_offset`` says where to read on.
        """
        return self.payloads.read(ref, offset, limit)


@dataclass
class _Sent:
    """What sending a batch left: the calls, their spans and boxes, and those not sent."""

    batch: list[PreparedCall] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    boxes: dict[str, ReplyBox] = field(default_factory=dict)
    unsent: frozenset[str] = frozenset()


def _started(batch: Sequence[PreparedCall], start_ns: int) -> list[Span]:
    """A client span per call, begun when the caller asked (before the checks)."""
    return [
        start_call(p.ctx.tool, p.ctx.call_id, p.ctx.run_id, p.ctx.deadline, p.queue, start_ns)
        for p in batch
    ]


def _ended(spans: Sequence[Span], results: list[ToolResult]) -> list[ToolResult]:
    for span, result in zip(spans, results, strict=True):
        error = None if result.error is None else str(result.error.type)
        end_call(span, result.status, error, result.attempts)
    return results
