"""The capacity model (rigs.capacity): its limits, its sizing, and its simulation agreeing."""

from __future__ import annotations

import math

import pytest
from rigs.capacity import (
    HOT,
    SHARD,
    CallCost,
    Fleet,
    bottleneck,
    capacities,
    simulate,
    size_fleet,
)

#: Close to docs/scaling.md's call with breaker, idempotency and guard.
COST = CallCost(worker_ms=2.8, client_ms=1.7, broker_ms=0.65, redis_ms=0.6, hot_ms=0.2)


def test_a_hot_slot_caps_throughput_at_the_one_slot_figure_however_many_shards() -> None:
    every_call = Fleet(worker_cores=10_000, client_cores=10_000, broker_nodes=1_000, hot_share=1.0)
    for shards in (3, 30, 3_000):
        name, rate = bottleneck(COST, Fleet(**{**every_call.__dict__, "redis_shards": shards}))
        assert name == HOT
        assert rate <= 1000.0 / COST.hot_ms
    huge = Fleet(**{**every_call.__dict__, "redis_shards": 10**7})
    assert bottleneck(COST, huge)[1] == pytest.approx(1000.0 / COST.hot_ms, rel=1e-3)


def test_half_the_calls_on_the_hot_slot_double_its_ceiling() -> None:
    all_of = Fleet(redis_shards=10**6, worker_cores=1e6, client_cores=1e6, hot_share=1.0)
    half = Fleet(**{**all_of.__dict__, "hot_share": 0.5})
    assert capacities(COST, half)[HOT] == pytest.approx(2 * capacities(COST, all_of)[HOT], rel=1e-3)


def test_adding_shards_moves_the_bottleneck_off_redis() -> None:
    few = Fleet(worker_cores=40, client_cores=40, redis_shards=1, broker_nodes=4)
    assert bottleneck(COST, few)[0] == SHARD
    more = Fleet(**{**few.__dict__, "redis_shards": 12})
    name, rate = bottleneck(COST, more)
    assert name != SHARD
    assert rate > bottleneck(COST, few)[1]


def test_each_party_scales_with_its_cores() -> None:
    one = capacities(COST, Fleet(worker_cores=1))
    four = capacities(COST, Fleet(worker_cores=4))
    assert four["worker CPU"] == pytest.approx(4 * one["worker CPU"])
    assert four["client CPU"] == one["client CPU"]


def test_a_retry_or_a_fallback_step_costs_the_broker_and_its_queues_a_message_more() -> None:
    fleet = Fleet(queue_msgs_s=10_000, queues=2)
    retried = CallCost(**{**COST.__dict__, "messages": 2.0})
    assert capacities(COST, fleet)["broker queues"] == 20_000
    assert capacities(retried, fleet)["broker queues"] == 10_000
    assert capacities(retried, fleet)["broker CPU"] == pytest.approx(
        capacities(COST, fleet)["broker CPU"] / 2
    )


def test_a_shared_machine_is_one_pool_for_every_party() -> None:
    fleet = Fleet(shared_cores=2.0)
    assert bottleneck(COST, fleet) == ("shared cores", pytest.approx(2000.0 / COST.total_ms()))


@pytest.mark.parametrize("rate", [1_000, 10_000, 100_000])
def test_a_sized_fleet_keeps_every_party_under_the_target_and_is_the_smallest(rate: int) -> None:
    base = Fleet(queue_msgs_s=15_000, hot_share=0.01)
    fleet = size_fleet(COST, rate, target=0.7, base=base)
    caps = capacities(COST, fleet)
    assert min(caps.values()) * 0.7 >= rate * (1 - 1e-9)
    fewer_workers = Fleet(**{**fleet.__dict__, "worker_cores": fleet.worker_cores - 1})
    assert capacities(COST, fewer_workers)["worker CPU"] * 0.7 < rate
    if fleet.redis_shards > 1:
        fewer_shards = Fleet(**{**fleet.__dict__, "redis_shards": fleet.redis_shards - 1})
        assert (
            min(capacities(COST, fewer_shards)[k] for k in (SHARD, HOT) if k in caps) * 0.7 < rate
        )


def test_a_hot_slot_past_the_target_is_not_sized_away() -> None:
    fleet = size_fleet(COST, 10_000, base=Fleet(hot_share=1.0))
    assert bottleneck(COST, fleet)[0] == HOT
    assert bottleneck(COST, fleet)[1] < 10_000


def test_the_saturated_simulation_carries_what_the_division_says() -> None:
    fleet = Fleet(worker_cores=2, client_cores=2, redis_shards=2, broker_nodes=1, broker_cores=1)
    expected = bottleneck(COST, fleet)
    result = simulate(COST, fleet, population=64, calls=6_000, seed=3)
    assert result.throughput == pytest.approx(expected[1], rel=0.08)
    assert result.busiest() == expected[0]


def test_an_idle_fleet_answers_in_the_sum_of_its_service_times() -> None:
    fleet = Fleet(worker_cores=100, client_cores=100, redis_shards=50, broker_nodes=10)
    result = simulate(COST, fleet, rate=100.0, calls=4_000, seed=5)
    assert result.throughput == pytest.approx(100.0, rel=0.1)
    # exponential service: the median of a sum of 7 exponentials is below its mean
    assert 0.5 * COST.total_ms() < result.p50_ms < COST.total_ms()
    assert max(result.utilisation.values()) < 0.1


def test_latency_grows_as_the_bottleneck_nears() -> None:
    fleet = Fleet(worker_cores=4, client_cores=4, redis_shards=2, broker_nodes=1)
    ceiling = bottleneck(COST, fleet)[1]
    light = simulate(COST, fleet, rate=0.3 * ceiling, calls=8_000, seed=7)
    heavy = simulate(COST, fleet, rate=0.95 * ceiling, calls=8_000, seed=7)
    assert heavy.p99_ms > 2 * light.p99_ms
    assert heavy.busiest() == "worker CPU"


def test_simulate_takes_an_open_or_a_closed_load() -> None:
    with pytest.raises(ValueError, match="not both"):
        simulate(COST, Fleet(), rate=1.0, population=1)
    with pytest.raises(ValueError, match="not both"):
        simulate(COST, Fleet())


def test_a_free_party_is_no_limit() -> None:
    free = CallCost(worker_ms=1.0, client_ms=0.0, broker_ms=0.0, redis_ms=0.0)
    caps = capacities(free, Fleet())
    assert math.isinf(caps["client CPU"]) and caps["worker CPU"] == 1000.0
