"""A consumer's held messages, noted beside kombu's own record, go back when it dies.

These run kombu against the suite's real Redis as a broker (no worker): the
message a "dead" consumer took stays in kombu's unacked hash, and another
watcher restores it with kombu's own restore, which also proves that the
patched record is in the layout kombu reads back. ``tests/chaos`` kills a real
worker for the same thing end to end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_support import cluster_run
from kombu import Connection, Queue
from rigs.chaos import wait_until

from toolexec.clock import ManualClock
from toolexec.keys import BrokerKeys
from toolexec.transport import orphans

#: What a worker selects for a Redis broker (toolexec.worker.app): these tests consume as one.
WORKER_TRANSPORT = "toolexec.transport:Transport"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(cluster_run(), reason="a Redis Cluster cannot be a kombu broker"),
]


@pytest.fixture
def broker(redis_url: str) -> Iterator[Connection]:
    conn = Connection(redis_url, transport=WORKER_TRANSPORT)
    yield conn
    orphans.deactivate()
    conn.release()


@pytest.fixture
def keys(broker: Connection) -> Iterator[BrokerKeys]:
    """Keys of this test's own: the suite's workers watch the default ones."""
    made = BrokerKeys(prefix=f"t-orphans-{uuid.uuid4().hex[:8]}")
    yield made
    client = broker.default_channel.client
    leftovers = list(client.scan_iter(f"{made.prefix}:*"))
    if leftovers:
        client.delete(*leftovers)


def _watch(broker: Connection, keys: BrokerKeys, consumer: str, **kw: Any) -> orphans.OrphanWatch:
    def connect() -> Any:
        return broker.clone().default_channel

    return orphans.OrphanWatch(connect, keys, consumer, visibility_timeout=3600, **kw)


def _restored_by_another(broker: Connection, keys: BrokerKeys, dead: str) -> int:
    """Another worker's watch, once ``dead``'s alive key has expired: what it restored."""
    client = broker.default_channel.client
    clock = ManualClock(1000.0)
    other = _watch(broker, keys, "other", clock=clock, alive_ttl_s=0.3)
    assert other.tick() == 0  # just connected: nobody is judged yet
    assert wait_until(lambda: not client.exists(keys.alive(dead)), 10)
    clock.advance(1.0)
    return other.tick()


def _take(broker: Connection, queue: str) -> Any:
    """Take one message and keep it unacknowledged, as a worker does while it runs a call."""
    message = broker.SimpleQueue(queue, no_ack=False).get(timeout=5)
    assert message is not None
    return message


def test_a_dead_consumers_message_is_back_in_its_queue(
    broker: Connection, keys: BrokerKeys
) -> None:
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"call": 1})
    dead = orphans.activate(keys)
    # its own watch beats once, with a TTL short enough to watch it expire
    _watch(broker, keys, dead, alive_ttl_s=0.3).tick()
    taken = _take(broker, queue)
    client = broker.default_channel.client
    assert client.sismember(keys.held(dead), taken.delivery_tag)
    orphans.deactivate()  # the consumer "dies": nobody beats or acks for it any more

    assert _restored_by_another(broker, keys, dead) == 1
    again = broker.clone().SimpleQueue(queue, no_ack=False).get(timeout=5)
    assert again.payload == {"call": 1}
    assert again.delivery_info.get("redelivered") or again.headers.get("redelivered")
    again.ack()
    assert not client.exists(keys.held(dead))
    assert not client.sismember(keys.consumers(), dead)


def test_an_acknowledged_message_leaves_nothing_to_restore(
    broker: Connection, keys: BrokerKeys
) -> None:
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"call": 2})
    me = orphans.activate(keys)
    taken = _take(broker, queue)
    client = broker.default_channel.client
    assert client.sismember(keys.held(me), taken.delivery_tag)

    taken.ack()

    assert not client.sismember(keys.held(me), taken.delivery_tag)


def test_a_beating_consumers_messages_stay_with_it(broker: Connection, keys: BrokerKeys) -> None:
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"call": 3})
    alive = orphans.activate(keys)
    own = _watch(broker, keys, alive)
    own.tick()
    taken = _take(broker, queue)
    clock = ManualClock(1000.0)
    other = _watch(broker, keys, "other", clock=clock)
    other.tick()
    clock.advance(60.0)

    assert other.tick() == 0
    client = broker.default_channel.client
    assert client.hexists(broker.default_channel.unacked_key, taken.delivery_tag)
    assert client.sismember(keys.held(alive), taken.delivery_tag)
    taken.ack()


def _one_list(broker: Connection) -> Connection:
    """A connection whose queues are one list each, as toolexec configures its broker."""
    return broker.clone(transport_options={"priority_steps": [0]})


def test_a_message_is_moved_into_the_inbox_and_out_by_its_record(
    broker: Connection, keys: BrokerKeys
) -> None:
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"call": 4})
    me = orphans.activate(keys)
    conn = _one_list(broker)
    got: list[Any] = []
    with conn.Consumer(Queue(queue), callbacks=[lambda body, message: got.append(message)]):
        conn.drain_events(timeout=5)
    client = broker.default_channel.client

    assert [m.payload for m in got] == [{"call": 4}]
    assert conn.default_channel.__dict__["_toolexec_taking"][0] == queue  # BLMOVE, not BRPOP
    assert client.llen(keys.inbox(me, queue)) == 0
    assert client.sismember(keys.held(me), got[0].delivery_tag)
    got[0].ack()
    assert not client.sismember(keys.held(me), got[0].delivery_tag)
    conn.release()


def test_a_no_ack_consumer_reads_a_message_once_and_leaves_no_inbox_entry(
    broker: Connection, keys: BrokerKeys
) -> None:
    """Celery's reply queues are consumed without acknowledgement (mingle's ``hello``).

    A reply pushed back after delivery was read again on every drain, so the
    worker's mingle step never ended when a neighbour answered.
    """
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"reply": 1})
    me = orphans.activate(keys)
    conn = _one_list(broker)
    got: list[Any] = []
    with conn.Consumer(
        Queue(queue), no_ack=True, callbacks=[lambda body, message: got.append(body)]
    ):
        conn.drain_events(timeout=5)
        with pytest.raises(TimeoutError):  # socket.timeout: nothing more to read
            conn.drain_events(timeout=0.5)
    client = broker.default_channel.client

    assert got == [{"reply": 1}]
    assert conn.default_channel.__dict__["_toolexec_taking"][0] == queue  # BLMOVE, not BRPOP
    assert client.llen(queue) == 0
    assert client.llen(keys.inbox(me, queue)) == 0
    conn.release()


def test_a_message_moved_but_never_recorded_goes_back_when_its_taker_dies(
    broker: Connection, keys: BrokerKeys
) -> None:
    """The window a SIGKILL used to lose a call in: taken from the queue, not yet recorded."""
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"call": 5})
    dead = orphans.activate(keys)
    _watch(broker, keys, dead, alive_ttl_s=0.3).tick()
    conn = _one_list(broker)
    channel = conn.channel()
    channel.basic_consume(queue, no_ack=False, callback=lambda message: None, consumer_tag="t")
    # what kombu's poller does before it waits: a connection of the wait's own
    channel.client.connection = channel.client.connection_pool.get_connection()
    channel._brpop_start(timeout=1)  # the wait is sent; its reply is never read
    client = broker.default_channel.client
    assert wait_until(lambda: client.llen(keys.inbox(dead, queue)) == 1, 10)
    assert client.llen(queue) == 0
    # the taker dies: its socket closes with the reply unread, and nothing runs after
    channel.client.connection.disconnect()
    orphans.deactivate()

    assert _restored_by_another(broker, keys, dead) == 1
    again = broker.clone().SimpleQueue(queue, no_ack=False).get(timeout=5)
    assert again.payload == {"call": 5}
    again.ack()
    assert client.llen(keys.inbox(dead, queue)) == 0


def test_a_take_whose_reply_a_broken_connection_lost_is_back_before_the_next_wait(
    broker: Connection, keys: BrokerKeys
) -> None:
    """Redis killed after it moved a message into a live consumer's inbox, before the reply.

    The consumer keeps beating, so no watcher restores its inbox: without the
    hand-back the call waited out its deadline (the lanes' chaos test lost one so).
    """
    queue = f"t-orphans-{uuid.uuid4().hex[:8]}"
    broker.SimpleQueue(queue).put({"call": 6})
    me = orphans.activate(keys)
    channel = _one_list(broker).channel()
    got: list[Any] = []
    channel.basic_consume(queue, no_ack=False, callback=got.append, consumer_tag="t")
    channel.client.connection = channel.client.connection_pool.get_connection()
    channel._brpop_start(timeout=1)
    client = broker.default_channel.client
    assert wait_until(lambda: client.llen(keys.inbox(me, queue)) == 1, 10)
    # the connection breaks with the move's reply unread (its socket gone under redis-py)
    channel.client.connection._sock.close()
    with pytest.raises(channel.connection_errors):
        channel._brpop_read()
    assert client.llen(keys.inbox(me, queue)) == 1  # the consumer lives: no watcher takes it

    # kombu's poller waits again on a fresh connection
    channel.client.connection = channel.client.connection_pool.get_connection()
    channel._brpop_start(timeout=1)
    assert channel._brpop_read()

    assert [m.payload for m in got] == [{"call": 6}]
    assert client.llen(keys.inbox(me, queue)) == 0
    assert client.llen(queue) == 0
    got[0].ack()
