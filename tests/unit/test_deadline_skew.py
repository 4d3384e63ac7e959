"""Deadlines under clock skew: client and worker hosts whose clocks disagree by ±5 s.

A deadline is set on the client's host and compared on a worker's. Both read
time from :func:`toolexec.connection.fleet_clock`, their own clock anchored on
Redis ``TIME`` (a real server here); the hosts' clocks are ManualClocks set 5 s
apart, and time passes by advancing both alike.
"""

from __future__ import annotations

import time

import pytest
import redis

from toolexec.clock import AnchoredClock, Clock, ManualClock
from toolexec.connection import fleet_clock
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.pipeline.execution import Executor, Final
from toolexec.pipeline.runner import Runner
from toolexec.registry import Registry, ToolSpec, tool

SKEWS = [(5.0, -5.0), (-5.0, 5.0), (5.0, 0.0), (0.0, -5.0), (0.0, 5.0)]
TIMEOUT_S = 3.0


def _host(rdb: redis.Redis, skew: float) -> tuple[ManualClock, AnchoredClock]:
    """A host whose own clock is ``skew`` seconds off, and its fleet clock."""
    base = ManualClock(time.time() + skew)
    clock = fleet_clock(rdb, base)
    clock.sync()  # now, while Redis TIME and the host's clock run together
    return base, clock


def _spec(registry: Registry) -> ToolSpec:
    @tool(registry=registry, breaker=None, timeout=10)
    def echo(x: int) -> int:
        return x

    spec = registry.get("echo")
    assert spec is not None
    return spec


def _submitted(clock: Clock) -> CallContext:
    """A call as the client stamps it: ``TIMEOUT_S`` from now on its clock."""
    now = clock.now()
    return CallContext(
        call_id="c1", tool="echo", deadline=now + TIMEOUT_S, submitted_at=now, reply_to="r1"
    )


def _advance(seconds: float, *hosts: ManualClock) -> None:
    for host in hosts:
        host.advance(seconds)


@pytest.mark.parametrize(("client_skew", "worker_skew"), SKEWS)
def test_no_call_is_refused_early_and_no_attempt_starts_after_the_deadline(
    rdb: redis.Redis, registry: Registry, client_skew: float, worker_skew: float
) -> None:
    client_host, client_clock = _host(rdb, client_skew)
    worker_host, worker_clock = _host(rdb, worker_skew)
    spec = _spec(registry)
    executor = Executor(runner=Runner(), clock=worker_clock)
    ctx = _submitted(client_clock)

    # 1 s after it was sent, with 2 s left, the worker runs it
    _advance(1.0, client_host, worker_host)
    ran = executor.attempt(spec, {"x": 1}, ctx, 1)
    assert isinstance(ran, Final) and ran.result.ok, ran
    assert 900 <= ran.result.elapsed_ms <= 1100  # the call's age, measured across hosts

    # 2.5 s later, 0.5 s past the deadline, no attempt starts
    _advance(2.5, client_host, worker_host)
    late = executor.attempt(spec, {"x": 1}, ctx, 2)
    assert isinstance(late, Final) and late.result.error is not None
    assert late.result.error.type is ErrorType.DEADLINE_EXCEEDED


def test_the_same_skew_read_on_the_hosts_own_clocks_would_refuse_the_call_early(
    registry: Registry,
) -> None:
    """What the fleet clock prevents: a worker 5 s ahead sees a 3 s call as already late."""
    client_host = ManualClock(1_700_000_000.0)
    worker_host = ManualClock(1_700_000_005.0)
    executor = Executor(runner=Runner(), clock=worker_host)
    ctx = _submitted(client_host)
    _advance(1.0, client_host, worker_host)
    refused = executor.attempt(_spec(registry), {"x": 1}, ctx, 1)
    assert isinstance(refused, Final) and refused.result.error is not None
    assert refused.result.error.type is ErrorType.DEADLINE_EXCEEDED


def test_an_unreachable_reference_keeps_the_last_offset_and_never_fails_a_call() -> None:
    base = ManualClock(1_000.0)
    answers = iter([1_010.0])

    def reference() -> float:
        value = next(answers, None)
        if value is None:
            raise ConnectionError("Redis is away")
        return value

    clock = AnchoredClock(reference, base, resync_s=60.0, retry_s=5.0)
    assert clock.now() == pytest.approx(1_010.0)
    base.advance(61.0)  # time to measure again; the reference fails
    assert clock.now() == pytest.approx(1_071.0)
    assert clock.offset == pytest.approx(10.0)
