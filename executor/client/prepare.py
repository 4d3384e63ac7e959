"""Everything the client decides before a call is queued, without the tool's code.

Arguments are parsed (a model often sends a JSON string), size-checked and
validated against the schema in the catalog; a live worker must serve the tool's
queue (else ``no_worker`` at once, not at the deadline); the tool's breaker is checked; a
large argument is stored apart. A call that fails any of these ends at once with
a result written for the model, and no queue round trip. While the breaker is
open, a tool with a fallback chain starts the chain instead.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolexec.bounds import checked_id, checked_timeout, depth_problem, text_problem, too_deep
from toolexec.breaker import BreakerGate
from toolexec.client.catalog_cache import CatalogCache
from toolexec.client.payloads import ClientPayloads
from toolexec.clock import Clock
from toolexec.connection import redis_url, unavailable
from toolexec.context import CallContext
from toolexec.errors import CircuitOpenError, ErrorType, UsageError
from toolexec.fairness import NO_LANE, Lane, checked_cap, checked_priority
from toolexec.fallback.state import FALLBACK_TASK, ChainState
from toolexec.policies import BreakerPolicy
from toolexec.redaction import secret_names
from toolexec.results import ErrorInfo, ToolResult, error_info, error_result
from toolexec.settings import Settings
from toolexec.stores.catalog import CatalogEntry
from toolexec.stores.failopen import REDIS_ERRORS
from toolexec.stores.fairness_store import AmqpLanes
from toolexec.stores.liveness import LiveQueues, no_catalog_info, no_worker_info
from toolexec.validation import validate_against_schema

__all__ = [
    "CallPreparer",
    "CallSpec",
    "PreparedCall",
    "batch_too_large",
    "checked_key",
    "not_sent_info",
    "parse_arguments",
]

CallSpec = tuple[str, Mapping[str, Any] | str]

_SEND_A_REFERENCE = "Pass a reference (a URL or an id) instead of the content itself."

#: Stripe's limit too: a key is an id (a UUID, an order number), not a payload.
_MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class PreparedCall:
    """A call that passed the client's checks, or the result that ends it early."""

    ctx: CallContext
    arguments: dict[str, Any] | None
    queue: str | None
    early: ToolResult | None
    #: Argument names the tool's schema marks secret, redacted in ``kwargsrepr``.
    secrets: frozenset[str] = frozenset()
    #: The task to send instead of the tool's own: its fallback chain, while its breaker is open.
    task: str | None = None
    #: Whether the tool writes: a call of it left without an answer ends ``unknown``.
    side_effects: bool = False
    #: (tool, max_in_flight) when the tool caps its calls in flight (toolexec.transport.lanes).
    tool_cap: tuple[str, int] | None = None


