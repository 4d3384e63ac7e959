"""Waiting for a batch of calls: one reply list per batch, never past the deadlines.

Each call's result comes back on its batch's reply list
(:class:`~toolexec.replies.ReplyBox`). A call with no answer by its deadline
(plus a small grace) gets a ``deadline_exceeded`` result that says whether any
worker has been seen: the client never waits forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from toolexec import catalog
from toolexec.client.prepare import PreparedCall
from toolexec.clock import Clock
from toolexec.connection import async_redis_client, unavailable
from toolexec.errors import ErrorType
from toolexec.execution import error_result
from toolexec.keys import Keys
from toolexec.liveness import ALIVE_WINDOW_S
from toolexec.replies import ReplyBox
from toolexec.results import ErrorInfo, PayloadRef, ToolResult

__all__ = ["ReplyWaiter"]



class ReplyWaiter:
    """Collects the results of prepared calls from their reply lists."""

    def __init__(
        self,
        client: redis.Redis,
        url: str,
        keys: Keys,
        grace_s: float,
        clock: Clock,
        loader: Callable[[PayloadRef], Any],
    ) -> None:
        self.redis = client
        self.url = url
        self.keys = keys
        self.grace_s = grace_s
        self.clock = clock
        self.loader = loader

    def collect(self, batch: Sequence[PreparedCall], timeout: float | None) -> list[ToolResult]:
        """Every call's result in the batch's order; waits at most ``timeout`` seconds."""
        boxes = self._group(batch)
        end = time.monotonic() + self._wait_for(batch, timeout)
        try:
            for box in boxes.values():
                box.collect(self.redis, max(0.0, end - time.monotonic()))
        except redis.RedisError as exc:
            raise unavailable(self.url, exc) from exc
        return self._assemble(batch, boxes)

    async def acollect(self, batch: Sequence[PreparedCall]) -> list[ToolResult]:
        """The asyncio form of :meth:`collect`; waiting does not hold a thread."""
        boxes = self._group(batch)
        end = time.monotonic() + self._wait_for(batch, None)
        client = async_redis_client(self.url)
        try:
            for box in boxes.values():
                await box.acollect(client, max(0.0, end - time.monotonic()))
        except redis.RedisError as exc:
            raise unavailable(self.url, exc) from exc
        finally:
            await client.aclose()
        return self._assemble(batch, boxes)

    def _group(self, batch: Sequence[PreparedCall]) -> dict[str, ReplyBox]:
        boxes: dict[str, ReplyBox] = {}
        for p in batch:
            if p.early is None:
                box = boxes.setdefault(p.ctx.reply_to, ReplyBox(self.keys, p.ctx.reply_to, ()))
                box.pending.add(p.ctx.call_id)
        return boxes

    def _wait_for(self, batch: Sequence[PreparedCall], timeout: float | None) -> float:
        latest = max((p.ctx.deadline for p in batch if p.early is None), default=0.0)
        wait = latest + self.grace_s - self.clock.now()
        return max(0.0, wait if timeout is None else min(wait, timeout))

    def _assemble(
        self, batch: Sequence[PreparedCall], boxes: dict[str, ReplyBox]
    ) -> list[ToolResult]:
        out = []
        for p in batch:
            if p.early is not None:
                out.append(p.early)
                continue
            found = boxes[p.ctx.reply_to].results.get(p.ctx.call_id)
            if found is not None and found.payload is not None:
                found.attach_loader(self.loader)
            out.append(found if found is not None else self._no_reply(p))
        return out

    def _no_reply(self, p: PreparedCall) -> ToolResult:
        """No worker answered before the deadline: say why that may be."""
        now = self.clock.now()
        alive = catalog.workers_seen(self.redis, self.keys, now - ALIVE_WINDOW_S)
        hint = (
            f"{len(alive)} worker(s) sent a heartbeat in the last {ALIVE_WINDOW_S:g} s"
            if alive
            else f"no worker has sent a heartbeat in the last {ALIVE_WINDOW_S:g} s"
        )
        info = ErrorInfo(
            type=ErrorType.DEADLINE_EXCEEDED,
            message=f"no result arrived before the call's deadline ({hint}; queue {p.queue!r})",
            suggestion="The tool may be overloaded or no worker is running; try again later "
            "or continue without this result.",
            retryable=True,
        )
        return error_result(p.ctx, info, attempts=0, now=now)
