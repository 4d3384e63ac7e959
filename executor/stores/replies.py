"""Final results travel back on a Redis list, not through Celery's result backend.

The Redis result backend stores and publishes every state change and makes
the caller subscribe once per task (docs/background.md, Celery). A caller that fans out 5000
calls would pay 5000 subscriptions; here every call of one submission names
the same reply list, the worker pushes the final :class:`ToolResult` onto it,
and the caller pops results as they come, in one blocking read at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Iterable

import redis
import redis.asyncio

from toolexec.connection import BLIPS, RECONNECT, through_blips
from toolexec.keys import REPLY_TTL_S, Keys
from toolexec.results import ToolResult

__all__ = ["BLOCK_S", "DELIVERY_GRACE_S", "ReplyBox", "deliver", "queue_reply"]


#: How long one blocking read lasts. Redis is asked again after each, so a dead
#: connection is noticed within this plus the socket timeout, never after the
#: deadline; and a client library that repeats a blocking read after a reconnect
#: (a cluster's failover) overshoots the caller's deadline by at most this.
BLOCK_S = 0.5

#: Answers read from a shared list per round trip.
_PAGE = 500

#: How long past the caller's deadline a worker keeps trying to deliver: the caller
#: waits a grace beyond it (``reply_grace``), and an answer it no longer reads expires.
DELIVERY_GRACE_S = 5.0


def queue_reply(
    pipe: redis.client.Pipeline, keys: Keys, reply_to: str, result: ToolResult, ttl: float
) -> None:
    """Queue the push of ``result`` on ``pipe``; the list expires if nobody collects it."""
    key = keys.reply(reply_to)
    pipe.rpush(key, result.model_dump_json())
    pipe.expire(key, max(1, math.ceil(ttl)) + REPLY_TTL_S)


def deliver(client: redis.Redis, keys: Keys, reply_to: str, result: ToolResult, ttl: float) -> None:
    """Push ``result`` for its caller in one round trip, through Redis blips.

    A blip must not lose an answer the tool already paid for, so the push is
    retried with backoff for as long as the caller still waits (``ttl``, the
    time to its deadline, plus :data:`DELIVERY_GRACE_S`). A retry after a push
    whose reply was lost may push the same result twice; the caller keeps the
    first copy of each call id and the list expires.
    """

    def push() -> None:
        pipe = client.pipeline(transaction=False)
        queue_reply(pipe, keys, reply_to, result, ttl)
        pipe.execute()

    through_blips(push, max(0.0, ttl) + DELIVERY_GRACE_S)


class ReplyBox:
    """Collects the results of the calls that share one reply list.

    Once a call is published its answer will be on the list, so a Redis blip
    while waiting is no reason to give up: the box reads again after a
    backoff until the wait is over, and the caller turns whatever is still
    pending into a typed outcome then (the list survives a restart with AOF).

    Reading never loses an answer to a broken connection: a pop whose reply
    is cut off by a restart would have taken the answer off the list for
    nobody. So the box waits with ``BLMOVE list list`` (a rotation that
    leaves the list as it was, and blocks only while it is empty), reads with
    ``LRANGE``, and trims only what it has received.
    """

    def __init__(self, keys: Keys, reply_to: str, call_ids: Iterable[str]) -> None:
        self.key = keys.reply(reply_to)
        self.pending = set(call_ids)
        self.results: dict[str, ToolResult] = {}
        #: Reads that failed in a row; the next pause grows with it.
        self.failures = 0
        self.rng = random.Random()

    def _take(self, raw: str | bytes) -> None:
        # pydantic parses the JSON itself, in about half the time of json.loads and
        # model_validate: this runs once per reply, the client's largest cost after sending
        result = ToolResult.model_validate_json(raw)
        if result.call_id in self.pending:
            self.pending.discard(result.call_id)
            self.results[result.call_id] = result

    def _pause(self, left: float) -> float:
        """How long to wait before reading again after a failed read."""
        self.failures += 1
        return min(left, RECONNECT.backoff(self.failures, None, self.rng))

    def _wait_args(self, left: float) -> tuple[str, str, str, str, str, float]:
        """BLMOVE from the list to its own head: wait for an answer without taking it."""
        return (
            "BLMOVE",
            self.key,
            self.key,
            "LEFT",
            "LEFT",
            round(max(min(left, BLOCK_S), 0.001), 3),
        )

    def collect(self, client: redis.Redis, wait: float) -> None:
        """Read results for at most ``wait`` seconds, or until none is pending."""
        end = time.monotonic() + wait
        while self.pending:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                self._read(client, left)
                self.failures = 0
            except BLIPS:
                time.sleep(self._pause(left))
        if self.pending:  # the wait is over: whatever is already back still counts
            with contextlib.suppress(*BLIPS):
                self.drain(client)
        self._forget(client)

    def drain(self, client: redis.Redis) -> None:
        """Take every answer on the list now, without waiting (a page per round trip).

        Run between the windows of a batch still being sent, and once more when
        the wait ends: a call that a worker answered in time is reported ok even
        when its caller was busy sending until after the deadline.
        """
        while self.pending:
            waiting: list[str] = client.lrange(self.key, 0, _PAGE - 1)  # type: ignore[assignment]
            for raw in waiting:
                self._take(raw)
            if waiting:
                client.ltrim(self.key, len(waiting), -1)
            if len(waiting) < _PAGE:
                return

    def _read(self, client: redis.Redis, left: float) -> None:
        if len(self.pending) == 1:  # one call's list: its answer alone, in one round trip
            head = client.execute_command(*self._wait_args(left))  # type: ignore[no-untyped-call]
            if head is not None:
                self._take(head)
            return
        # a shared list: the wait and the read of what is there go in one round trip
        # (the wait's rotation leaves the list as it was), then what was read is trimmed
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*self._wait_args(left))  # type: ignore[no-untyped-call]
        pipe.lrange(self.key, 0, _PAGE - 1)
        head, waiting = pipe.execute()
        if self._took(head, waiting):
            client.ltrim(self.key, len(waiting), -1)

    def _took(self, head: str | bytes | None, waiting: list[str | bytes]) -> bool:
        """Take a shared list's answers; whether what was read must be trimmed from it.

        Answers are pushed on the right and the wait rotates the head back onto
        the left, so ``waiting`` starts with ``head``: each answer is parsed once.
        With every answer in, nothing is trimmed: the list is dropped whole.
        """
        for raw in waiting:
            self._take(raw)
        if head is not None and not waiting:  # the list was emptied meanwhile by no one
            self._take(head)
        return bool(waiting) and bool(self.pending)

    def _forget(self, client: redis.Redis) -> None:
        """Drop the list once every answer is in (else its TTL does, after the deadline)."""
        if self.pending:
            return
        with contextlib.suppress(*BLIPS):
            client.unlink(self.key)

    async def acollect(self, client: redis.asyncio.Redis, wait: float) -> None:
        """The asyncio twin of :meth:`collect`."""
        end = time.monotonic() + wait
        while self.pending:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                await self._aread(client, left)
                self.failures = 0
            except BLIPS:
                await asyncio.sleep(self._pause(left))
        if self.pending:  # as in collect: what is already back still counts
            with contextlib.suppress(*BLIPS):
                await self._adrain(client)
        if not self.pending:
            with contextlib.suppress(*BLIPS):
                await client.unlink(self.key)

    async def _aread(self, client: redis.asyncio.Redis, left: float) -> None:
        if len(self.pending) == 1:  # as in _read
            head = await client.execute_command(*self._wait_args(left))  # type: ignore[no-untyped-call]
            if head is not None:
                self._take(head)
            return
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*self._wait_args(left))
        pipe.lrange(self.key, 0, _PAGE - 1)
        head, waiting = await pipe.execute()
        if self._took(head, waiting):
            await client.ltrim(self.key, len(waiting), -1)

    async def _adrain(self, client: redis.asyncio.Redis) -> None:
        """The asyncio twin of :meth:`drain`."""
        while self.pending:
            waiting: list[bytes | str] = await client.lrange(self.key, 0, _PAGE - 1)
            for raw in waiting:
                self._take(raw)
            if waiting:
                await client.ltrim(self.key, len(waiting), -1)
            if len(waiting) < _PAGE:
                return
