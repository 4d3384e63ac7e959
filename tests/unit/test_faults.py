"""Fault injection: reproducible per seed, visible in results, and off unless enabled.

The layer runs inside a real Executor with tools from a private registry;
the fault store is a real Redis; sleeping is replaced by a recorder that
moves the ManualClock, so added latency is exact and costs no time.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.errors import ConfigurationError, ErrorType, UnavailableError
from toolexec.keys import Keys
from toolexec.layers.faults import FaultConfig, FaultLayer, FaultStore
from toolexec.pipeline.execution import Executor, Final, Retry, Verdict
from toolexec.pipeline.runner import Runner
from toolexec.registry import Registry, ToolSpec, tool


class Sleeper:
    """Stands in for time.sleep: records each pause and moves the clock by it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.pauses: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.clock.advance(seconds)


class Body:
    """The tool: counts its runs and answers the real forecast."""

    def __init__(self) -> None:
        self.runs = 0


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(rdb: redis.Redis) -> FaultStore:
    return FaultStore(rdb, Keys(f"t-{uuid.uuid4().hex[:10]}"))


@pytest.fixture
def sleeper(clock: ManualClock) -> Sleeper:
    return Sleeper(clock)


@pytest.fixture
def body() -> Body:
    return Body()


@pytest.fixture
def spec(registry: Registry, body: Body) -> ToolSpec:
    @tool(registry=registry, timeout=5, max_attempts=3, backoff_base=0.01)
    def forecast(city: str) -> dict[str, Any]:
        body.runs += 1
        return {"city": city, "temp": 21}

    found = registry.get("forecast")
    assert found is not None
    return found


def layer_for(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, *, enabled: bool = True
) -> FaultLayer:
    return FaultLayer(store, enabled=enabled, clock=clock, sleep=sleeper, refresh_s=0.0)


def run(layer: FaultLayer, spec: ToolSpec, clock: ManualClock, attempt: int = 1) -> Verdict:
    executor = Executor(runner=Runner(), clock=clock, rng=random.Random(3), layers=[layer])
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=spec.name,
        deadline=clock.now() + 60,
        submitted_at=clock.now(),
        reply_to="r",
    )
    return executor.attempt(spec, {"city": "Oslo"}, ctx, attempt)


# -- the plan: a pure function of (seed, n) ----------------------------------------


def test_the_same_seed_draws_the_same_faults() -> None:
    config = FaultConfig(rate=0.3, seed=7)
    first = [config.plan(n).error for n in range(1, 201)]
    again = [FaultConfig(rate=0.3, seed=7).plan(n).error for n in range(1, 201)]
    assert first == again


def test_another_seed_draws_other_faults() -> None:
    seven = [FaultConfig(rate=0.3, seed=7).plan(n).injected for n in range(1, 201)]
    eight = [FaultConfig(rate=0.3, seed=8).plan(n).injected for n in range(1, 201)]
    assert seven != eight


def test_the_rate_is_the_share_of_attempts_that_fail() -> None:
    config = FaultConfig(rate=0.3, error=ErrorType.TIMEOUT, seed=1)
    failed = [config.plan(n).error for n in range(1, 5001)]
    assert 0.27 < sum(e is ErrorType.TIMEOUT for e in failed) / 5000 < 0.33
    assert set(failed) == {ErrorType.TIMEOUT, None}


def test_without_an_error_type_a_fault_is_unavailable() -> None:
    assert FaultConfig(rate=1.0).plan(1).error is ErrorType.UNAVAILABLE


def test_latency_applies_to_its_own_share_of_attempts() -> None:
    config = FaultConfig(latency=0.2, latency_rate=0.5, seed=2)
    plans = [config.plan(n) for n in range(1, 2001)]
    slowed = sum(p.latency == 0.2 for p in plans)
    assert 900 < slowed < 1100
    assert all(p.error is None for p in plans)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rate": 1.5}, "rate must be in"),
        ({"latency": -1}, "latency must be"),
        ({"rate": 0.5, "error": "deadline_exceeded"}, "not a failure a tool raises"),
        ({"rate": 0.5, "error": "timeout", "outcome": {"x": 1}}, "not both"),
        ({}, "injects nothing"),
        ({"rate": 0.5, "error": "no_such_error"}, "fault config"),
    ],
)
def test_a_config_that_makes_no_sense_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        FaultConfig.from_json(fields)


