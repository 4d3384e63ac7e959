"""Messages a killed worker had taken go back to their queues within seconds.

kombu's Redis transport records every message a consumer takes, until it is
acknowledged, in one broker-wide hash (``unacked``) with the time it was
taken. Nothing there says which consumer holds it, so a killed worker's
messages come back only after the visibility timeout (``max_timeout`` + 60 s:
minutes). A call that had started is handed over sooner by its lease
(:mod:`toolexec.idempotency`); a message taken but not started yet (waiting
for a slot, or for its ETA) held no lease, and its caller waited out its
deadline. That was the last way a killed worker lost calls (``bench/chaos.py``
soak: 3 of 14 669; ``tests/chaos`` lost one in about one run of four).

RabbitMQ requeues a consumer's unacknowledged messages as soon as its
connection drops. This module gives the Redis transport the same rule:

* each consumer process notes the delivery tags it holds in a set of its own,
  inside the round trip kombu makes anyway to record them
  (:class:`toolexec.transport.QoS`), and removes them in the acknowledgement's;
* its :class:`OrphanWatch` beats an alive key whose TTL Redis keeps;
* every worker's watcher restores, with kombu's own restore, the messages of a
  consumer whose alive key is gone, then forgets that consumer.

A restored message of a call that had started meets its idempotency record:
a duplicate while the lease lives, a replay once it ended, never a second run
of a side effect. A worker wrongly judged dead (frozen for longer than
:data:`~toolexec.keys.CONSUMER_ALIVE_TTL_S`) gets its read-only calls run
twice, which is the at-least-once rule those calls already have.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kombu.exceptions import OperationalError

from toolexec.clock import Clock, SystemClock
from toolexec.connection import BLIPS
from toolexec.idempotency.ticks import run_every
from toolexec.keys import CONSUMER_ALIVE_TTL_S, REAP_LOCK_S, BrokerKeys

__all__ = [
    "OrphanWatch",
    "activate",
    "announce_inbox",
    "broker_keys",
    "deactivate",
    "dead_consumers",
    "hand_back",
    "held_key",
    "inbox_key",
    "may_judge",
]

log = logging.getLogger("toolexec.worker")

#: A broker that is away: kombu wraps Redis's errors when it (re)connects.
_AWAY: tuple[type[BaseException], ...] = (*BLIPS, OperationalError, OSError)

#: How often a watcher beats and looks for dead consumers: five beats fit in an
#: alive key's TTL, and a look is two small pipelines on the broker.
WATCH_S = 1.0

#: A held set outlives its consumer by the visibility timeout plus this: by then
#: kombu has restored whatever it held (``BrokerKeys.held``).
HELD_MARGIN_S = 60


@dataclass(frozen=True)
class _Holder:
    keys: BrokerKeys
    consumer: str
    held: str
    pid: int
    #: queues whose inbox the broker already knows of (``BrokerKeys.inboxes``)
    announced: set[str] = field(default_factory=set)


_holder: _Holder | None = None

#: This process's running watch, for :func:`hand_back` (a worker stopping at once).
_running: OrphanWatch | None = None


def activate(keys: BrokerKeys) -> str:
    """Give this process a consumer id, from which on it notes what it holds.

    Once per process: a forked child (prefork's pool) does not consume, and a
    consumer that reconnects keeps its id, so its held set stays one set.
    """
    global _holder
    if _holder is None or _holder.pid != os.getpid():
        consumer = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        _holder = _Holder(keys, consumer, keys.held(consumer), os.getpid())
    return _holder.consumer


def deactivate() -> None:
    """Stop noting held messages in this process (a worker never does: it dies with them)."""
    global _holder
    _holder = None


def held_key() -> str | None:
    """The held set of this process's consumer, or None when no watcher runs here.

    Without a watcher nobody would beat for the set or ever clear it, so a
    process that is not a worker (a script consuming with kombu) notes nothing.
    """
    if _holder is None or _holder.pid != os.getpid():
        return None
    return _holder.held


def inbox_key(queue: str) -> str | None:
    """This process's inbox for ``queue`` (``toolexec.transport.inbox``), or None without a
    watcher."""
    if _holder is None or _holder.pid != os.getpid():
        return None
    return _holder.keys.inbox(_holder.consumer, queue)


def broker_keys() -> BrokerKeys | None:
    """The broker's key names of this process's consumer, or None without a watcher."""
    if _holder is None or _holder.pid != os.getpid():
        return None
    return _holder.keys


def announce_inbox(client: Any, queue: str) -> None:
    """Tell the broker, once per queue, that this consumer has an inbox for ``queue``.

    Before the first message can be moved there, so that a watcher finds every
    inbox of a dead consumer from one set, never by scanning the keyspace.
    """
    if _holder is None or _holder.pid != os.getpid() or queue in _holder.announced:
        return
    pipe = client.pipeline(transaction=False)
    pipe.sadd(_holder.keys.inboxes(_holder.consumer), queue)
    pipe.execute()
    _holder.announced.add(queue)


def hand_back() -> int:
    """Messages this process's consumer held, put back in their queues (0 without a watch).

    A broker that is away keeps them in its unacknowledged set: the other
    workers' watchers restore them once this consumer's alive key expires.
    """
    watch = _running
    if watch is None or _holder is None or _holder.pid != os.getpid():
        return 0
    try:
        return watch.hand_back_own()
    except _AWAY as exc:
        log.warning("could not hand back the messages this worker held: %s", exc)
        return 0


def may_judge(now: float, connected_since: float | None, alive_ttl_s: float) -> bool:
    """Whether this watcher may call others dead: only after an alive key's TTL connected.

    After a Redis restart or a network cut every consumer's alive key may be
    gone at once; the others need one TTL of beats to write theirs again.
    """
    return connected_since is not None and now - connected_since >= alive_ttl_s


def dead_consumers(members: Sequence[str], alive: Sequence[bool], me: str) -> list[str]:
    """The members whose alive key is gone, never this watcher's own consumer."""
    return [m for m, beating in zip(members, alive, strict=True) if not beating and m != me]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class OrphanWatch:
    """Beats for this process's consumer and restores dead consumers' messages.

    ``connect`` returns a kombu Redis channel of the broker (its ``client``
    and ``qos`` are used); it is called again after a connection error.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        keys: BrokerKeys,
        consumer: str,
        *,
        visibility_timeout: float,
        clock: Clock | None = None,
        alive_ttl_s: float = CONSUMER_ALIVE_TTL_S,
    ) -> None:
        self.connect = connect
        self.keys = keys
        self.consumer = consumer
        self.held_ttl_s = int(visibility_timeout) + HELD_MARGIN_S
        self.clock = clock or SystemClock()
        self.alive_ttl_s = alive_ttl_s
        self._channel: Any = None
        self._connected_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> int:
        """One beat, then one look for the dead; returns how many messages were restored."""
        try:
            if self._channel is None:
                self._channel = self.connect()
            self._beat(self._channel.client)
            now = self.clock.now()
            if self._connected_since is None:
                self._connected_since = now
            if not may_judge(now, self._connected_since, self.alive_ttl_s):
                return 0
            return sum(self._reap(self._channel, dead) for dead in self._dead(self._channel.client))
        except _AWAY as exc:
            log.debug("orphan watch: broker unreachable (%s); next beat retries", exc)
            self._drop()
            return 0

    def _drop(self) -> None:
        channel, self._channel = self._channel, None
        self._connected_since = None
        if channel is None:
            return
        try:
            channel.connection.client.release()
        except Exception as exc:  # a connection that is already broken may fail to close
            log.debug("orphan watch: closing the old broker connection: %s", exc)

    def _beat(self, client: Any) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.set(self.keys.alive(self.consumer), 1, px=int(self.alive_ttl_s * 1000))
        pipe.sadd(self.keys.consumers(), self.consumer)
        pipe.expire(self.keys.held(self.consumer), self.held_ttl_s)
        pipe.execute()

    def _dead(self, client: Any) -> list[str]:
        members = sorted(_text(m) for m in client.smembers(self.keys.consumers()))
        if not members:
            return []
        pipe = client.pipeline(transaction=False)
        for member in members:
            pipe.exists(self.keys.alive(member))
        return dead_consumers(members, [bool(n) for n in pipe.execute()], self.consumer)

    def _reap(self, channel: Any, dead: str, *, own: bool = False) -> int:
        """Restore ``dead``'s messages; one watcher at a time per dead consumer."""
        client = channel.client
        lock = self.keys.reaping(dead)
        if not client.set(lock, self.consumer, nx=True, px=int(REAP_LOCK_S * 1000)):
            return 0
        tags = [_text(t) for t in client.smembers(self.keys.held(dead))]
        pipe = client.pipeline(transaction=False)
        for tag in tags:
            pipe.hexists(channel.unacked_key, tag)
        waiting = [t for t, present in zip(tags, pipe.execute(), strict=True) if present]
        for tag in waiting:
            channel.qos.restore_by_tag(tag, client=client)
        moved = self._empty_inboxes(client, dead)
        pipe = client.pipeline(transaction=False)
        pipe.delete(self.keys.held(dead), self.keys.inboxes(dead))
        pipe.srem(self.keys.consumers(), dead)
        pipe.delete(lock)
        pipe.execute()
        if (waiting or moved) and not own:
            log.warning(
                "worker consumer %s stopped beating; %d message(s) it had taken are back in "
                "their queues",
                dead,
                len(waiting) + moved,
            )
        return len(waiting) + moved

    def _empty_inboxes(self, client: Any, dead: str) -> int:
        """Move what ``dead`` was taking, not yet recorded, back to the head of its queue."""
        moved = 0
        for raw in client.smembers(self.keys.inboxes(dead)):
            queue = _text(raw)
            inbox = self.keys.inbox(dead, queue)
            while client.lmove(inbox, queue, "LEFT", "RIGHT") is not None:
                moved += 1
        return moved

    def start(self) -> OrphanWatch:
        global _running
        self._thread = threading.Thread(target=self._loop, name="toolexec-orphans", daemon=True)
        self._thread.start()
        _running = self
        return self

    def hand_back_own(self) -> int:
        """Put every message this consumer holds back in its queue, now, and forget it.

        For a worker that stops without finishing its calls (a second Ctrl-C):
        what a dead consumer's watcher would do seconds later, done by the
        consumer itself on a connection of its own (the watch thread's may be
        mid-beat). A call that had started keeps its idempotency record, so a
        side effect is never run twice: its lease hands it over.
        """
        self._stop.set()
        channel = self.connect()
        try:
            return self._reap(channel, self.consumer, own=True)
        finally:
            try:
                channel.connection.client.release()
            except Exception as exc:  # the process exits next: nothing to keep
                log.debug("orphan watch: closing the hand-back connection: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * WATCH_S)
        self._drop()

    def _loop(self) -> None:
        run_every(WATCH_S, self.tick, "orphan watch", self._stop)
