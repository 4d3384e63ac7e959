"""A consumer takes a message by moving it into its own inbox, not by popping it.

kombu's Redis transport waits for messages with ``BRPOP`` and records what it
took (``QoS.append``) in a second round trip. Between the two, the message
exists only in the worker's socket buffer: a SIGKILL there loses it for good
(not even the visibility timeout brings it back, since it was never recorded).
Under load the gap is not a few microseconds: the event loop may be busy with
acknowledgements while Redis has already popped the next message. The chaos
tests lost one call in about fourteen worker kills that way, after
:mod:`toolexec.transport.orphans` had closed every other gap.

Here, when a channel consumes exactly one list, its wait is ``BLMOVE queue
inbox``: the message is never out of Redis. The append that records it
(:class:`toolexec.transport.QoS`) removes it from the inbox in the same
MULTI/EXEC, so a message is always in the queue, the inbox, or kombu's unacked
record, and the orphan watch moves a dead consumer's inbox back to its queue.

Where it does not apply, kombu's ``BRPOP`` runs unchanged: a channel consuming
several queues (no Redis command moves from the first non-empty of several
lists), a broker with a ``global_keyprefix`` (kombu's prefixing client does not
know ``BLMOVE``), a server older than Redis 6.2, or a process without an orphan
watch (nobody would empty its inbox). toolexec sets ``priority_steps`` to one
step (:mod:`toolexec.worker.app`) so that a queue is one list.

Both waits end in the same read, which checks what Redis handed over before
kombu sees it: bytes that are not a JSON envelope, or an envelope of a shape
kombu's channel would raise on (``{}``, a list ``delivery_tag``, an unknown
``body_encoding``, ...), stopped the consumer with the message back at the
head of its queue, so every worker that took it stopped too. Such an item is
refused (:func:`set_refusal_sink`: dead-lettered with a reason, logged once by
queue and short hash, never its body) and never goes back to the queue.

A take whose reply a broken connection lost (Redis killed after it moved the
message and wrote its AOF, before the reply reached the worker) leaves the
message in the inbox of a consumer that is alive: the orphan watch never
judges it dead, and the call waited out its deadline (the lanes' chaos test,
one call in a clean-clone run). So a read that meets a connection error notes
its inbox, and the consumer's next wait first moves what that inbox holds back
to the head of its queue. Nothing there is the consumer's own any more: a take
is recorded (and so removed from the inbox) or put back before the next wait.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from queue import Empty
from time import monotonic
from typing import Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.exceptions import NoScriptError

from toolexec.pipeline.poison import envelope_problem, short_hash
from toolexec.transport import lanes, orphans
from toolexec.worker.logs import oneline

__all__ = ["Refusal", "read", "set_refusal_sink", "start", "take_pending"]

log = logging.getLogger("toolexec.worker")

#: What records a refused item (queue, raw item, reason, headers if any); set by the
#: worker's message guard, which writes dead letters where the other refusals go.
Refusal = Callable[[str, bytes, str, Any], None]

_sink: list[Refusal] = []

_SERVER_OK = "_toolexec_blmove_ok"
_TAKING = "_toolexec_taking"

#: What the consumer thread took but has not recorded yet: (inbox, raw item).
#: Delivery runs on the thread that read the message, and kombu may record it on
#: another channel than the one that read it, hence a thread-local, not the channel.
_taken = threading.local()

#: Inboxes a take's reply was lost for, (queue, inbox): emptied before the next wait.
_unread: set[tuple[str, str]] = set()
_unread_lock = threading.Lock()


def set_refusal_sink(sink: Refusal | None) -> None:
    """Where refused items are recorded from now on (None: only logged)."""
    _sink[:] = [] if sink is None else [sink]


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


def start(channel: Any, timeout: Any, brpop_start: Callable[[Any], Any]) -> None:
    """Send the channel's wait: ``BLMOVE`` into its inbox when it can, else kombu's ``BRPOP``."""
    queue = _single_list(channel)
    inbox = None if queue is None else orphans.inbox_key(queue)
    if queue is None or inbox is None:
        channel.__dict__[_TAKING] = None
        brpop_start(timeout)
        return
    orphans.announce_inbox(channel.client, queue)
    _hand_back_unread(channel)
    keys = orphans.broker_keys()
    state = lanes.state_of(channel)
    now = monotonic()
    channel._in_poll = channel.client.connection
    channel._brpop_sent_at = now
    if keys is not None and lanes.use_script(state, now):
        channel.__dict__[_TAKING] = (queue, inbox, True)
        lanes.send_take(channel, keys, queue, inbox, now)
        return
    channel.__dict__[_TAKING] = (queue, inbox, False)
    wait = lanes.wait_s(state, channel.brpop_timeout if timeout is None else timeout)
    channel.client.connection.send_command("BLMOVE", queue, inbox, "RIGHT", "LEFT", wait or 0)


def read(channel: Any, options: dict[str, Any]) -> bool:
    """kombu's read of a ``BRPOP`` or ``BLMOVE`` reply, with the item checked before delivery.

    It stands for kombu's ``_brpop_read`` whole: the parse, the rotation and the
    re-auth flush are kombu's steps (pinned by ``tests/unit/test_kombu_contract.py``).
    """
    taking = channel.__dict__.get(_TAKING)
    try:
        if taking is None:
            reply = _parse(channel, "BRPOP", options)
            if not reply:
                raise Empty()
            dest, item = reply
            name = bytes_to_str(dest)  # type: ignore[no-untyped-call]
            queue, inbox = name.rsplit(channel.sep, 1)[0], None
        else:
            queue, inbox, scripted = taking
            item = _take(channel, queue, inbox, scripted, options)
        channel._queue_cycle.rotate(queue)
        _deliver(channel, queue, inbox, item)
        return True
    except channel.connection_errors:
        if taking is not None:  # the take may have moved a message its reply never brought
            with _unread_lock:
                _unread.add((taking[0], taking[1]))
        raise
    finally:
        channel._in_poll = None
        channel._flush_brpop_reauth()


def _hand_back_unread(channel: Any) -> None:
    """Move what lost takes left in their inboxes back to the heads of their queues.

    Still away (the broker is restarting): the inboxes stay noted and the error
    goes to kombu, as the wait's own send would have raised it.
    """
    if not _unread:
        return
    with _unread_lock:
        pending = sorted(_unread)
        _unread.clear()
    moved = 0
    try:
        for queue, inbox in pending:
            while channel.client.lmove(inbox, queue, "LEFT", "RIGHT") is not None:
                moved += 1
    except channel.connection_errors:
        with _unread_lock:
            _unread.update(pending)
        raise
    if moved:
        log.warning(
            "%d message(s) a broken connection took without delivering are back in their queue",
            moved,
        )


def _take(channel: Any, queue: str, inbox: str, scripted: bool, options: dict[str, Any]) -> bytes:
    """The message a ``BLMOVE`` or a lane take moved into the inbox
    (:mod:`toolexec.transport.lanes`)."""
    keys = orphans.broker_keys()
    if scripted:
        try:
            item = lanes.parse_take(channel, _parse(channel, "EVALSHA", options), monotonic())
        except NoScriptError:  # a restarted Redis forgot it: load it, take next round
            lanes.load(channel)
            raise Empty() from None
    else:
        item = _parse(channel, "BLMOVE", options)
        if item and keys is not None and lanes.has_lane(item):
            item = lanes.swap(channel, keys, queue, inbox, item, monotonic())
    if not item:
        raise Empty()
    return bytes(item)


def _parse(channel: Any, command: str, options: dict[str, Any]) -> Any:
    try:
        return channel.client.parse_response(channel.client.connection, command, **options)
    except channel.connection_errors:
        channel.client.connection.disconnect()  # as kombu does: reconnect next round
        raise


def _decode(item: bytes) -> tuple[Any, str | None]:
    """The envelope in ``item`` and why it cannot be delivered (None: it can)."""
    try:
        payload = loads(bytes_to_str(item))  # type: ignore[no-untyped-call]
    except RecursionError:
        return None, "it is nested too deeply to decode"
    except Exception as exc:  # whatever kombu's decoder raises on foreign bytes
        return None, f"it is not a JSON envelope ({type(exc).__name__})"
    return payload, envelope_problem(payload)


def _deliver(channel: Any, queue: str, inbox: str | None, item: bytes) -> None:
    payload, problem = _decode(item)
    if problem is not None:
        _refuse(channel, queue, inbox, item, problem, payload)
        return
    _taken.item = None if inbox is None else (inbox, item)
    try:
        channel.connection._deliver(payload, queue)
    except channel.connection_errors:
        _put_back(channel, queue)  # a good message that met an outage: where it was
        raise
    except Exception as exc:  # the envelope passed, yet kombu or Celery could not take it
        pending = take_pending()
        if pending is None:  # recorded as unacknowledged (or taken by BRPOP): drop the record
            _reject(channel, payload)
        _refuse(channel, queue, None if pending is None else inbox, item, _failed(exc), payload)
    else:
        _consumed(channel)


def _consumed(channel: Any) -> None:
    """A delivered message that nothing recorded was taken by a ``no_ack`` consumer.

    kombu records every message it hands to an acknowledging consumer, and
    records then requeues one that no consumer wanted
    (``_reject_inbound_message``), so an entry still pending here belongs to a
    consumer that will never acknowledge it: Celery's reply queues (mingle's
    ``hello``, ``inspect``) are such. It is done with; pushing it back made the
    reply consumer read the same reply forever, and the worker hung at
    "mingle: searching for neighbors" whenever a neighbour answered.
    """
    pending = take_pending()
    if pending is not None:
        channel.client.lrem(pending[0], 1, pending[1])


def _put_back(channel: Any, queue: str) -> None:
    """A message moved into the inbox whose delivery met an outage: back to its queue."""
    pending = take_pending()
    if pending is None:
        return
    inbox, item = pending
    pipe = channel.client.pipeline()
    pipe.lrem(inbox, 1, item)
    pipe.rpush(queue, item)
    pipe.execute()


def _failed(exc: BaseException) -> str:
    return f"the worker could not take it ({type(exc).__name__})"


def _reject(channel: Any, payload: Any) -> None:
    """Drop a recorded message from kombu's unacked record, without requeueing it."""
    with contextlib.suppress(Exception):
        channel.qos.reject(payload["properties"]["delivery_tag"], requeue=False)


def _refuse(
    channel: Any, queue: str, inbox: str | None, item: bytes, reason: str, payload: Any
) -> None:
    """Log once, dead-letter, and take the item out of this consumer's inbox for good."""
    headers = payload.get("headers") if isinstance(payload, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    log.error(
        "refused broker message queue=%s sha256=%s id=%s: %s; dead-lettered (body not logged)",
        oneline(queue),
        short_hash(item),
        oneline(task_id),
        reason,
    )
    for sink in _sink:
        try:
            sink(queue, item, reason, headers)
        except Exception as exc:  # the refusal itself must still happen
            log.warning("could not record a dead letter: %s", type(exc).__name__)
    if inbox is not None:
        channel.client.lrem(inbox, 1, item)
