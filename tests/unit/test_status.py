"""Pieces of ``toolexec status``: queue names, broker depths, observers that never fail calls."""

from __future__ import annotations

import logging
import uuid

import pytest
from kombu import Exchange, Queue
from kombu.connection import Connection
from prometheus_client import CollectorRegistry

from toolexec.clock import ManualClock
from toolexec.connection import fail_fast_client, redis_client
from toolexec.context import CallContext
from toolexec.keys import Keys, bucket_of
from toolexec.ops.metrics import Metrics
from toolexec.ops.status import amqp_depths, queue_names, redis_depths
from toolexec.pipeline.observe import LEASE_GRACE_S, CallObservers
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.stores.stats import CallStats

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


def test_queue_names_are_the_tools_queues_and_the_default_one() -> None:
    catalog = {
        "a": {"policy": {"queue": "slow"}},
        "b": {"policy": {"queue": None}},
        "c": {"policy": {"queue": "slow"}},
    }

    assert queue_names(catalog, "tools") == ["slow", "tools"]


def _publish(url: str, queue: str, priorities: list[int | None]) -> None:
    exchange = Exchange(queue, type="direct")
    declared = Queue(queue, exchange, routing_key=queue, max_priority=10)
    # With publisher confirms each publish returns once RabbitMQ has the message, so the
    # count that follows cannot race messages still in flight (Redis ignores the option).
    with Connection(url, transport_options={"confirm_publish": True}) as conn:  # type: ignore[no-untyped-call]
        producer = conn.Producer()
        for priority in priorities:
            producer.publish(
                {"n": 1},
                exchange=exchange,
                routing_key=queue,
                declare=[declared],
                serializer="json",
                priority=priority,
            )


def test_redis_depths_add_up_kombus_priority_sub_queues(redis_url: str) -> None:
    """Messages published with priorities land in sub-lists kombu names; all of them count."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    _publish(redis_url, queue, [None, 0, 5, 9, 9])
    client = redis_client(redis_url)
    try:
        assert redis_depths(client, [queue, "never-used"]) == {queue: 5, "never-used": 0}
    finally:
        client.close()


def _rabbitmq_up() -> bool:
    try:
        with Connection(RABBITMQ, connect_timeout=1) as conn:  # type: ignore[no-untyped-call]
            conn.connect()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _rabbitmq_up(), reason="no RabbitMQ at 127.0.0.1:5672")
def test_amqp_depths_use_a_passive_declare_and_say_none_for_a_missing_queue() -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    _publish(RABBITMQ, queue, [None, None, None])
    try:
        assert amqp_depths(RABBITMQ, [queue, f"missing-{queue}"]) == {
            queue: 3,
            f"missing-{queue}": None,
        }
    finally:
        with Connection(RABBITMQ) as conn:  # type: ignore[no-untyped-call]
            conn.default_channel.queue_delete(queue)


def _spec(registry: Registry) -> ToolSpec:
    @tool(timeout=5, registry=registry)
    def lookup() -> None: ...

    spec = registry.get("lookup")
    assert spec is not None
    return spec


def _ctx(deadline: float) -> CallContext:
    return CallContext(
        call_id="c1", tool="lookup", deadline=deadline, submitted_at=deadline - 100, reply_to="r1"
    )


def test_an_attempt_is_leased_for_its_time_limit_plus_a_grace(
    redis_url: str, registry: Registry
) -> None:
    """A 5 s tool with 100 s left: the lease ends 5 s + grace after the start, not at deadline."""
    clock = ManualClock(1_700_000_000.0)
    keys = Keys(f"t-{uuid.uuid4().hex[:10]}")
    client = redis_client(redis_url)
    observers = CallObservers(
        CallStats(client, keys, clock=clock), [Metrics(CollectorRegistry())], clock
    )
    ctx = _ctx(clock.now() + 100)

    observers.started(_spec(registry), ctx, 1)

    try:
        ((_, lease),) = client.zrange(
            keys.in_flight(bucket_of(ctx.call_id)), 0, -1, withscores=True
        )
    finally:
        client.close()
    assert lease == clock.now() + 5 + LEASE_GRACE_S


def test_counters_that_cannot_be_written_never_fail_the_call(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis is away: the hooks return, Prometheus still counts, one warning is logged."""
    spec = _spec(registry)
    metrics = Metrics(CollectorRegistry())
    dead = CallStats(fail_fast_client("redis://127.0.0.1:1/0"), Keys("gone"))
    observers = CallObservers(dead, [metrics], ManualClock())
    ctx = _ctx(ManualClock().now() + 100)

    with caplog.at_level(logging.WARNING, logger="toolexec.worker"):
        observers.started(spec, ctx, 1)
        observers.retrying(spec, ctx, 1, "timeout")

    assert metrics.registry.get_sample_value("toolexec_attempts_total", {"tool": "lookup"}) == 1
    assert len([r for r in caplog.records if "not recorded" in r.message]) == 1
