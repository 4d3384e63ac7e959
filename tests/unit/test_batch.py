"""The shared admission and settlement round trips, on a real Redis.

Round trips are counted by a connection class that counts what it sends to
the real server; nothing about Redis is imitated.
"""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.commands.core import Script

from toolexec.breaker import CircuitBreaker
from toolexec.breaker.layer import BreakerLayer
from toolexec.clock import ManualClock
from toolexec.connection import fail_fast_client
from toolexec.context import CallContext
from toolexec.idempotency import IdempotencyLayer, IdempotencyStore
from toolexec.keys import Keys
from toolexec.layers import Attempt, Layer, Outcome, Proceed
from toolexec.layers.batch import Batch
from toolexec.layers.ratelimit import RateLimiter, RateLimitLayer
from toolexec.layers.retry_budget import RetryBudget, RetryBudgetLayer
from toolexec.pipeline.execution import Executor, Final
from toolexec.pipeline.runner import Runner
from toolexec.policies import RateLimitPolicy
from toolexec.registry import Registry, ToolSpec, tool


class Counting(redis.connection.Connection):
    """A real connection that counts its round trips (one send each)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counted(redis_url: str) -> Iterator[tuple[redis.Redis, type[Counting]]]:
    cls = type("CountingHere", (Counting,), {"sends": 0})
    client = redis.Redis(
        connection_pool=redis.ConnectionPool.from_url(redis_url, connection_class=cls)
    )
    yield client, cls
    client.close()


def _ctx(clock: ManualClock, spec: ToolSpec, call_id: str = "c1") -> CallContext:
    return CallContext(
        call_id=call_id,
        tool=spec.name,
        deadline=clock.now() + 60.0,
        submitted_at=clock.now(),
        reply_to=f"reply-{call_id}",
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_commands_of_several_owners_go_in_one_round_trip_each_answered_in_turn(
    counted: tuple[redis.Redis, type[Counting]], keys: Keys
) -> None:
    client, cls = counted
    script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    replies: list[Any] = []
    batch = Batch()
    batch.add(client, lambda pipe: pipe.set(keys.stats(0) + ":1", 5), replies.append)
    batch.script(client, script, [keys.stats(0) + ":1"], [2], replies.append)
    batch.add(
        client,
        lambda pipe: (pipe.incr(keys.stats(0) + ":1"), pipe.get(keys.stats(0) + ":1")),
        replies.append,
    )
    client.script_load(script.script)
    before = cls.sends
    batch.execute()
    batch.execute()  # once only
    assert cls.sends - before == 1
    assert replies == [True, 7, b"8"]


def test_a_script_the_server_lost_is_loaded_and_run_again(
    counted: tuple[redis.Redis, type[Counting]], keys: Keys
) -> None:
    client, _ = counted
    # a source no server has seen: NOSCRIPT on the first try
    script = client.register_script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCR', KEYS[1])")
    replies: list[Any] = []
    batch = Batch()
    batch.add(client, lambda pipe: pipe.set(keys.stats(0) + ":2", 1), replies.append)
    batch.script(client, script, [keys.stats(0) + ":2"], [], replies.append)
    batch.execute()
    assert replies == [True, 2]
    assert client.script_exists(script.sha) == [True]


def test_redis_away_reaches_each_owner_and_what_nobody_handles_is_raised() -> None:
    client = fail_fast_client(f"redis://127.0.0.1:{_closed_port()}/0")
    heard: list[str] = []
    batch = Batch()
    batch.add(client, lambda pipe: pipe.get("x"), on_error=lambda exc: heard.append("a"))
    batch.add(client, lambda pipe: pipe.get("y"), on_error=lambda exc: heard.append("b"))
    batch.add(client, lambda pipe: pipe.get("z"))
    with pytest.raises(redis.ConnectionError):
        batch.execute()
    assert heard == ["a", "b"]


def test_a_scripts_own_error_is_raised_not_failed_open(rdb: redis.Redis, keys: Keys) -> None:
    script: Script = rdb.register_script("return redis.error_reply('broken')")
    heard: list[Exception] = []
    got: list[Any] = []
    batch = Batch()
    batch.script(rdb, script, [keys.stats(0) + ":3"], [], on_error=heard.append)
    batch.add(rdb, lambda pipe: pipe.set(keys.stats(0) + ":3", 1), got.append)
    with pytest.raises(redis.ResponseError, match="broken"):
        batch.execute()
    assert heard == [] and got == [True]  # the others still got their replies


def test_a_batch_prepended_goes_first_and_counts_as_sent(rdb: redis.Redis, keys: Keys) -> None:
    first, then, order = Batch(), Batch(), []
    first.add(rdb, lambda pipe: pipe.rpush(keys.stats(0) + ":4", "admitted"), order.append)
    then.add(rdb, lambda pipe: pipe.rpush(keys.stats(0) + ":4", "settled"), order.append)
    then.prepend(first)
    then.execute()
    first.execute()
    assert rdb.lrange(keys.stats(0) + ":4", 0, -1) == ["admitted", "settled"] and order == [1, 2]


# -- the layers through the executor ------------------------------------------


class Answers(Layer):
    """An outer layer that answers without going further in, like a replay."""

    name = "answers"

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        return Outcome(data="from the record", ran=False)


def test_an_attempt_with_lease_breaker_and_budget_costs_two_round_trips(
    counted: tuple[redis.Redis, type[Counting]],
    keys: Keys,
    clock: ManualClock,
    registry: Registry,
) -> None:
    client, cls = counted
    store = IdempotencyStore(client, keys, clock=clock)
    breakers = CircuitBreaker(client, keys, clock=clock)
    layers = [
        IdempotencyLayer(store, clock=clock),
        BreakerLayer(breakers),
        RetryBudgetLayer(RetryBudget(client, keys, clock=clock)),
    ]
    executor = Executor(runner=Runner(), clock=clock, rng=random.Random(1), layers=layers)

    @tool(registry=registry, max_attempts=3)
    def noop() -> None:
        """Nothing."""

    spec = registry.get("noop")
    assert spec is not None and spec.policy.breaker.enabled and spec.policy.retry_budget.enabled
    executor.attempt(spec, {}, _ctx(clock, spec), 1)  # scripts loaded, names registered
    breakers.snapshot("noop")  # the snapshot's own script loaded too, so it costs one send below
    before = cls.sends
    admission, settlement = Batch(), Batch()
    verdict = executor.attempt(
        spec, {}, _ctx(clock, spec, "c2"), 1, admission=admission, settlement=settlement
    )
    assert isinstance(verdict, Final) and verdict.result.ok and verdict.release is not None
    assert cls.sends - before == 1  # the admission
    assert breakers.snapshot("noop").calls == 1  # the first call's record; this one's waits
    settlement.execute()
    assert cls.sends - before == 2 + 1  # the settlement, and the snapshot just read
    assert breakers.snapshot("noop").calls == 2


def test_a_probe_permit_an_outer_layer_made_unneeded_is_given_back(
    rdb: redis.Redis, keys: Keys, clock: ManualClock, registry: Registry
) -> None:
    breakers = CircuitBreaker(rdb, keys, clock=clock)
    executor = Executor(clock=clock, layers=[Answers(), BreakerLayer(breakers)])

    @tool(registry=registry)
    def probed() -> None:
        """Nothing."""

    spec = registry.get("probed")
    assert spec is not None
    breakers.trip("probed", seconds=1.0)
    clock.advance(2.0)  # open-until passed: the next acquire hands out a probe permit
    verdict = executor.attempt(spec, {}, _ctx(clock, spec), 1)
    assert isinstance(verdict, Final) and verdict.result.data == "from the record"
    view = breakers.snapshot("probed")
    assert view.state == "half_open" and view.probes_in_flight == 0


def test_a_rate_limit_slot_an_outer_layer_made_unneeded_is_given_back(
    rdb: redis.Redis, keys: Keys, clock: ManualClock, registry: Registry
) -> None:
    limiter = RateLimiter(rdb, keys, clock=clock)
    executor = Executor(clock=clock, layers=[Answers(), RateLimitLayer(limiter, clock=clock)])
    policy = RateLimitPolicy(rate=1, burst=1)

    @tool(registry=registry, rate_limit=policy)
    def limited() -> None:
        """Nothing."""

    spec = registry.get("limited")
    assert spec is not None
    verdict = executor.attempt(spec, {}, _ctx(clock, spec), 1)
    assert isinstance(verdict, Final) and verdict.result.data == "from the record"
    assert limiter.reserve("limited", policy, 0.0).now  # the slot is free again
    assert not limiter.reserve("limited", policy, 0.0).reserved  # and now it is taken
