"""Final results travel back on a Redis list, not through Celery's result backend.

The Redis result backend stores and publishes every state change and makes
the caller subscribe once per task (docs/background.md, Celery). A caller that fans out 5000
calls would pay 5000 subscriptions; here every call of one submission names
the same reply list, the worker pushes the final :class:`ToolResult` onto it,
and the caller pops results as they come, in one blocking read at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import redis
import redis.asyncio

from toolexec.keys import REPLY_TTL_S, Keys
from toolexec.results import ToolResult

__all__ = ["ReplyBox", "deliver", "queue_reply"]


def queue_reply(
    pipe: redis.client.Pipeline, keys: Keys, reply_to: str, result: ToolResult, ttl: float
) -> None:
    """Queue the push of ``result`` on ``pipe``; the list expires if nobody collects it."""
    key = keys.reply(reply_to)
    pipe.rpush(key, result.model_dump_json())
    pipe.expire(key, max(1, math.ceil(ttl)) + REPLY_TTL_S)


def deliver(client: redis.Redis, keys: Keys, reply_to: str, result: ToolResult, ttl: float) -> None:
    """Push ``result`` for its caller in one round trip."""
    pipe = client.pipeline(transaction=False)
    queue_reply(pipe, keys, reply_to, result, ttl)
    pipe.execute()


#: The longest one BLPOP waits: a wait that a reconnect repeats overshoots the
#: caller's deadline by at most this (plus the reconnect).
REPLY_SLICE_S = 0.5


class ReplyBox:
    """Collects the results of the calls that share one reply list."""

    def __init__(self, keys: Keys, reply_to: str, call_ids: Iterable[str]) -> None:
        self.key = keys.reply(reply_to)
        self.pending = set(call_ids)
        self.results: dict[str, ToolResult] = {}

    def _take(self, raw: str | bytes) -> None:
        # pydantic parses the JSON itself, in about half the time of json.loads and
        # model_validate: this runs once per reply, the client's largest cost after sending
        result = ToolResult.model_validate_json(raw)
        if result.call_id in self.pending:
            self.pending.discard(result.call_id)
            self.results[result.call_id] = result

    def collect(self, client: redis.Redis, wait: float) -> None:
        """Pop results for at most ``wait`` seconds, or until none is pending."""
        end = time.monotonic() + wait
        while self.pending:
            left = end - time.monotonic()
            if left <= 0:
                return
            # In slices: a client library that retries a BLPOP after a lost connection
            # (a cluster's failover) sends it with its whole timeout again.
            popped = client.blpop([self.key], timeout=max(min(left, REPLY_SLICE_S), 0.001))
            if popped is None:
                continue
            self._take(popped[1])
            self._drain(client)

    def _drain(self, client: redis.Redis) -> None:
        """Take whatever else is already waiting, in one round trip."""
        if not self.pending:
            return
        pipe = client.pipeline(transaction=True)
        pipe.lrange(self.key, 0, len(self.pending) - 1)
        pipe.ltrim(self.key, len(self.pending), -1)
        waiting, _ = pipe.execute()
        for raw in waiting:
            self._take(raw)

    async def acollect(self, client: redis.asyncio.Redis, wait: float) -> None:
        """The asyncio twin of :meth:`collect`."""
        end = time.monotonic() + wait
        while self.pending:
            left = end - time.monotonic()
            if left <= 0:
                return
            popped = await client.blpop([self.key], timeout=max(min(left, REPLY_SLICE_S), 0.001))
            if popped is None:
                continue
            self._take(popped[1])
            await self._adrain(client)

    async def _adrain(self, client: redis.asyncio.Redis) -> None:
        """The asyncio twin of :meth:`_drain`: one round trip for whatever else is waiting."""
        if not self.pending:
            return
        pipe = client.pipeline(transaction=True)
        pipe.lrange(self.key, 0, len(self.pending) - 1)
        pipe.ltrim(self.key, len(self.pending), -1)
        waiting, _ = await pipe.execute()
        for raw in waiting:
            self._take(raw)
