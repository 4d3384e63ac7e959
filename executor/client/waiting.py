"""Waiting for a batch of calls: one reply list per batch, never past the deadlines.

Each call's result comes back on its batch's reply list
(:class:`~toolexec.stores.replies.ReplyBox`). A call with no answer by its deadline
(plus a small grace) gets a ``deadline_exceeded`` result (``unknown`` for a
tool with side effects, which may have run) that says whether any worker has
been seen: the client never waits forever. Once a call is published the wait
never raises a connection error: the boxes read again after a Redis blip
until the deadline, on a client of their own whose reads cannot hang.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from toolexec.client.prepare import PreparedCall, not_sent_info
from toolexec.clock import Clock
from toolexec.connection import BLIPS, async_reply_client, reply_client, unavailable
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.results import ErrorInfo, PayloadRef, ToolResult, error_result
from toolexec.stores import catalog
from toolexec.stores.liveness import ALIVE_WINDOW_S
from toolexec.stores.replies import BLOCK_S, ReplyBox

__all__ = ["ReplyWaiter"]


_UNKNOWN_SUGGESTION = (
    "The call was sent but no answer came back in time, so it may or may not have taken "
    "effect. Verify the target state before doing it again; the same idempotency key "
    "joins the call or returns its stored outcome."
)


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
        # reply waits survive Redis blips on a client of their own (see ReplyBox)
        self.replies = reply_client(url, block_s=BLOCK_S)
        self.url = url
        self.keys = keys
        self.grace_s = grace_s
        self.clock = clock
        self.loader = loader

    def close(self) -> None:
        self.replies.close()

    def open(
        self, batch: Sequence[PreparedCall], boxes: dict[str, ReplyBox] | None = None
    ) -> dict[str, ReplyBox]:
        """The reply boxes of ``batch`` (added to ``boxes``), to :meth:`drain` while sending."""
        return self._group(batch, {} if boxes is None else boxes)

    def drain(self, boxes: dict[str, ReplyBox]) -> None:
        """Take the answers already back, without waiting; a Redis blip is left for later."""
        for box in boxes.values():
            with contextlib.suppress(*BLIPS):
                box.drain(self.replies)

    def collect(
        self,
        batch: Sequence[PreparedCall],
        timeout: float | None,
        boxes: dict[str, ReplyBox] | None = None,
        unsent: frozenset[str] = frozenset(),
    ) -> list[ToolResult]:
        """Every call's result in the batch's order; waits at most ``timeout`` seconds.

        ``boxes`` are those :meth:`open` gave while publishing; ``unsent`` the
        calls publishing left out because their deadline passed first.
        """
        boxes = self._without(boxes or self._group(batch), batch, unsent)
        end = time.monotonic() + self._wait_for(batch, timeout)
        try:
            for box in boxes.values():
                box.collect(self.replies, max(0.0, end - time.monotonic()))
        except redis.RedisError as exc:  # not a blip (those are waited out): e.g. a refused AUTH
            raise unavailable(self.url, exc) from exc
        return self._assemble(batch, boxes, unsent)

    async def acollect(
        self,
        batch: Sequence[PreparedCall],
        boxes: dict[str, ReplyBox] | None = None,
        unsent: frozenset[str] = frozenset(),
    ) -> list[ToolResult]:
        """The asyncio form of :meth:`collect`; waiting does not hold a thread."""
        boxes = self._without(boxes or self._group(batch), batch, unsent)
        end = time.monotonic() + self._wait_for(batch, None)
        client = async_reply_client(self.url, block_s=BLOCK_S)
        try:
            for box in boxes.values():
                await box.acollect(client, max(0.0, end - time.monotonic()))
        except redis.RedisError as exc:
            raise unavailable(self.url, exc) from exc
        finally:
            await client.aclose()
        return self._assemble(batch, boxes, unsent)

    def _group(
        self, batch: Sequence[PreparedCall], boxes: dict[str, ReplyBox] | None = None
    ) -> dict[str, ReplyBox]:
        boxes = {} if boxes is None else boxes
        for p in batch:
            if p.early is None:
                box = boxes.setdefault(p.ctx.reply_to, ReplyBox(self.keys, p.ctx.reply_to, ()))
                box.pending.add(p.ctx.call_id)
        return boxes

    @staticmethod
    def _without(
        boxes: dict[str, ReplyBox], batch: Sequence[PreparedCall], unsent: frozenset[str]
    ) -> dict[str, ReplyBox]:
        """``boxes`` waiting no more for the calls that were never sent."""
        for p in batch:
            if p.ctx.call_id in unsent:
                boxes[p.ctx.reply_to].pending.discard(p.ctx.call_id)
        return boxes

    def _wait_for(self, batch: Sequence[PreparedCall], timeout: float | None) -> float:
        latest = max((p.ctx.deadline for p in batch if p.early is None), default=0.0)
        wait = latest + self.grace_s - self.clock.now()
        return max(0.0, wait if timeout is None else min(wait, timeout))

    def _assemble(
        self,
        batch: Sequence[PreparedCall],
        boxes: dict[str, ReplyBox],
        unsent: frozenset[str] = frozenset(),
    ) -> list[ToolResult]:
        out = []
        for p in batch:
            if p.early is not None:
                out.append(p.early)
                continue
            if p.ctx.call_id in unsent:
                out.append(self._not_sent(p))
                continue
            found = boxes[p.ctx.reply_to].results.get(p.ctx.call_id)
            if found is not None and found.payload is not None:
                found.attach_loader(self.loader)
            out.append(found if found is not None else self._no_reply(p))
        return out

    def _not_sent(self, p: PreparedCall) -> ToolResult:
        """Publishing reached this call after its deadline: it was never queued, never ran."""
        return error_result(p.ctx, not_sent_info(), attempts=0, now=self.clock.now())

    def _no_reply(self, p: PreparedCall) -> ToolResult:
        """No worker answered before the deadline: say why that may be.

        A tool with side effects may have run all the same, so its call ends
        ``unknown``, never as a failure a model would simply repeat.
        """
        now = self.clock.now()
        info = ErrorInfo(
            type=ErrorType.DEADLINE_EXCEEDED,
            message=f"no result arrived before the call's deadline ({self._workers_hint(now)}; "
            f"queue {p.queue!r})",
            suggestion="The tool may be overloaded or no worker is running; try again later "
            "or continue without this result.",
            retryable=True,
        )
        if p.side_effects:
            info = info.model_copy(
                update={
                    "message": f"the outcome is unknown: {info.message}",
                    "suggestion": _UNKNOWN_SUGGESTION,
                    "retryable": False,
                }
            )
        result = error_result(p.ctx, info, attempts=0, now=now)
        return result.model_copy(update={"status": "unknown"}) if p.side_effects else result

    def _workers_hint(self, now: float) -> str:
        try:
            alive = catalog.workers_seen(self.redis, self.keys, now - ALIVE_WINDOW_S)
        except redis.RedisError:
            return "Redis did not answer when asked which workers are alive"
        if alive:
            return f"{len(alive)} worker(s) sent a heartbeat in the last {ALIVE_WINDOW_S:g} s"
        return f"no worker has sent a heartbeat in the last {ALIVE_WINDOW_S:g} s"