class CallPreparer:
    """Turns what an agent asked for into a :class:`PreparedCall`."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        catalog: CatalogCache,
        gate: BreakerGate,
        payloads: ClientPayloads,
        live_queues: LiveQueues | None = None,
        amqp_lanes: AmqpLanes | None = None,
    ) -> None:
        self.settings = settings
        #: Per-key queues on RabbitMQ (``rabbitmq_fairness``); None: every call to its queue.
        self.amqp_lanes = amqp_lanes
        self.clock = clock
        self.catalog = catalog
        self.gate = gate
        self.payloads = payloads
        self.live_queues = live_queues

    def prepare_many(
        self,
        calls: Iterable[CallSpec],
        run_id: str | None,
        timeout: float | None,
        lane: Lane = NO_LANE,
    ) -> list[PreparedCall]:
        """Calls that share one reply list, so the caller collects them together."""
        windows = self.windows(calls, run_id, timeout, self.settings.max_batch_calls, lane)
        return [p for window in windows for p in window]

    def windows(
        self,
        calls: Iterable[CallSpec],
        run_id: str | None,
        timeout: float | None,
        size: int,
        lane: Lane = NO_LANE,
    ) -> Iterator[list[PreparedCall]]:
        """The calls of one batch prepared ``size`` at a time, as the caller asks for more.

        Once the first call's deadline has passed, the windows left are not
        prepared: their calls end ``deadline_exceeded`` at once, never sent, so a
        batch takes about its timeout, however large.

        A batch of more than ``max_batch_calls``, or with an item that is not a
        (tool, arguments) pair, is refused here, before any call is prepared:
        its last calls would wait behind the first ones' sending, and what the
        workers could not take in time would sit in the queue. Each window is
        prepared just before it is sent, so each call's deadline counts from
        then, as a call's deadline always counts from when it is prepared.
        """
        return self._windows(self.checked(calls), run_id, timeout, uuid.uuid4().hex, size, lane)

    def checked(self, calls: Iterable[CallSpec]) -> list[CallSpec]:
        """The batch as a list of (tool, arguments) pairs, or a UsageError before anything runs.

        Reads at most ``max_batch_calls + 1`` items, so an endless iterable is
        refused rather than read whole; the run guard counts the same list.
        """
        most = self.settings.max_batch_calls
        items = list(itertools.islice(calls, most + 1))  # never reads an endless iterable whole
        if len(items) > most:
            raise UsageError(batch_too_large(most))
        for item in items:
            if not (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str)):
                raise UsageError(f"call_many takes (tool_name, arguments) pairs; got {item!r:.200}")
        return items

    def _windows(
        self,
        items: list[CallSpec],
        run_id: str | None,
        timeout: float | None,
        reply_to: str,
        size: int,
        lane: Lane = NO_LANE,
    ) -> Iterator[list[PreparedCall]]:
        end: float | None = None  # the first call's deadline: the batch's own
        unsent: ToolResult | None = None
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            if end is not None and self.clock.now() >= end:
                unsent = unsent or error_result(
                    self._context(chunk[0][0], run_id, reply_to, end),
                    not_sent_info(),
                    attempts=0,
                    now=self.clock.now(),
                )
                yield [self._not_sent(tool, run_id, reply_to, end, unsent) for tool, _ in chunk]
                continue
            window = [
                self.prepare(tool, arguments, run_id, timeout, None, reply_to, lane=lane)
                for tool, arguments in chunk
            ]
            if end is None:
                end = min(p.ctx.deadline for p in window)
            yield window

    def _context(self, tool: str, run_id: str | None, reply_to: str, end: float) -> CallContext:
        return CallContext(
            call_id=uuid.uuid4().hex,
            tool=tool,
            deadline=end,
            submitted_at=self.clock.now(),
            reply_to=reply_to,
            run_id=checked_id(run_id, "run_id"),
            tenant=self.settings.tenant,
        )

    def _not_sent(
        self, tool: str, run_id: str | None, reply_to: str, end: float, template: ToolResult
    ) -> PreparedCall:
        """A call the batch's deadline passed before it could be sent: never queued, never run.

        Its result is a copy of ``template`` with its own id and tool: building
        and validating one per call cost about a millisecond each on a loaded
        machine, 18 s for the 19 700 calls a 20 000-call batch left unsent.
        """
        ctx = self._context(tool, run_id, reply_to, end)
        result = template.model_copy(update={"call_id": ctx.call_id, "tool": tool})
        return PreparedCall(ctx, None, None, result)

    def prepare(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None,
        run_id: str | None,
        timeout: float | None,
        call_id: str | None,
        reply_to: str | None,
        idempotency_key: str | None = None,
        lane: Lane = NO_LANE,
    ) -> PreparedCall:
        if not isinstance(tool, str) or not tool:
            raise UsageError(f"the tool name must be a non-empty string, not {tool!r}")
        now = self.clock.now()
        call_id = checked_id(call_id, "call_id") or uuid.uuid4().hex
        ctx = CallContext(
            call_id=call_id,
            tool=tool,
            deadline=self._deadline(timeout, now),
            submitted_at=now,
            reply_to=reply_to or call_id,
            run_id=checked_id(run_id, "run_id"),
            idempotency_key=checked_key(idempotency_key),
            tenant=self.settings.tenant,
            fairness_key=lane.fairness_key,
            priority=lane.priority,
        )
        parsed, problem = parse_arguments(arguments, self.settings.payload_max_bytes)
        if problem is not None or parsed is None:
            return self._early(
                ctx,
                ErrorType.INVALID_ARGUMENTS,
                problem or "the arguments are missing",
                "Send the arguments as a JSON object matching the tool's schema.",
            )
        entry = self.catalog.entry(tool)
        if entry is None:
            known = ", ".join(sorted(self.catalog.get()))
            if not known:
                result = error_result(ctx, no_catalog_info(tool), attempts=0, now=self.clock.now())
                return PreparedCall(ctx, None, None, result)
            return self._early(
                ctx,
                ErrorType.UNKNOWN_TOOL,
                f"there is no tool named {tool!r}",
                f"Use one of the available tools: {known}.",
            )
        return self._checked(ctx, entry, parsed)

    def _checked(
        self, ctx: CallContext, entry: CatalogEntry, parsed: dict[str, Any]
    ) -> PreparedCall:
        """The checks that need the tool's catalog entry: schema, a live worker, breaker, size."""
        if ctx.priority is None:
            ctx = replace(ctx, priority=_tool_priority(entry))
        problem = validate_against_schema(parsed, entry["parameters"])
        if problem is not None:
            return self._early(
                ctx,
                ErrorType.INVALID_ARGUMENTS,
                problem,
                "Fix the fields named above and call the tool again.",
            )
        unserved = self._unserved(ctx, entry["policy"]["queue"])
        if unserved is not None:
            return unserved
        refusal = self._breaker_refusal(ctx.tool, entry, parsed)
        if refusal is not None:
            chain = _fallback_instead(ctx, entry, parsed, refusal)
            if chain is not None:
                return chain
            result = error_result(ctx, error_info(refusal), attempts=0, now=self.clock.now())
            return PreparedCall(ctx, None, None, result)
        inline, problem = self.payloads.store_large_arguments(ctx, parsed)
        if problem is not None:
            return self._early(ctx, ErrorType.INVALID_ARGUMENTS, problem, _SEND_A_REFERENCE)
        secrets = secret_names(entry["parameters"])
        side_effects = bool(entry["policy"].get("side_effects"))
        cap = _tool_cap(entry)
        return PreparedCall(
            ctx,
            inline,
            self._queue(ctx, entry["policy"]["queue"]),
            None,
            secrets,
            side_effects=side_effects,
            tool_cap=None if cap is None else (ctx.tool, cap),
        )

    def _queue(self, ctx: CallContext, queue: str) -> str:
        """The queue the call goes to: on RabbitMQ with fairness on, its key's own."""
        if self.amqp_lanes is None or ctx.fairness_key is None:
            return queue
        try:
            return self.amqp_lanes.queue_for(queue, ctx.fairness_key)
        except REDIS_ERRORS as exc:
            raise unavailable(redis_url(self.settings), exc) from exc

    def _unserved(self, ctx: CallContext, queue: str) -> PreparedCall | None:
        """No live worker serves the queue: say so now instead of at the deadline."""
        if self.live_queues is None or self.live_queues.served(queue):
            return None
        result = error_result(ctx, no_worker_info(queue), attempts=0, now=self.clock.now())
        return PreparedCall(ctx, None, None, result)

    def _deadline(self, timeout: float | None, now: float) -> float:
        timeout = checked_timeout(timeout)  # NaN, strings, inf: refused before publishing
        if timeout is None:
            return now + self.settings.default_timeout
        return now + min(timeout, self.settings.max_timeout)

    def _breaker_refusal(
        self, tool: str, entry: CatalogEntry, arguments: dict[str, Any]
    ) -> CircuitOpenError | None:
        """Fail fast, without a queue round trip, while the tool's breaker is open.

        A closed breaker costs no round trip: the gate is a local copy Redis invalidates.
        """
        policy = entry["policy"]
        if "breaker" not in policy:  # published by a worker that predates breakers
            return None
        return self.gate.refusal(
            tool,
            BreakerPolicy.from_json(policy["breaker"]),
            policy.get("breaker_key"),
            arguments,
        )

    def _early(
        self, ctx: CallContext, kind: ErrorType, message: str, suggestion: str
    ) -> PreparedCall:
        info = ErrorInfo(type=kind, message=message, suggestion=suggestion, retryable=False)
        result = error_result(ctx, info, attempts=0, now=self.clock.now())
        return PreparedCall(ctx, None, None, result)


