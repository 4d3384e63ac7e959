"""What toolexec's worker transport and consumer rely on in kombu and Celery, pinned.

``toolexec.transport`` subclasses kombu's Redis ``Channel``/``QoS`` and
``toolexec.worker.consumer`` Celery's ``Consumer``; the overridden methods are private
and have changed between releases (``_brpop_start``/``_brpop_read`` twice in
18 months). Each test here fails when a behaviour the subclasses need moves,
so an upgrade fails in CI, not in production; a worker also refuses to start
outside the release range these tests cover (``toolexec.transport.TESTED``).
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Iterator
from typing import Any

import celery
import kombu
import pytest
from celery.worker import state as worker_state
from celery.worker import strategy
from celery.worker.consumer.consumer import Consumer as CeleryConsumer
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as virtual

from toolexec.transport import Channel, QoS, Transport, check_versions, version_problem
from toolexec.transport import kombu_redis as transport

WORKER_TRANSPORT = "toolexec.transport:Transport"


def _params(function: Any) -> list[str]:
    return [str(p) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(
    ("owner", "name", "params"),
    [
        (kombu_redis.Channel, "_brpop_start", ["self", "timeout=None"]),
        (kombu_redis.Channel, "_brpop_read", ["self", "**options"]),
        (kombu_redis.Channel, "_connparams", ["self", "asynchronous=False"]),
        (kombu_redis.Channel, "_create_client", ["self", "asynchronous=False"]),
        (kombu_redis.QoS, "append", ["self", "message", "delivery_tag"]),
        (kombu_redis.QoS, "_remove_from_indices", ["self", "delivery_tag", "pipe=None"]),
        (kombu_redis.QoS, "restore_by_tag", ["self", "tag", "client=None", "leftmost=False"]),
        (kombu_redis.QoS, "reject", ["self", "delivery_tag", "requeue=False"]),
        (virtual.Transport, "_deliver", ["self", "message", "queue"]),
        (virtual.QoS, "append", ["self", "message", "delivery_tag"]),
        (CeleryConsumer, "on_unknown_message", ["self", "body", "message"]),
        (CeleryConsumer, "on_unknown_task", ["self", "body", "message", "exc"]),
        (CeleryConsumer, "on_invalid_task", ["self", "body", "message", "exc"]),
        (CeleryConsumer, "on_decode_error", ["self", "message", "exc"]),
        (CeleryConsumer, "ensure_connected", ["self", "conn"]),
    ],
)
def test_every_overridden_method_keeps_its_signature(
    owner: Any, name: str, params: list[str]
) -> None:
    assert _params(getattr(owner, name)) == params


def test_celerys_task_handler_is_built_by_create_task_handler_from_the_strategies() -> None:
    source = inspect.getsource(CeleryConsumer.create_task_handler)
    assert _params(CeleryConsumer.create_task_handler)[0] == "self"
    assert "strategies = self.strategies" in source
    assert "message.headers['task']" in source
    assert "def on_task_received(message)" in source


def test_kombus_brpop_read_does_the_steps_toolexecs_read_repeats() -> None:
    """``toolexec.transport.inbox.read`` stands for ``_brpop_read`` whole: the same steps, in
    order."""
    source = inspect.getsource(kombu_redis.Channel._brpop_read)
    steps = [
        "self.client.parse_response(self.client.connection",
        "self.client.connection.disconnect()",
        "bytes_to_str(dest).rsplit(self.sep, 1)[0]",
        "self._queue_cycle.rotate(dest)",
        "self.connection._deliver(loads(bytes_to_str(item)), dest)",
        "raise Empty()",
        "self._in_poll = None",
        "self._flush_brpop_reauth()",
    ]
    assert [source.find(s) >= 0 for s in steps] == [True] * len(steps)
    assert sorted(steps, key=source.find) == steps


def test_kombus_brpop_start_marks_the_wait_as_toolexecs_move_does() -> None:
    source = inspect.getsource(kombu_redis.Channel._brpop_start)
    for needed in ("self._in_poll = self.client.connection", "self._brpop_sent_at", "BRPOP"):
        assert needed in source


def test_kombu_builds_a_client_per_command_through_create_client_and_drops_pools_whole() -> None:
    """Where the channel's kept client fits in: every command outside the polling connection
    asks ``_create_client()``, and a reconnect or a fork replaces ``_pool`` itself."""
    acquire = inspect.getsource(kombu_redis.Channel.conn_or_acquire)
    assert "yield self._create_client()" in acquire
    assert "self._async_pool = self._pool = None" in inspect.getsource(
        kombu_redis.Channel._disconnect_pools
    )
    assert "_create_client(asynchronous=True)" in inspect.getsource(kombu_redis.Channel.client.func)


def test_the_worker_channel_keeps_one_client_per_pool(redis_url: str) -> None:
    """kombu's channel builds a client for each command; the worker's keeps one while its
    pool lives, and builds a new one on the new pool after the old is dropped."""
    with Connection(redis_url) as conn:
        stock = conn.default_channel
        with stock.conn_or_acquire() as first, stock.conn_or_acquire() as second:
            assert first is not second  # kombu as shipped: what the override saves
    with Connection(redis_url, transport=WORKER_TRANSPORT) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second and first.connection_pool is channel.pool
            assert first.ping()
        channel._disconnect_pools()
        with channel.conn_or_acquire() as after:
            assert after is not first and after.connection_pool is channel.pool
            assert after.ping()
        assert channel.client is not after  # the polling client stays kombu's own


def test_the_virtual_message_reads_the_envelope_fields_the_envelope_check_covers() -> None:
    source = inspect.getsource(virtual.Message.__init__)
    for field in ("payload['properties']", "properties['delivery_tag']", "'body_encoding'"):
        assert field in source
    assert set(kombu_redis.Channel.codecs) == {"base64"}


def test_celery_counts_scheduled_requests_where_the_guard_reads_them() -> None:
    assert hasattr(worker_state, "scheduled_requests")
    assert "task_scheduled(req)" in inspect.getsource(strategy.default)


def test_the_subclasses_are_kombus_own_with_only_the_overrides() -> None:
    assert issubclass(Transport, kombu_redis.Transport)
    assert Transport.Channel is Channel and Channel.QoS is QoS
    assert Transport.driver_type == "redis"
    overrides = {"_connparams", "_create_client", "_brpop_start", "_brpop_read"}
    assert set(vars(transport._ChannelChanges)) >= overrides
    assert {"append", "_remove_from_indices"} <= set(vars(QoS))


def test_an_explicit_transport_wins_over_the_url_scheme(redis_url: str) -> None:
    """How a worker selects it: Celery passes ``broker_transport`` as kombu's ``transport``."""
    with Connection(redis_url, transport=WORKER_TRANSPORT) as conn:
        assert conn.transport_cls == WORKER_TRANSPORT
        assert isinstance(conn.default_channel, Channel)
    with Connection(redis_url) as conn:
        assert type(conn.default_channel) is kombu_redis.Channel


