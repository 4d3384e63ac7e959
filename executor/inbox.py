"""A consumer takes a message by moving it into its own inbox, not by popping it.

kombu's Redis transport waits for messages with ``BRPOP`` and records what it
took (``QoS.append``) in a second round trip. Between the two, the message
exists only in the worker's socket buffer: a SIGKILL there loses it for good
(not even the visibility timeout brings it back, since it was never recorded).
Under load the gap is not a few microseconds: the event loop may be busy with
acknowledgements while Redis has already popped the next message. The chaos
tests lost one call in about fourteen worker kills that way, after
:mod:`toolexec.orphans` had closed every other gap.

Here, when a channel consumes exactly one list, its wait is ``BLMOVE queue
inbox``: the message is never out of Redis. The append that records it
(:mod:`toolexec.transport_patch`) removes it from the inbox in the same
MULTI/EXEC, so a message is always in the queue, the inbox, or kombu's unacked
record, and the orphan watch moves a dead consumer's inbox back to its queue.

Where it does not apply, kombu's ``BRPOP`` runs unchanged: a channel consuming
several queues (no Redis command moves from the first non-empty of several
lists), a broker with a ``global_keyprefix`` (kombu's prefixing client does not
know ``BLMOVE``), a server older than Redis 6.2, or a process without an orphan
watch (nobody would empty its inbox). toolexec sets ``priority_steps`` to one
step (:mod:`toolexec.app`) so that a queue is one list.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from queue import Empty
from time import monotonic
from typing import Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from toolexec import orphans

__all__ = ["install", "take_pending"]

_SERVER_OK = "_toolexec_blmove_ok"
_TAKING = "_toolexec_taking"

#: What the consumer thread took but has not recorded yet: (inbox, raw item).
#: Delivery runs on the thread that read the message, and kombu may record it on
#: another channel than the one that read it, hence a thread-local, not the channel.
_taken = threading.local()


def install(channel_class: Any) -> None:
    """Patch the wait and the read of ``channel_class`` (kombu's Redis channel)."""
    setattr(channel_class, "_brpop_start", _moving_start(channel_class._brpop_start))  # noqa: B010
    setattr(channel_class, "_brpop_read", _moving_read(channel_class._brpop_read))  # noqa: B010


def take_pending() -> tuple[str, bytes] | None:
    """The inbox entry of the message being recorded now, once (for ``QoS.append``)."""
    pending: tuple[str, bytes] | None = getattr(_taken, "item", None)
    _taken.item = None
    return pending


def _single_list(channel: Any) -> str | None:
    """The one list ``channel`` waits on, when a move can replace its ``BRPOP``."""
    queues = channel.active_queues
    if len(queues) != 1 or list(channel.priority_steps) != [0] or channel.global_keyprefix:
        return None
    if orphans.held_key() is None or not _server_moves(channel):
        return None
    (queue,) = queues
    return str(queue)


def _server_moves(channel: Any) -> bool:
    """Whether the server has ``BLMOVE`` (Redis and Valkey >= 6.2); asked once a channel."""
    known = channel.__dict__.get(_SERVER_OK)
    if known is None:
        version = str(channel.client.info("server").get("redis_version", "0"))
        major, minor = (int(p) for p in [*version.split("."), "0"][:2])
        known = (major, minor) >= (6, 2)
        channel.__dict__[_SERVER_OK] = known
    return bool(known)


def _moving_start(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def start(self: Any, timeout: Any = None) -> Any:
        queue = _single_list(self)
        inbox = None if queue is None else orphans.inbox_key(queue)
        if queue is None or inbox is None:
            self.__dict__[_TAKING] = None
            return original(self, timeout)
        orphans.announce_inbox(self.client, queue)
        self.__dict__[_TAKING] = (queue, inbox)
        wait = self.brpop_timeout if timeout is None else timeout
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        self.client.connection.send_command("BLMOVE", queue, inbox, "RIGHT", "LEFT", wait or 0)
        return None

    return start


def _moving_read(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def read(self: Any, **options: Any) -> Any:
        taking = self.__dict__.get(_TAKING)
        if taking is None:
            return original(self, **options)
        queue, inbox = taking
        try:
            try:
                item = self.client.parse_response(self.client.connection, "BLMOVE", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # as kombu does: reconnect next round
                raise
            if item is None:
                raise Empty()
            self._queue_cycle.rotate(queue)
            _deliver(self, queue, inbox, item)
            return True
        finally:
            self._in_poll = None
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    return read


def _deliver(channel: Any, queue: str, inbox: str, item: bytes) -> None:
    _taken.item = (inbox, item)
    try:
        channel.connection._deliver(loads(bytes_to_str(item)), queue)  # type: ignore[no-untyped-call]
    finally:
        if take_pending() is not None:
            # never recorded (kombu found no consumer for it): back where it was
            pipe = channel.client.pipeline()
            pipe.lrem(inbox, 1, item)
            pipe.rpush(queue, item)
            pipe.execute()