def _fallback_instead(
    ctx: CallContext,
    entry: CatalogEntry,
    arguments: dict[str, Any],
    refusal: CircuitOpenError,
) -> PreparedCall | None:
    """While the breaker is open, a tool with a fallback chain starts it instead of failing.

    The primary never runs; ``toolexec.fallback`` goes to the primary's queue,
    where workers have the code of the chain's argument mappings.
    """
    policy = entry["policy"]
    if not policy.get("fallbacks"):
        return None
    # the arguments travel once, as the message's own (toolexec.fallback reads them there)
    state = ChainState.begin(ctx.tool, policy["queue"], error_info(refusal), 0, None)
    started = replace(ctx, fallback=state)
    secrets = secret_names(entry["parameters"])
    return PreparedCall(started, arguments, policy["queue"], None, secrets, task=FALLBACK_TASK)


def not_sent_info() -> ErrorInfo:
    """Why a call of a batch was never sent: its deadline passed before its turn."""
    return ErrorInfo(
        type=ErrorType.DEADLINE_EXCEEDED,
        message="the call's deadline passed while the calls before it in the batch were "
        "still being sent, so it was not sent and did not run",
        suggestion="Send fewer calls at once or give them a longer timeout; this call "
        "can be made again safely.",
        retryable=True,
    )


