"""The last good result of each call, kept for when the tool cannot answer.

:class:`LastGoodLayer` stores every success of a tool whose chain has a
:class:`~toolexec.fallback.steps.LastGood` step; the chain's cache step reads it back
with its age. The key is the tool and its validated arguments, normalised
(:func:`toolexec.normalize.arguments_hash`), so ``{"city": "Paris"}`` today
answers ``{"city": "Paris"}`` tomorrow whatever order or float formatting the
model used. A cached result that points at a stored payload (a large value,
``toolexec.payloads``) is only served while that payload is still readable.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import redis.exceptions

from toolexec.clock import Clock
from toolexec.fallback.steps import LastGood
from toolexec.keys import Keys
from toolexec.layers import Attempt, Layer, Outcome, Proceed, Verdict
from toolexec.layers.batch import Batch, OnError
from toolexec.normalize import arguments_hash

if TYPE_CHECKING:  # a type only: the registry imports the fallback steps
    from toolexec.registry import Registry, ToolSpec

__all__ = ["CachedResult", "LastGoodCache", "LastGoodLayer", "cache_step"]

log = logging.getLogger(__name__)


def cache_step(spec: ToolSpec) -> LastGood | None:
    """The tool's cache step, if its chain has one."""
    for step in spec.policy.fallbacks:
        if isinstance(step, LastGood):
            return step
    return None


@dataclass(frozen=True)
class CachedResult:
    """A stored success: its data (or preview and payload reference) and when it was stored."""

    data: Any
    payload: dict[str, Any] | None
    stored_at: float

    def age(self, now: float) -> float:
        return max(0.0, now - self.stored_at)


class LastGoodCache:
    """Last good results in Redis, one string per call, each with the step's TTL.

    Time comes from the injected clock (the worker's wall clock in production),
    so that age and expiry are exact in tests; Redis' own TTL only collects
    the garbage.
    """

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock) -> None:
        self.redis = client
        self.keys = keys
        self.clock = clock

    def key(self, tool: str, arguments: Any, tenant: str | None = None) -> str:
        """One call's entry; a tenant's (``TOOLEXEC_TENANT``) are its own."""
        scoped = arguments if tenant is None else {"tenant": tenant, "arguments": arguments}
        return self.keys.last_good(tool, arguments_hash(tool, scoped))

    def store(
        self,
        tool: str,
        arguments: Any,
        step: LastGood,
        data: Any,
        payload: dict[str, Any] | None = None,
        tenant: str | None = None,
    ) -> bool:
        """Keep ``data`` as the call's last good result; False when it is too large to keep."""
        batch = Batch()
        stored = self.store_into(batch, tool, arguments, step, data, payload, tenant=tenant)
        batch.execute()
        return stored

    def store_into(
        self,
        batch: Batch,
        tool: str,
        arguments: Any,
        step: LastGood,
        data: Any,
        payload: dict[str, Any] | None = None,
        on_error: OnError | None = None,
        tenant: str | None = None,
    ) -> bool:
        """:meth:`store` queued on ``batch``; False when the value is too large to keep."""
        entry = {"data": data, "payload": payload, "stored_at": self.clock.now()}
        encoded = json.dumps(entry, separators=(",", ":"), default=str)
        if len(encoded) > step.max_bytes:
            log.debug("not caching %s: %d bytes > max_bytes %d", tool, len(encoded), step.max_bytes)
            return False
        key, ttl_ms = self.key(tool, arguments, tenant), max(1, int(step.ttl_s * 1000))
        batch.add(self.redis, lambda pipe: pipe.set(key, encoded, px=ttl_ms), on_error=on_error)
        return True

    def lookup(
        self, tool: str, arguments: Any, step: LastGood, tenant: str | None = None
    ) -> CachedResult | None:
        """The last good result if it is younger than ``step.ttl_s`` and still whole."""
        raw = self.redis.get(self.key(tool, arguments, tenant))
        if raw is None:
            return None
        entry = json.loads(raw)
        found = CachedResult(entry["data"], entry.get("payload"), float(entry["stored_at"]))
        now = self.clock.now()
        if found.age(now) > step.ttl_s:
            return None
        expires = (found.payload or {}).get("expires_at")
        if expires is not None and expires <= now:
            return None  # its data is only a preview of a value no longer stored
        return found


class LastGoodLayer(Layer):
    """Stores each success of a tool that has a cache step; never fails the call.

    Sits inside the breaker (a refused call stored nothing anyway) and outside
    the payload layer, so that a large value is kept as its reference. The
    chain is read from ``registry`` when given: ``Registry.set_fallbacks`` may
    have added the cache step after the tool's task was made.
    """

    name = "last_good"

    def __init__(self, cache: LastGoodCache, registry: Registry | None = None) -> None:
        self.cache = cache
        self.registry = registry

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        outcome = proceed()
        attempt.notes[self.name] = outcome  # stored by ``record``, in the settlement
        return outcome

    def record(self, attempt: Attempt, outcome: Outcome, verdict: Verdict, batch: Batch) -> None:
        seen = attempt.notes.get(self.name)
        spec = (self.registry.get(attempt.tool) if self.registry else None) or attempt.spec
        step = cache_step(spec)
        if step is None or not isinstance(seen, Outcome) or not seen.ok or not seen.ran:
            return
        payload = getattr(seen, "payload", None)

        def failed(exc: Exception) -> None:
            log.warning("could not cache the result of %s: %s", attempt.tool, exc)

        self.cache.store_into(
            batch,
            attempt.tool,
            attempt.arguments,
            step,
            seen.data,
            None if payload is None else payload.model_dump(mode="json"),
            on_error=failed,
            tenant=attempt.ctx.tenant,
        )