def test_a_config_survives_its_json_round_trip() -> None:
    config = FaultConfig(rate=0.25, outcome={"temp": -99}, latency=0.1, seed=5)
    assert FaultConfig.from_json(config.to_json()) == config


# -- the layer in the executor ------------------------------------------------------


def test_an_injected_error_fails_the_attempt_like_a_real_one(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec, body: Body
) -> None:
    """Transient, so the retry policy retries it; the body never ran."""
    store.set("forecast", FaultConfig(rate=1.0, error=ErrorType.UNAVAILABLE, seed=1))
    verdict = run(layer_for(store, clock, sleeper), spec, clock)
    assert isinstance(verdict, Retry)
    assert isinstance(verdict.error, UnavailableError)
    assert "injected fault" in verdict.error.message
    assert verdict.context.injected and body.runs == 0


def test_a_final_result_says_it_was_injected(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    store.set("forecast", FaultConfig(rate=1.0, error=ErrorType.NOT_FOUND, seed=1))
    verdict = run(layer_for(store, clock, sleeper), spec, clock)
    assert isinstance(verdict, Final)
    result = verdict.result
    assert result.injected and result.error is not None
    assert result.error.type is ErrorType.NOT_FOUND
    assert result.error.details == {"injected": True}
    assert result.attempts == 1


def test_a_replaced_outcome_comes_back_instead_of_the_tools(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec, body: Body
) -> None:
    store.set("forecast", FaultConfig(rate=1.0, outcome={"temp": -99}, seed=1))
    verdict = run(layer_for(store, clock, sleeper), spec, clock)
    assert isinstance(verdict, Final)
    assert verdict.result.ok and verdict.result.data == {"temp": -99}
    assert verdict.result.injected and body.runs == 0


def test_added_latency_delays_the_real_call(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec, body: Body
) -> None:
    store.set("forecast", FaultConfig(latency=0.25, seed=1))
    verdict = run(layer_for(store, clock, sleeper), spec, clock)
    assert isinstance(verdict, Final)
    result = verdict.result
    assert result.ok and result.data == {"city": "Oslo", "temp": 21} and body.runs == 1
    assert result.injected and sleeper.pauses == [0.25]
    assert result.timings.run_ms == 250.0


def test_latency_beyond_the_attempts_limit_is_a_timeout(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec, body: Body
) -> None:
    """The tool's timeout is 5 s: a 9 s delay waits 5 s, then the attempt times out."""
    store.set("forecast", FaultConfig(latency=9.0, seed=1))
    verdict = run(layer_for(store, clock, sleeper), spec, clock)
    assert isinstance(verdict, Retry)
    assert verdict.error.error_type is ErrorType.TIMEOUT
    assert sleeper.pauses == [5.0] and body.runs == 0


def test_an_attempt_spared_by_the_dice_is_not_marked(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    store.set("forecast", FaultConfig(rate=0.5, seed=3))
    layer = layer_for(store, clock, sleeper)
    plans = [FaultConfig(rate=0.5, seed=3).plan(n).injected for n in range(1, 21)]
    results = [run(layer, spec, clock) for _ in range(20)]
    marked = [isinstance(v, Retry) or (isinstance(v, Final) and v.result.injected) for v in results]
    assert marked == plans


def test_a_seed_replays_one_sequence_across_workers(
    store: FaultStore, rdb: redis.Redis, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    """Two workers draw from one count in Redis: together they see the seed's sequence."""
    config = FaultConfig(rate=0.5, seed=11)
    store.set("forecast", config)
    workers = [layer_for(FaultStore(rdb, store.keys), clock, sleeper) for _ in range(2)]
    seen = [isinstance(run(workers[n % 2], spec, clock), Retry) for n in range(30)]
    assert seen == [config.plan(n).injected for n in range(1, 31)]


def test_setting_a_config_again_restarts_its_sequence(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    config = FaultConfig(rate=0.5, seed=4)
    layer = layer_for(store, clock, sleeper)
    store.set("forecast", config)
    first = [isinstance(run(layer, spec, clock), Retry) for _ in range(10)]
    store.set("forecast", config)
    assert [isinstance(run(layer, spec, clock), Retry) for _ in range(10)] == first


def test_cleared_faults_stop(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    store.set("forecast", FaultConfig(rate=1.0, seed=1))
    layer = layer_for(store, clock, sleeper)
    assert isinstance(run(layer, spec, clock), Retry)
    assert store.clear() == ["forecast"]
    verdict = run(layer, spec, clock)
    assert isinstance(verdict, Final) and verdict.result.ok and not verdict.result.injected


def test_redis_configs_are_reread_only_after_refresh_s(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    layer = FaultLayer(store, enabled=True, clock=clock, sleep=sleeper, refresh_s=1.0)
    assert isinstance(run(layer, spec, clock), Final)
    store.set("forecast", FaultConfig(rate=1.0, seed=1))
    assert isinstance(run(layer, spec, clock), Final)
    clock.advance(1.0)
    assert isinstance(run(layer, spec, clock), Retry)


def test_settings_configs_apply_without_the_cli(
    store: FaultStore, clock: ManualClock, sleeper: Sleeper, spec: ToolSpec
) -> None:
    static = {"forecast": FaultConfig(rate=1.0, error=ErrorType.TIMEOUT, seed=1)}
    layer = FaultLayer(store, enabled=True, static=static, clock=clock, sleep=sleeper)
    verdict = run(layer, spec, clock)
    assert isinstance(verdict, Retry) and verdict.error.error_type is ErrorType.TIMEOUT


# -- off unless enabled ---------------------------------------------------------------


def test_faults_set_in_redis_are_ignored_with_a_warning_when_not_enabled(
    store: FaultStore,
    clock: ManualClock,
    sleeper: Sleeper,
    spec: ToolSpec,
    body: Body,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store.set("forecast", FaultConfig(rate=1.0, seed=1))
    layer = layer_for(store, clock, sleeper, enabled=False)
    with caplog.at_level(logging.WARNING, logger="toolexec.layers.faults"):
        verdicts = [run(layer, spec, clock) for _ in range(5)]
    assert all(isinstance(v, Final) and v.result.ok and not v.result.injected for v in verdicts)
    assert body.runs == 5
    warnings = [r for r in caplog.records if "ignored" in r.message]
    assert len(warnings) == 1 and "TOOLEXEC_FAULTS_ENABLED=true" in warnings[0].message


def test_faults_from_settings_are_ignored_with_a_warning_when_not_enabled(
    store: FaultStore,
    clock: ManualClock,
    sleeper: Sleeper,
    spec: ToolSpec,
    caplog: pytest.LogCaptureFixture,
) -> None:
    static = {"forecast": FaultConfig(rate=1.0, seed=1)}
    with caplog.at_level(logging.WARNING, logger="toolexec.layers.faults"):
        layer = FaultLayer(store, enabled=False, static=static, clock=clock, sleep=sleeper)
    verdict = run(layer, spec, clock)
    assert isinstance(verdict, Final) and verdict.result.ok
    assert any("forecast" in r.message and "ignored" in r.message for r in caplog.records)


def test_a_disabled_layer_checks_redis_for_ignored_faults_only_now_and_then(
    store: FaultStore,
    clock: ManualClock,
    sleeper: Sleeper,
    spec: ToolSpec,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store.set("forecast", FaultConfig(rate=1.0, seed=1))
    layer = FaultLayer(store, enabled=False, clock=clock, sleep=sleeper, warn_interval_s=60)
    with caplog.at_level(logging.WARNING, logger="toolexec.layers.faults"):
        for _ in range(3):
            run(layer, spec, clock)
            clock.advance(30)
    assert sum("ignored" in r.message for r in caplog.records) == 2
