"""Per-tool counters of the last minutes, in Redis, for ``toolexec status``.

The Prometheus metrics of :mod:`toolexec.ops.metrics` live in each worker process
and need a scraper to add them up. These live in Redis, so one command on any
host sees what the whole fleet did in the last minutes and which attempts run
now, with no monitoring stack. Workers write them through :class:`CallStats`:
a few commands when an attempt starts and when it ends, each time in the
round trip the attempt makes anyway (``toolexec.layers.batch``), into a hash of
the last hour's minutes (bounded by the number of tools, not of calls, and
pruned as the minutes pass, so the key count is flat) and a sorted
set of running attempts, whose members carry a lease so that an attempt of a
worker that died stops counting when its lease ends. Both are split into
``Keys.buckets`` keys by call id, each its own Redis Cluster hash tag, so no
single key takes every call of the fleet; readers add the buckets up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.keys import STATS_TTL_S, Keys, bucket_of
from toolexec.layers.batch import Batch, OnError
from toolexec.lua import register, script_source
from toolexec.stores.tally import Tally, Writer

__all__ = ["CallStats", "ToolStats", "running_attempt"]

_SEP = "|"

#: Minutes a stats hash keeps (``toolexec status --minutes`` at most): older ones are pruned.
KEPT_MINUTES = STATS_TTL_S // 60


@dataclass(frozen=True)
class ToolStats:
    """What one tool did over a window of minutes, and what it runs now.

    ``calls`` counts calls that ended (``ok`` plus every ``failed`` type), under
    the tool the caller called even when a step of its fallback chain answered;
    ``degraded`` those a fallback answered. ``attempts`` counts attempts that
    ended in a retry, a result or a hand-over to the fallback chain, ``retries``
    those that ended in a retry (``retried`` by the error that caused it). An
    attempt a rate limit deferred, or one another worker answered, is neither.
    """

    tool: str
    calls: int = 0
    ok: int = 0
    failed: Mapping[str, int] = field(default_factory=dict)
    attempts: int = 0
    retries: int = 0
    retried: Mapping[str, int] = field(default_factory=dict)
    in_flight: int = 0
    degraded: int = 0

    @property
    def failures(self) -> int:
        return sum(self.failed.values())

    @property
    def failure_rate(self) -> float | None:
        """Failed calls over calls that ended; None when none ended."""
        return self.failures / self.calls if self.calls else None

    @property
    def degraded_rate(self) -> float | None:
        """Calls a fallback answered over calls that ended; None when none ended."""
        return self.degraded / self.calls if self.calls else None

    @property
    def retry_rate(self) -> float | None:
        """Attempts that ended in a retry over attempts that ended; None without attempts."""
        return self.retries / self.attempts if self.attempts else None

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "ok": self.ok,
            "failed": dict(sorted(self.failed.items())),
            "failure_rate": self.failure_rate,
            "degraded": self.degraded,
            "degraded_rate": self.degraded_rate,
            "attempts": self.attempts,
            "retries": self.retries,
            "retried": dict(sorted(self.retried.items())),
            "retry_rate": self.retry_rate,
        }


def _member(tool: str, call_id: str, attempt: int) -> str:
    return f"{tool}{_SEP}{call_id}{_SEP}{attempt}"


class CallStats:
    """Writes the workers' counters and reads them back for a window.

    ``lease_ttl_s`` bounds how long the set of running attempts outlives its
    last write; it must exceed every lease (the longest deadline allowed).
    With a ``tally`` (a worker's), a call that succeeds is counted there and
    written with the process's next flush, and an attempt joins the running
    set only if it outlives one (``toolexec.stores.tally``); failures, retries and
    hand-overs are written with their call as before.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        clock: Clock | None = None,
        lease_ttl_s: float = 960.0,
        tally: Tally | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.clock = clock or SystemClock()
        self.lease_ttl_s = int(lease_ttl_s)
        self.tally = tally
        self._count_script = register(client, script_source("stats_count"))

    # -- the worker's side -------------------------------------------------

    def started(
        self,
        tool: str,
        call_id: str,
        attempt: int,
        lease_until: float,
        batch: Batch | None = None,
        on_error: OnError | None = None,
    ) -> None:
        """An attempt starts; it counts as running until it ends or ``lease_until``."""
        bucket = bucket_of(call_id, self.keys.buckets)
        key, member = self.keys.in_flight(bucket), _member(tool, call_id, attempt)
        if self.tally is not None:
            self.tally.started(key, member, lease_until)
            return

        def queue(pipe: Any) -> None:
            pipe.zadd(key, {member: lease_until})
            pipe.expire(key, self.lease_ttl_s)

        self._send(queue, batch, on_error)

    def retrying(
        self,
        tool: str,
        call_id: str,
        attempt: int,
        error_type: str,
        batch: Batch | None = None,
        on_error: OnError | None = None,
        keep_until: float | None = None,
    ) -> None:
        """The attempt failed transiently and another one is scheduled."""
        counts = {"attempts": 1, "retries": 1, f"retried{_SEP}{error_type}": 1}
        self._ended(tool, call_id, attempt, counts, batch, on_error, keep_until, tag="retry")

    def finished(
        self,
        tool: str,
        call_id: str,
        attempt: int,
        error_type: str | None,
        batch: Batch | None = None,
        on_error: OnError | None = None,
        keep_until: float | None = None,
        *,
        call_of: str | None = None,
        degraded: bool = False,
        chained: bool = False,
    ) -> None:
        """The call ended: ``error_type`` None means it succeeded.

        ``call_of`` is the tool the caller called when a step of its fallback
        chain (``tool``) gave the answer: the call and its outcome are
        ``call_of``'s. ``chained``: a fallback chain gave the answer, whose
        attempt, if a tool ran, was counted when it handed on (:meth:`handed_on`).
        With ``keep_until`` (the call's deadline and a margin) the counts are a
        held write (``toolexec.layers.batch``): sent again after a blip, counted once.
        """
        outcome = "ok" if error_type is None else f"failed{_SEP}{error_type}"
        call = {"calls": 1, outcome: 1} | ({"degraded": 1} if degraded else {})
        counts = {} if chained else {"attempts": 1}
        others = {call_of or tool: call}
        if error_type is None and not degraded and not chained and call_of in (None, tool):
            counts |= call
            self._ended(tool, call_id, attempt, counts, batch, on_error, keep_until, None, "ok")
            return
        self._ended(tool, call_id, attempt, counts, batch, on_error, keep_until, others, tag="end")

    def handed_on(
        self,
        tool: str,
        call_id: str,
        attempt: int,
        batch: Batch | None = None,
        on_error: OnError | None = None,
        keep_until: float | None = None,
    ) -> None:
        """The attempt's result goes to the fallback chain: an attempt ended, the call goes on."""
        counts = {"attempts": 1}
        self._ended(tool, call_id, attempt, counts, batch, on_error, keep_until, tag="handed")

    def withdrawn(
        self,
        tool: str,
        call_id: str,
        attempt: int,
        batch: Batch | None = None,
        on_error: OnError | None = None,
        keep_until: float | None = None,
    ) -> None:
        """The attempt stopped without an outcome of its own (deferred, or answered elsewhere)."""
        self._ended(tool, call_id, attempt, {}, batch, on_error, keep_until)

    def _ended(
        self,
        tool: str,
        call_id: str,
        attempt: int,
        counts: dict[str, int],
        batch: Batch | None,
        on_error: OnError | None,
        keep_until: float | None = None,
        others: Mapping[str, Mapping[str, int]] | None = None,
        tag: str = "",
    ) -> None:
        """The attempt leaves the running set (a ZREM: safe to send twice) and is counted.

        ``others`` are counts of other tools in the same write (the call a
        fallback step answered). The minute is fixed here, so a count sent
        again lands where it would have. The write id (counted once) names the
        tool and the kind of end (``tag``): a fallback step runs under the call's
        id with attempt numbers of its own, and must not be taken for a resend of
        the primary's retry or hand-over.
        """
        member = _member(tool, call_id, attempt)
        bucket = bucket_of(call_id, self.keys.buckets)
        held = None if keep_until is None else "stats"
        own = Batch() if batch is None else batch
        key = self.keys.in_flight(bucket)
        if self.tally is None or self.tally.ended(member):
            own.add(self.redis, lambda pipe: pipe.zrem(key, member), on_error=on_error, held=held)
        fields = {f"{tool}{_SEP}{name}": n for name, n in counts.items()}
        for other, more in (others or {}).items():
            fields |= {f"{other}{_SEP}{name}": n for name, n in more.items()}
        now = self.clock.now()
        minute = int(now // 60)
        if fields and self.tally is not None and tag == "ok":
            # one bucket per process, not per call: a flush is one script, and the
            # fleet's processes still spread over the buckets (readers add them up)
            summed = bucket_of(self.tally.ident, self.keys.buckets)
            self.tally.add(("stats", minute), fields, self._summed(summed, minute))
        elif fields:
            if self.tally is not None:  # this minute's successes go first
                self.tally.take_into(own, ("stats", minute))
            write = "" if keep_until is None else f"{call_id}:{attempt}:{tool}:{tag}"
            keep = "" if keep_until is None else repr(keep_until)
            self._count_into(own, bucket, minute, fields, (write, keep), on_error, held)
        if batch is None:
            own.execute()

    def _count_into(
        self,
        batch: Batch,
        bucket: int,
        minute: int,
        fields: Mapping[str, int],
        write: tuple[str, str],
        on_error: OnError | None,
        held: str | None,
    ) -> None:
        """The stats script adding ``fields`` to ``minute`` of ``bucket``, queued on ``batch``."""
        args: list[Any] = [repr(self.clock.now()), write[0], write[1]]
        args += [STATS_TTL_S, minute, minute - KEPT_MINUTES + 1]
        for name, amount in fields.items():
            args += [name, amount]
        keys = [self.keys.stats(bucket), self.keys.stats_done(bucket)]
        batch.script(self.redis, self._count_script, keys, args, on_error=on_error, held=held)

    def _summed(self, bucket: int, minute: int) -> Writer:
        """The tally's writer of one bucket's minute: a held write, counted once."""

        def write(batch: Batch, counts: Mapping[str, int], write: tuple[str, float]) -> None:
            ident = (write[0], repr(write[1]))
            self._count_into(batch, bucket, minute, counts, ident, None, "stats")

        return write

    def _send(self, queue: Any, batch: Batch | None, on_error: OnError | None) -> None:
        """Queue on ``batch`` (sent with the attempt's other commands), else send now."""
        own = Batch() if batch is None else batch
        own.add(self.redis, queue, on_error=on_error)
        if batch is None:
            own.execute()

    # -- the reader's side -------------------------------------------------

    def window(self, minutes: int) -> dict[str, ToolStats]:
        """Every tool seen in the last ``minutes`` minutes (this one included) or running now.

        Leases that passed are pruned here, on the operator's path, not on the
        workers' call path.
        """
        if not 1 <= minutes <= KEPT_MINUTES:
            raise ValueError(f"minutes must be between 1 and {KEPT_MINUTES}, not {minutes}")
        now = self.clock.now()
        current = int(now // 60)
        buckets = range(self.keys.buckets)
        pipe = self.redis.pipeline(transaction=False)
        for bucket in buckets:
            pipe.hgetall(self.keys.stats(bucket))
        for bucket in buckets:
            pipe.zremrangebyscore(self.keys.in_flight(bucket), "-inf", f"({now!r}")
            pipe.zrange(self.keys.in_flight(bucket), 0, -1)
        replies = pipe.execute()
        hashes = replies[: len(buckets)]
        running = replies[len(buckets) + 1 :: 2]
        counts: Counter[tuple[str, str]] = Counter()
        for fields in hashes:
            for name, value in fields.items():
                minute, _, rest = _text(name).partition(_SEP)
                if minute.isdigit() and current - minutes < int(minute) <= current:
                    tool, _, counter = rest.partition(_SEP)
                    counts[tool, counter] += int(value)
        for members in running:
            for member in members:
                counts[_text(member).split(_SEP, 1)[0], "in_flight"] += 1
        return _assemble(counts)


def running_attempt(client: redis.Redis, keys: Keys, call_id: str) -> int | None:
    """The attempt of call ``call_id`` running now, or None (queued, or waiting out a backoff).

    For progress reports (``toolexec mcp``): one scan of the running attempts,
    which stay few (at most the fleet's slots) and are listed only while stats are on.
    """
    pattern = f"*{_SEP}{call_id}{_SEP}*"
    key = keys.in_flight(bucket_of(call_id, keys.buckets))  # the call's own shard
    for member, _ in client.zscan_iter(key, match=pattern, count=1000):
        return int(_text(member).rsplit(_SEP, 1)[1])
    return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_SCALARS = frozenset({"calls", "ok", "attempts", "retries", "in_flight", "degraded"})
_BY_TYPE = frozenset({"failed", "retried"})


def _assemble(counts: Counter[tuple[str, str]]) -> dict[str, ToolStats]:
    """Counters as :class:`ToolStats`; a counter this version does not know is skipped."""
    by_tool: dict[str, dict[str, Any]] = {}
    for (tool, counter), value in counts.items():
        fields = by_tool.setdefault(tool, {"failed": {}, "retried": {}})
        kind, _, error_type = counter.partition(_SEP)
        if kind in _BY_TYPE and error_type:
            fields[kind][error_type] = value
        elif kind in _SCALARS and not error_type:
            fields[kind] = value
    return {tool: ToolStats(tool=tool, **fields) for tool, fields in sorted(by_tool.items())}
