"""toolexec's Redis transport for workers: kombu's, subclassed, so that a worker survives
Redis flapping, loses no message it took, and survives whatever is pushed onto its queues.

Workers select it (``broker_transport``, set when a worker starts: :mod:`toolexec.worker.app`);
every other process, an agent calling tools among them, runs kombu as kombu
ships it. Nothing here replaces an attribute of kombu's classes. The kombu
behaviours these subclasses rely on are pinned by
``tests/unit/test_kombu_contract.py``, and a worker refuses to start on a
kombu or Celery outside the tested range (:func:`check_versions`).

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

The first override keeps what the channel was connected with when it first built a pool
and lends it back to a transport that lost it, so the restore and the acks
of the old channel reach the same Redis as before (or fail with a connection
error, which every caller already handles). ``bench/chaos.py`` (scenario
``redis-flaps``) and ``tests/chaos`` measure it: without it the
worker exits on the first or second burst of restarts.

A second one closes a window in which a call was lost. kombu takes a
message off its queue with ``BRPOP`` and only then records it as unacknowledged
(``QoS.append``, one more round trip); when Redis goes away between the two,
that write raises, the message, already off the queue, is dropped, and its
caller waits until its deadline (measured: about one call per Redis flap
under load). ``QoS.append`` retries the write through the blip for a
few seconds and, if Redis stays away, keeps the message anyway: it runs, only
without the record that would hand it on if this worker died too.

A third makes the same round trip note the message in this consumer's
held set, and the acknowledgement's remove it (:mod:`toolexec.transport.orphans`), so
that a killed worker's messages go back to their queues within seconds.

A fourth is for speed: kombu builds a new redis-py client for every command it
sends outside the polling connection (``conn_or_acquire``: each record, each
ack, each task event), and building one costs redis-py 8 a table of about 170
response callbacks, 50-90 µs; at about three a call that was the largest part
of the worker's CPU per call beyond plain Celery's (a profile with yappi:
``docs/performance.md``). The channel keeps one per connection pool instead:
a redis-py client is safe to share between threads (every command borrows a
connection from the pool), and a new pool (after a reconnect or a fork) gets a
new client.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import celery
import kombu
import redis
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as virtual
from kombu.utils.json import dumps

from toolexec.connection import BLIPS, through_blips
from toolexec.transport import inbox, lanes, orphans

__all__ = [
    "ALLOW_UNTESTED",
    "TESTED",
    "Channel",
    "QoS",
    "SentinelChannel",
    "SentinelTransport",
    "Transport",
    "check_versions",
    "transport_for",
    "version_problem",
]

log = logging.getLogger("toolexec.worker")

_SAVED = "_toolexec_conninfo"
_CLIENT = "_toolexec_client"

#: How long the consumer loop retries recording a message it took: it has nothing
#: else to do while its Redis is away, and the message is already off the queue.
UNACKED_WRITE_S = 5.0

#: The releases the contract tests cover, per library: (first, first not covered).
TESTED = {"kombu": ((5, 7), (5, 8)), "celery": ((5, 7), (5, 8))}

#: Set to 1 to start a worker on an untested kombu or Celery anyway.
ALLOW_UNTESTED = "TOOLEXEC_ALLOW_UNTESTED_KOMBU"


def _release(version: str) -> tuple[int, int]:
    major, minor = (int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2])
    return major, minor


def version_problem(installed: dict[str, str]) -> str | None:
    """Why these library versions are outside what the contract tests cover, or None."""
    for name, version in installed.items():
        low, high = TESTED[name]
        if not low <= _release(version) < high:
            return (
                f"{name} {version} is installed, but toolexec's worker transport is tested "
                f"with {name} {low[0]}.{low[1]} up to (not including) {high[0]}.{high[1]}: it "
                f"subclasses kombu's Redis channel and Celery's consumer, whose private "
                f"methods change between releases. Install a tested release, or set "
                f"{ALLOW_UNTESTED}=1 to start anyway (run tests/unit/test_kombu_contract.py "
                f"first)."
            )
    return None


def check_versions(environ: dict[str, str] | None = None) -> None:
    """Refuse to start a worker on an untested kombu/Celery, unless told to."""
    problem = version_problem({"kombu": kombu.__version__, "celery": celery.__version__})
    if problem is None:
        return
    if (environ if environ is not None else os.environ).get(ALLOW_UNTESTED, "").strip() == "1":
        log.warning("%s (starting anyway: %s=1)", problem, ALLOW_UNTESTED)
        return
    raise SystemExit(problem)


def transport_for(broker_url: str) -> str | None:
    """The transport a worker selects for ``broker_url``: toolexec's for Redis, else kombu's."""
    scheme = broker_url.partition("://")[0].lower()
    if scheme in ("redis", "rediss", "socket"):
        return "toolexec.transport:Transport"
    if scheme == "sentinel":
        return "toolexec.transport:SentinelTransport"
    return None


class QoS(kombu_redis.QoS):
    """kombu's QoS, recording a taken message in one round trip with the consumer's held set."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        taken = inbox.take_pending()  # once: every try of the record must empty the inbox
        try:
            through_blips(lambda: self._record(message, delivery_tag, taken), UNACKED_WRITE_S)
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

    def _record(self, message: Any, delivery_tag: Any, taken: tuple[str, bytes] | None) -> None:
        """kombu's unacked record of a taken message, plus this consumer's held set.

        The record's layout is the one kombu's ``restore_by_tag`` reads back (the
        raw message, its exchange and routing key); the contract tests compare it
        with what kombu's own ``append`` writes.
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
            if taken is not None:  # out of the inbox it was moved into (toolexec.transport.inbox)
                pipe.lrem(taken[0], 1, taken[1])
            pipe.execute()
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        """Whatever removes a tag from kombu's unacked record removes it from the held set.

        And, for a call of a fairness key with ``max_in_flight``, from the key's calls
        in flight (:mod:`toolexec.transport.lanes`), so its parked lane is taken again.
        """
        queued = super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[no-untyped-call]
        capped, keys = lanes.release(str(delivery_tag)), orphans.broker_keys()
        if capped and keys is not None:  # a call of a capped key or tool ended
            for counted in capped:
                queued = queued.zrem(keys.fair_inflight_prefix() + counted, delivery_tag)
        held = orphans.held_key()
        return queued if held is None else queued.srem(held, delivery_tag)


class _ChannelChanges:
    """What toolexec changes in kombu's Redis channel; mixed into its two channel classes."""

    QoS = QoS

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection  # type: ignore[attr-defined]
        if transport.client is not None:
            self.__dict__[_SAVED] = transport.client
        elif _SAVED in self.__dict__:
            # the connection was collected; only this old channel still uses the transport
            transport.client = self.__dict__[_SAVED]
        else:
            raise redis.ConnectionError("the broker connection was already closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[misc, no-any-return]

    def _create_client(self, asynchronous: bool = False) -> Any:
        """The channel's one client for its current pool (kombu builds one per command)."""
        if asynchronous:  # the polling client, which kombu already keeps (``client``)
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool, kept = self.pool, self.__dict__.get(_CLIENT)  # type: ignore[attr-defined]
        if kept is None or kept.connection_pool is not pool:
            kept = self.__dict__[_CLIENT] = super()._create_client()  # type: ignore[misc]
        return kept

    def _brpop_start(self, timeout: Any = None) -> None:
        inbox.start(self, timeout, super()._brpop_start)  # type: ignore[misc]

    def _brpop_read(self, **options: Any) -> bool:
        return inbox.read(self, options)


class Channel(_ChannelChanges, kombu_redis.Channel):
    """kombu's Redis channel with toolexec's changes (see the module docstring)."""


class SentinelChannel(_ChannelChanges, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel with the same changes."""


class Transport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`Channel`; what workers select for a Redis broker."""

    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport on :class:`SentinelChannel`."""

    Channel = SentinelChannel
