"""Everything the client decides before a call is queued, without the tool's code.

Arguments are parsed (a model often sends a JSON string), size-checked and
validated against the schema in the catalog; a live worker must serve the tool's
queue (else ``no_worker`` at once, not at the deadline); the tool's breaker is checked; a
large argument is stored apart. A call that fails any of these ends at once with
a result written for the model, and no queue round trip. While the breaker is
open, a tool with a fallback chain starts the chain instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolexec.bounds import checked_id, checked_timeout, depth_problem, text_problem, too_deep
from toolexec.breaker import BreakerGate
from toolexec.catalog import CatalogEntry
from toolexec.client.catalog_cache import CatalogCache
from toolexec.client.payloads import ClientPayloads
from toolexec.clock import Clock
from toolexec.context import CallContext
from toolexec.errors import CircuitOpenError, ErrorType, UsageError
from toolexec.execution import error_info, error_result
from toolexec.fallback.state import FALLBACK_TASK, ChainState
from toolexec.liveness import LiveQueues, no_worker_info
from toolexec.policies import BreakerPolicy
from toolexec.redaction import secret_names
from toolexec.results import ErrorInfo, ToolResult
from toolexec.settings import Settings
from toolexec.validation import validate_against_schema

__all__ = ["CallPreparer", "CallSpec", "PreparedCall", "checked_key", "parse_arguments"]

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
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.catalog = catalog
        self.gate = gate
        self.payloads = payloads
        self.live_queues = live_queues

    def prepare_many(
        self, calls: Iterable[CallSpec], run_id: str | None, timeout: float | None
    ) -> list[PreparedCall]:
        """Calls that share one reply list, so the caller collects them together."""
        reply_to = uuid.uuid4().hex
        batch = []
        for item in calls:
            if not (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str)):
                raise UsageError(f"call_many takes (tool_name, arguments) pairs; got {item!r}")
            batch.append(self.prepare(item[0], item[1], run_id, timeout, None, reply_to))
        return batch

    def prepare(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None,
        run_id: str | None,
        timeout: float | None,
        call_id: str | None,
        reply_to: str | None,
        idempotency_key: str | None = None,
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
            known = (
                ", ".join(sorted(self.catalog.get())) or "none: no worker has published a catalog"
            )
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
        return PreparedCall(
            ctx, inline, entry["policy"]["queue"], None, secrets, side_effects=side_effects
        )

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