def batch_too_large(most: int) -> str:
    """Why a batch was refused, and what to do instead."""
    return (
        f"call_many got more than {most:,} calls, the most one batch may hold "
        "(TOOLEXEC_MAX_BATCH_CALLS); nothing was sent. Send them in batches of at most "
        f"{most:,}, one after another, or raise the limit if the workers can run that many "
        "within the timeout (docs/limits.md)."
    )


def _tool_priority(entry: CatalogEntry) -> int | None:
    """The tool's own priority from its catalog entry; a value no worker could mean is none."""
    try:
        return checked_priority(entry["policy"].get("priority"))
    except UsageError:
        return None


def _tool_cap(entry: CatalogEntry) -> int | None:
    """The tool's cap on calls in flight from its catalog entry; a malformed one is none."""
    try:
        return checked_cap(entry["policy"].get("max_in_flight"))
    except UsageError:
        return None


def checked_key(key: str | None) -> str | None:
    """An idempotency key as given, refused when it cannot be one."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_LENGTH:
        raise UsageError(
            f"idempotency_key must be a non-empty string of at most {_MAX_KEY_LENGTH} "
            f"characters (a UUID, say), not {key!r:.80}"
        )
    return key


def parse_arguments(
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
        except RecursionError:
            return None, too_deep()
    if not isinstance(arguments, Mapping):
        return None, f"the arguments must be a JSON object, not {type(arguments).__name__}"
    nested = depth_problem(arguments)
    if nested is not None:  # before json.dumps, redaction and validation recurse into it
        return None, nested
    unencodable = text_problem(arguments)
    if unencodable is not None:  # before anything hashes, logs or stores the text
        return None, unencodable
    try:
        encoded = json.dumps(arguments, allow_nan=False)  # NaN is not JSON, whatever Python says
    except (TypeError, ValueError) as exc:
        return None, f"the arguments cannot be sent as JSON: {exc}"
    if len(encoded) > limit:
        return None, (
            f"the arguments are {len(encoded):,} bytes of JSON; the limit is {limit:,}. "
            "Pass a reference (a URL or an id) instead of the content itself"
        )
    return dict(arguments), None