@pytest.fixture
def queue() -> Iterator[str]:
    yield f"t-contract-{uuid.uuid4().hex[:8]}"


def _taken_record(url: str, queue: str, chosen: str | None) -> list[Any]:
    """Publish, take without acking, and read back kombu's unacked record of the message."""
    options = {"priority_steps": [0]}
    with Connection(url, transport=chosen, transport_options=options) as conn:
        conn.SimpleQueue(queue).put({"n": 1})
        got: list[Any] = []
        with conn.Consumer(Queue(queue), callbacks=[lambda body, m: got.append(m)]):
            conn.drain_events(timeout=5)
        channel = conn.default_channel
        raw = channel.client.hget(channel.unacked_key, got[0].delivery_tag)
        got[0].ack()
        record: list[Any] = json.loads(raw)
        return record


def test_the_unacked_record_has_the_layout_kombus_restore_reads(redis_url: str, queue: str) -> None:
    """toolexec's QoS writes the record itself (one round trip with the held set): it must be
    what kombu's own append writes, [raw message, exchange, routing key]."""
    theirs = _taken_record(redis_url, queue, None)
    ours = _taken_record(redis_url, queue + "-ours", WORKER_TRANSPORT)

    assert len(theirs) == len(ours) == 3
    assert sorted(theirs[0]) == sorted(ours[0])
    assert sorted(theirs[0]["properties"]) == sorted(ours[0]["properties"])
    assert theirs[1:] == [queue, queue] and ours[1:] == [queue + "-ours", queue + "-ours"]


@pytest.mark.parametrize(
    ("installed", "refused"),
    [
        ({"kombu": kombu.__version__, "celery": celery.__version__}, False),
        ({"kombu": "5.8.0", "celery": "5.7.0"}, True),
        ({"kombu": "5.7.0", "celery": "5.6.2"}, True),
        ({"kombu": "6.0.0b1", "celery": "5.7.1"}, True),
    ],
)
def test_a_worker_refuses_an_untested_kombu_or_celery(
    installed: dict[str, str], refused: bool
) -> None:
    problem = version_problem(installed)
    assert (problem is not None) is refused
    if problem is not None:
        assert "TOOLEXEC_ALLOW_UNTESTED_KOMBU=1" in problem and "tested" in problem


def test_the_installed_versions_pass_the_gate_and_the_override_is_explicit() -> None:
    check_versions({})  # the installed kombu and Celery are the tested ones
    assert version_problem({"kombu": "9.9.9", "celery": celery.__version__}) is not None
