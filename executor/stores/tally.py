"""A worker process's success-side bookkeeping, written to Redis a few times a second.

A healthy call used to write the fleet's bookkeeping in its own round trips:
its stats counters and its place in the running set, its success in the
breaker's window, its count in the retry budget. Nobody waits on those
writes, and nothing about a healthy call changes a decision, so they are
added up here, in the process, and :meth:`Tally.flush` sends each unit's sum
(a stats bucket's minute, a breaker, a budget) as one script call, every
unit in one pipelined round trip, at most every ``interval_s`` (0.25 s by
default). Only what cannot change a decision waits: a failure, a state
change, a probe or a refused retry is written with its call as before, and
the successes pending for the same unit go first in that round trip
(:meth:`Tally.take_into`), so that a breaker still sees them in their order.

A flush is a held write (``toolexec.layers.batch``): each unit's sum carries a write
id of its own, so a flush whose connection broke is sent again at the next
one and counted once, for as long as the scripts remember the id; past that
it is given up with one warning, as a call's held writes are.

The running set (``toolexec status``'s in-flight column, a dead worker's
attempts leased out of it) is kept the same way: an attempt that ends
within one interval never reaches Redis; one that runs longer is added at
the next flush and removed with its call's settlement (or, when it ended
while that flush was in the air, at the flush after).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.layers.batch import Batch
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = ["FLUSH_S", "Tally", "Writer"]

log = logging.getLogger("toolexec.worker")

#: How often the success-side sums are written: the lag of ``toolexec status`` and of
#: a breaker's window of successes behind the calls.
FLUSH_S = 0.25

#: How long a flush's write ids are remembered, and a flush lost with its connection
#: is sent again: long enough for a Redis restart, short for the ids' sorted sets.
KEEP_S = 120.0

#: Queues one unit's sum on a batch: ``(batch, counts, (write id, keep until))``.
Writer = Callable[[Batch, Mapping[str, int], tuple[str, float]], None]


@dataclass
class _Pending:
    writer: Writer
    counts: Counter[str] = field(default_factory=Counter)


@dataclass
class _Running:
    """An attempt in the running set: known only here, being added, or in Redis."""

    key: str
    lease_until: float
    state: str = "local"  # local | sending | sent


@dataclass
class _Resend:
    batch: Batch
    until: float


class Tally:
    """Sums of success-side writes, per unit; safe to share between a process's threads."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        clock: Clock | None = None,
        interval_s: float = FLUSH_S,
        running_ttl_s: int = 960,
    ) -> None:
        self.redis = client
        self.clock = clock or SystemClock()
        self.interval_s = interval_s
        self.running_ttl_s = running_ttl_s
        self._lock = threading.Lock()
        self._pending: dict[Hashable, _Pending] = {}
        self._running: dict[str, _Running] = {}
        self._late: list[tuple[str, str]] = []  # (key, member) ended while being added
        self._resend: list[_Resend] = []
        self._id = uuid.uuid4().hex[:12]
        #: This process's tally's name: its write ids, and the stats bucket its sums go to.
        self.ident = self._id
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Units given up after Redis stayed away past their ids' memory (for the log).
        self.dropped = 0

    # -- what the call path adds ---------------------------------------------

    def add(self, unit: Hashable, counts: Mapping[str, int], writer: Writer) -> None:
        """Add ``counts`` to ``unit``'s sum; ``writer`` (the latest) writes it at the flush."""
        with self._lock:
            pending = self._pending.get(unit)
            if pending is None:
                pending = self._pending[unit] = _Pending(writer)
            else:
                pending.writer = writer
            pending.counts.update(counts)

    def take_into(self, batch: Batch, unit: Hashable) -> None:
        """Queue ``unit``'s pending sum on ``batch`` now, ahead of a write that must follow it."""
        with self._lock:
            pending = self._pending.pop(unit, None)
            write = self._write_id() if pending is not None else None
        if pending is not None and write is not None:
            pending.writer(batch, pending.counts, write)

    def started(self, key: str, member: str, lease_until: float) -> None:
        """An attempt runs: it reaches the running set ``key`` only if it outlives a flush."""
        with self._lock:
            self._running[member] = _Running(key, lease_until)

    def ended(self, member: str) -> bool:
        """The attempt ended; True when it is in Redis and its settlement must remove it."""
        with self._lock:
            running = self._running.pop(member, None)
            if running is None or running.state == "local":
                return False  # never left the process
            if running.state == "sending":
                self._late.append((running.key, member))
                return False
            return True

    # -- the flush -------------------------------------------------------------

    def _write_id(self) -> tuple[str, float]:
        """Holds the lock."""
        self._seq += 1
        return f"tally:{self._id}:{self._seq}", self.clock.now() + KEEP_S

    def flush(self) -> None:
        """Send every pending sum and the attempts that outlived the last flush: one round trip."""
        self._resend_held()
        with self._lock:
            pending, self._pending = self._pending, {}
            writes = [(p, self._write_id()) for p in pending.values()]
            late, self._late = self._late, []
            adding = [(m, r) for m, r in self._running.items() if r.state == "local"]
            for _, running in adding:
                running.state = "sending"
        batch = Batch()
        for entry, write in writes:
            entry.writer(batch, entry.counts, write)
        if late:
            batch.add(self.redis, _removal(late), held="running set")
        if adding:
            batch.add(self.redis, self._additions(adding))
        try:
            batch.execute(hold=True)
        except REDIS_ERRORS as exc:  # the additions: a running set is a view, never held
            log.info("running attempts not listed this round (%s: %s)", type(exc).__name__, exc)
        except Exception:  # a script's own error is a bug: logged, the worker goes on
            log.exception("a flush of the success-side sums failed")
        self._settle_additions(adding)
        if batch.held:
            self._resend.append(_Resend(batch, self.clock.now() + KEEP_S / 2))

    def _additions(self, adding: list[tuple[str, _Running]]) -> Callable[[Any], None]:
        def queue(pipe: Any) -> None:
            by_key: dict[str, dict[str, float]] = {}
            for member, running in adding:
                by_key.setdefault(running.key, {})[member] = running.lease_until
            for key, members in by_key.items():
                pipe.zadd(key, members)
                pipe.expire(key, self.running_ttl_s)

        return queue

    def _settle_additions(self, adding: list[tuple[str, _Running]]) -> None:
        with self._lock:
            for member, running in adding:
                if self._running.get(member) is running:
                    running.state = "sent"

    def _resend_held(self) -> None:
        """Flushes a blip cut off, sent again; given up once their ids may be forgotten."""
        keep: list[_Resend] = []
        for resend in self._resend:
            try:
                done = resend.batch.resend_held()
            except Exception:
                log.exception("a flush sent again failed")
                done = True
            if done:
                continue
            if self.clock.now() < resend.until:
                keep.append(resend)
                continue
            dropped = resend.batch.drop_held()
            self.dropped += len(dropped)
            log.warning(
                "gave up writing %d success-side sum(s) (%s): Redis unreachable for %.0f s",
                len(dropped),
                ", ".join(sorted(set(dropped))),
                KEEP_S / 2,
            )
        self._resend = keep

    # -- the flusher thread ------------------------------------------------------

    def start(self) -> Tally:
        """Flush every ``interval_s`` on a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="toolexec-tally", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and write what is pending (a stopping worker's last successes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # a missed flush must never stop the worker
                log.exception("a flush of the success-side sums failed")


def _removal(late: list[tuple[str, str]]) -> Callable[[Any], None]:
    def queue(pipe: Any) -> None:
        by_key: dict[str, list[str]] = {}
        for key, member in late:
            by_key.setdefault(key, []).append(member)
        for key, members in by_key.items():
            pipe.zrem(key, *members)

    return queue
