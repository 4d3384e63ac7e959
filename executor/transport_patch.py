"""A patch of kombu's Redis transport, so that a worker survives Redis flapping.

The crash it prevents (kombu 5.7, Celery 5.7; the same stack as
celery/kombu#582): when the consumer loses Redis, Celery first ``collect``s
the broken connection, which detaches the transport from its connection
(``transport.client = None``), and then ``close``s it. If the first attempt
to close the channel was cut short by the outage (it is, when Redis is still
down), the second one restores the unacknowledged messages, needs a new
Redis pool for that, and builds its parameters from ``transport.client``:
``AttributeError: 'NoneType' object has no attribute 'hostname'``. That is no
connection error, so ``ignore_errors`` lets it through and the worker stops
with "Unrecoverable error". The tasks still running ack their messages on the
same old channel, and each ack meets the same error.

The fix keeps what the channel was connected with when it first built a pool
and lends it back to a transport that lost it, so the restore and the acks
of the old channel reach the same Redis as before (or fail with a connection
error, which every caller already handles). ``bench/chaos.py`` (scenario
``redis-flaps``) and ``tests/chaos`` measure it: without the patch the
worker exits on the first or second burst of restarts.

A second patch closes a window in which a call was lost. kombu takes a
message off its queue with ``BRPOP`` and only then records it as unacknowledged
(``QoS.append``, one more round trip); when Redis goes away between the two,
that write raises, the message, already off the queue, is dropped, and its
caller waits until its deadline (measured: about one call per Redis flap
under load). The patched ``append`` retries the write through the blip for a
few seconds and, if Redis stays away, keeps the message anyway: it runs, only
without the record that would hand it on if this worker died too.

A third one makes the same round trip note the message in this consumer's
held set, and the acknowledgement's remove it (:mod:`toolexec.orphans`), so
that a killed worker's messages go back to their queues within seconds.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as virtual
from kombu.utils.json import dumps

from toolexec import inbox, orphans
from toolexec.connection import BLIPS, through_blips

__all__ = ["install"]

log = logging.getLogger("toolexec.worker")

_SAVED = "_toolexec_conninfo"

#: How long the consumer loop retries recording a message it took: it has nothing
#: else to do while its Redis is away, and the message is already off the queue.
UNACKED_WRITE_S = 5.0


def install() -> None:
    """Patch ``kombu.transport.redis.Channel`` once per process (sentinel channels inherit it)."""
    channel = kombu_redis.Channel
    if getattr(channel, "_toolexec_patched", False):
        return
    # setattr: mypy rightly objects to assigning methods, which is what a patch is
    setattr(channel, "_connparams", _keeping_conninfo(channel._connparams))  # noqa: B010
    qos = kombu_redis.QoS
    setattr(qos, "append", _keeping_taken_messages(_noting_held))  # noqa: B010
    setattr(qos, "_remove_from_indices", _forgetting_held(qos._remove_from_indices))  # noqa: B010
    inbox.install(channel)
    setattr(channel, "_toolexec_patched", True)  # noqa: B010


def _keeping_conninfo(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    @functools.wraps(original)
    def connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport.client is not None:
            self.__dict__[_SAVED] = transport.client
        elif _SAVED in self.__dict__:
            # the connection was collected; only this old channel still uses the transport
            transport.client = self.__dict__[_SAVED]
        else:
            raise redis.ConnectionError("the broker connection was already closed")
        return original(self, asynchronous=asynchronous)

    return connparams


def _keeping_taken_messages(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def append(self: Any, message: Any, delivery_tag: Any) -> None:
        taken = inbox.take_pending()  # once: every try of the record must empty the inbox
        try:
            through_blips(lambda: original(self, message, delivery_tag, taken), UNACKED_WRITE_S)
        except BLIPS as exc:
            # still in the inbox, if it was moved there: the orphan watch gives it back
            # should this worker die too
            log.warning(
                "message %s taken while Redis went away (%s); running it without its "
                "unacknowledged record",
                delivery_tag,
                exc,
            )
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    return append


def _noting_held(
    self: Any, message: Any, delivery_tag: Any, taken: tuple[str, bytes] | None = None
) -> None:
    """kombu's unacked record of a taken message, plus this consumer's held set: one round trip.

    The record's layout is the one kombu's ``restore_by_tag`` reads back (the
    raw message, its exchange and routing key); ``tests/integration/
    test_orphans.py`` restores through kombu what this wrote.
    """
    delivery = message.delivery_info
    entry = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])  # type: ignore[no-untyped-call]
    held = orphans.held_key()
    with self.channel.conn_or_acquire() as client:
        pipe = client.pipeline()
        pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
        pipe.hset(self.unacked_key, delivery_tag, entry)
        if held is not None:
            pipe.sadd(held, delivery_tag)
        if taken is not None:  # out of the inbox it was moved into (toolexec.inbox)
            pipe.lrem(taken[0], 1, taken[1])
        pipe.execute()
    virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]


def _forgetting_held(original: Callable[..., Any]) -> Callable[..., Any]:
    """Whatever removes a tag from kombu's unacked record removes it from the held set."""

    @functools.wraps(original)
    def remove(self: Any, delivery_tag: Any, pipe: Any = None) -> Any:
        queued = original(self, delivery_tag, pipe)
        held = orphans.held_key()
        return queued if held is None else queued.srem(held, delivery_tag)

    return remove
