"""The client's breaker gate: a local copy Redis invalidates, and what it may answer alone."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import redis
from counting_support import Counted

from toolexec.breaker import BreakerState, CircuitBreaker
from toolexec.breaker.gate import SKEW_MARGIN_S, BreakerGate, GateVerdict, gate_verdict
from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.policies import BreakerPolicy


@pytest.mark.parametrize(
    ("raw", "now", "verdict"),
    [
        (None, 100.0, GateVerdict.ADMIT),  # no gate: closed
        ("closed 0 0", 100.0, GateVerdict.ADMIT),
        ("open 0 1", 100.0, GateVerdict.DENY),  # isolated until reset
        ("open 130 0", 100.0, GateVerdict.DENY),
        ("open 100.5 0", 100.0, GateVerdict.ASK),  # within the skew margin: Redis' clock decides
        ("open 90 0", 100.0, GateVerdict.ASK),  # open-until passed: the script moves it
        ("half_open 90 0", 100.0, GateVerdict.ASK),  # only the script counts probe permits
        ("garbage", 100.0, GateVerdict.ASK),
    ],
)
def test_gate_verdict_answers_alone_only_when_the_copy_suffices(
    raw: str | None, now: float, verdict: GateVerdict
) -> None:
    """Given a gate value and a time, when judged, then admit/deny/ask as the state allows."""
    assert gate_verdict(raw, now).verdict is verdict


def test_an_open_gate_says_when_to_retry() -> None:
    """Given a breaker open 30 s more, when judged, then the refusal carries those 30 s."""
    gate = gate_verdict("open 130 0", 100.0)
    assert gate.retry_after == pytest.approx(30.0)
    assert SKEW_MARGIN_S < 30.0


def _wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def gate(counted: Counted, rdb: redis.Redis, keys: Keys) -> Iterator[BreakerGate]:
    """A gate whose connections (its own and its breaker's) are counted apart from others'."""
    breaker_client = redis_client(counted.url)
    g = BreakerGate(counted.url, CircuitBreaker(breaker_client, keys), keys)
    yield g
    g.close()
    breaker_client.close()
    for key in rdb.scan_iter(f"{keys.prefix}:*"):
        rdb.delete(key)


def test_a_closed_breaker_is_checked_without_asking_redis(
    gate: BreakerGate, counted: Counted
) -> None:
    """Given a closed breaker checked once, when checked 50 times more, then Redis sees none."""
    policy = BreakerPolicy()
    assert gate.refusal("tool_a", policy, None, {}) is None
    before = counted.sent()
    for _ in range(50):
        assert gate.refusal("tool_a", policy, None, {}) is None
    assert counted.sent() == before


def test_a_trip_elsewhere_reaches_the_copy_and_a_reset_clears_it(
    gate: BreakerGate, rdb: redis.Redis, keys: Keys
) -> None:
    """Given a kept closed gate, when another process trips and resets, then the client follows."""
    policy = BreakerPolicy()
    assert gate.refusal("tool_b", policy, None, {}) is None  # the copy now says closed
    other = CircuitBreaker(rdb, keys)  # stands for a worker or an operator
    other.trip("tool_b", 60)
    assert _wait_for(lambda: gate.refusal("tool_b", policy, None, {}) is not None)
    refusal = gate.refusal("tool_b", policy, None, {})
    assert refusal is not None and refusal.retry_after is not None
    assert refusal.details["state"] == str(BreakerState.OPEN)
    other.reset("tool_b")
    assert _wait_for(lambda: gate.refusal("tool_b", policy, None, {}) is None)


def test_an_isolated_breaker_is_refused_from_the_copy(
    gate: BreakerGate, rdb: redis.Redis, keys: Keys
) -> None:
    """Given an operator's isolation, when checked, then refused with no retry time."""
    CircuitBreaker(rdb, keys).trip("tool_c", None)
    refusal = gate.refusal("tool_c", BreakerPolicy(), None, {})
    assert refusal is not None and refusal.retry_after is None


def test_a_disabled_breaker_never_refuses(gate: BreakerGate, rdb: redis.Redis, keys: Keys) -> None:
    """Given a tool whose breaker is off, when its name is tripped, then calls still go out."""
    CircuitBreaker(rdb, keys).trip("tool_d", 60)
    assert gate.refusal("tool_d", BreakerPolicy(enabled=False), None, {}) is None


def test_calls_through_a_closed_breaker_never_write_its_gate(rdb: redis.Redis, keys: Keys) -> None:
    """Given a closed breaker, when 20 calls are admitted and recorded, then no gate exists;
    when it opens, the gate says so; when it closes again, the gate is gone."""
    breakers = CircuitBreaker(rdb, keys)
    policy = BreakerPolicy(consecutive_failures=3)
    for _ in range(20):
        admission = breakers.acquire("tool_e", policy)
        breakers.record("tool_e", policy, admission, success=True, duration_s=0.01)
    assert rdb.exists(keys.breaker_gate("tool_e")) == 0
    for _ in range(3):
        admission = breakers.acquire("tool_e", policy)
        breakers.record("tool_e", policy, admission, success=False, duration_s=0.01)
    assert str(rdb.get(keys.breaker_gate("tool_e"))).startswith("open ")
    breakers.reset("tool_e")
    assert rdb.exists(keys.breaker_gate("tool_e")) == 0
    for key in rdb.scan_iter(f"{keys.prefix}:*"):
        rdb.delete(key)


def test_the_subscription_pattern_escapes_glob_characters_of_the_prefix() -> None:
    """Given a prefix with glob characters, when the pattern is built, then they match literally."""
    assert Keys("a*b").breaker_gates() == "a\\*b:breaker:*:gate"


def test_a_dropped_subscription_connection_empties_the_copy(
    gate: BreakerGate, rdb: redis.Redis, keys: Keys
) -> None:
    """Given a kept gate, when the server drops the subscription's connection and the breaker
    trips meanwhile, then the client does not keep answering from its old copy."""
    policy = BreakerPolicy()
    assert gate.refusal("tool_f", policy, None, {}) is None
    # drop this gate's own subscription connection, found by its local address
    listener = gate._listener
    assert listener is not None and listener[0].connection is not None
    sock = listener[0].connection._sock
    assert sock is not None
    host, port = sock.getsockname()[:2]
    rdb.client_kill_filter(addr=f"{host}:{port}")
    CircuitBreaker(rdb, keys).trip("tool_f", 60)  # published while the subscription is gone
    assert _wait_for(lambda: gate.refusal("tool_f", policy, None, {}) is not None)


def test_the_gate_carries_the_trip_and_reads_a_value_without_it() -> None:
    """The worker's gate value names the trip; a copy written before trips were kept is
    read as a first trip, never refused."""
    assert gate_verdict("open 130 0 3", 100.0).trips == 3
    assert gate_verdict("open 130 0", 100.0).trips == 0


def test_a_call_a_worker_would_let_wait_for_the_probe_is_sent_not_refused(
    gate: BreakerGate, rdb: redis.Redis, keys: Keys
) -> None:
    """A first short trip may be a blip: the worker decides whether the call waits for
    its probe. A breaker open again after a failed probe is refused at the client."""
    breakers = CircuitBreaker(rdb, keys)
    short = BreakerPolicy(consecutive_failures=1, failure_rate=None, open_s=10.0, max_wait_s=15.0)
    admission = breakers.acquire("tool_w", short)
    breakers.record("tool_w", short, admission, success=False, duration_s=0.1)
    assert breakers.snapshot("tool_w").trips == 1
    assert gate.refusal("tool_w", short, None, {}) is None
    assert gate.refusal("tool_w", replace(short, max_wait_s=0.0), None, {}) is not None
    long = replace(short, open_s=30.0, max_open_s=60.0)
    breakers.reset("tool_w")
    admission = breakers.acquire("tool_w", long)
    breakers.record("tool_w", long, admission, success=False, duration_s=0.1)
    # the gate's copy hears of the reset and the new trip through Redis, a moment later
    assert _wait_for(lambda: gate.refusal("tool_w", long, None, {}) is not None)
    refused = gate.refusal("tool_w", long, None, {})
    assert refused is not None and refused.details["defence"] == "circuit_breaker"
