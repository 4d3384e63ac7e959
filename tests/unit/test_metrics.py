"""The Prometheus metrics a worker exposes: hook by hook, on a registry of the test's own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from toolexec.breaker import BreakerState, CircuitBreaker, Transition, TransitionReason
from toolexec.clock import ManualClock
from toolexec.connection import fail_fast_client, redis_client
from toolexec.keys import Keys
from toolexec.ops import metrics as metrics_mod
from toolexec.ops.metrics import BreakerCollector, Metrics, record_fallback, record_offload
from toolexec.policies import BreakerPolicy


@pytest.fixture
def m() -> Metrics:
    return Metrics(CollectorRegistry())


def _get(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_a_retried_then_successful_call_counts_two_attempts_one_retry_one_ok(m: Metrics) -> None:
    m.started("fetch", "c1", 1, 0.0)
    m.retrying("fetch", "c1", 1, "unavailable")
    m.started("fetch", "c1", 2, 0.0)
    m.finished("fetch", "c1", 2, None, 0.25)

    assert _get(m, "toolexec_attempts_total", tool="fetch") == 2
    assert _get(m, "toolexec_retries_total", tool="fetch", error_type="unavailable") == 1
    assert _get(m, "toolexec_calls_total", tool="fetch", outcome="ok") == 1
    assert _get(m, "toolexec_call_duration_seconds_sum", tool="fetch") == 0.25
    assert _get(m, "toolexec_call_duration_seconds_bucket", tool="fetch", le="0.25") == 1
    assert _get(m, "toolexec_call_duration_seconds_bucket", tool="fetch", le="0.1") == 0
    assert _get(m, "toolexec_attempt_duration_seconds_count", tool="fetch") == 2


def test_a_failed_call_is_counted_under_its_error_type(m: Metrics) -> None:
    m.started("fetch", "c1", 1, 0.0)
    m.finished("fetch", "c1", 1, "not_found", 0.01)

    assert _get(m, "toolexec_calls_total", tool="fetch", outcome="not_found") == 1
    assert _get(m, "toolexec_calls_total", tool="fetch", outcome="ok") is None


def test_the_in_flight_gauge_rises_while_an_attempt_runs(m: Metrics) -> None:
    m.started("slow", "c1", 1, 0.0)
    m.started("slow", "c2", 1, 0.0)
    assert _get(m, "toolexec_calls_in_flight", tool="slow") == 2

    m.finished("slow", "c1", 1, None, 1.0)

    assert _get(m, "toolexec_calls_in_flight", tool="slow") == 1


def test_an_end_without_a_start_in_this_process_leaves_the_gauge_alone(m: Metrics) -> None:
    """A call that failed before its attempt began (a broken message) never raised the gauge."""
    m.finished("fetch", "c1", 1, "internal_error", 0.0)

    assert _get(m, "toolexec_calls_in_flight", tool="fetch") is None
    assert _get(m, "toolexec_calls_total", tool="fetch", outcome="internal_error") == 1


def test_a_withdrawn_attempt_leaves_the_gauge_and_counts_no_attempt(m: Metrics) -> None:
    m.started("fetch", "c1", 1, 0.0)
    m.withdrawn("fetch", "c1", 1)

    assert _get(m, "toolexec_calls_in_flight", tool="fetch") == 0
    assert _get(m, "toolexec_attempts_total", tool="fetch") is None


def test_breaker_transitions_are_counted_by_the_state_entered(m: Metrics) -> None:
    m.on_transition(
        Transition(
            "fetch", BreakerState.CLOSED, BreakerState.OPEN, 0.0, TransitionReason.FAILURE_RATE
        )
    )

    assert _get(m, "toolexec_breaker_transitions_total", breaker="fetch", state="open") == 1


def test_fallbacks_and_offloads_are_counted_through_the_module_functions() -> None:
    """Other modules report with one call; the process-wide metrics hold the counts."""
    tool = f"t{uuid.uuid4().hex[:6]}"
    record_fallback(tool, "cache")
    record_offload(tool, 40_000)
    record_offload(tool, 2_000, kind="arguments")

    registry = metrics_mod.metrics().registry
    assert (
        registry.get_sample_value("toolexec_fallbacks_total", {"tool": tool, "source": "cache"})
        == 1
    )
    labels = {"tool": tool, "kind": "result"}
    assert registry.get_sample_value("toolexec_offloaded_payloads_total", labels) == 1
    assert registry.get_sample_value("toolexec_offloaded_bytes_total", labels) == 40_000
    args = {"tool": tool, "kind": "arguments"}
    assert registry.get_sample_value("toolexec_offloaded_bytes_total", args) == 2_000


@pytest.fixture
def breakers(redis_url: str) -> Iterator[CircuitBreaker]:
    client = redis_client(redis_url)
    yield CircuitBreaker(client, Keys(f"t-{uuid.uuid4().hex[:10]}"), clock=ManualClock())
    client.close()


def test_breaker_states_are_read_from_redis_on_scrape(breakers: CircuitBreaker) -> None:
    """One breaker tripped by an operator, one closed: each reports 1 for its own state only."""
    policy = BreakerPolicy()
    breakers.record(
        "quiet", policy, breakers.acquire("quiet", policy), success=True, duration_s=0.1
    )
    breakers.trip("noisy", 60)
    registry = CollectorRegistry()
    registry.register(BreakerCollector(breakers))

    def state(name: str, value: str) -> float | None:
        return registry.get_sample_value(
            "toolexec_breaker_state", {"breaker": name, "state": value}
        )

    assert (state("noisy", "open"), state("noisy", "closed"), state("noisy", "half_open")) == (
        1,
        0,
        0,
    )
    assert (state("quiet", "closed"), state("quiet", "open")) == (1, 0)


def test_a_scrape_while_redis_is_away_still_serves_the_call_metrics() -> None:
    """The breaker series are left out; the page itself does not fail."""
    dead = fail_fast_client("redis://127.0.0.1:1/0")
    m = Metrics(CollectorRegistry())
    m.registry.register(BreakerCollector(CircuitBreaker(dead, Keys("gone"))))
    m.started("fetch", "c1", 1, 0.0)
    m.finished("fetch", "c1", 1, None, 0.1)

    page = generate_latest(m.registry).decode()

    assert 'toolexec_attempts_total{tool="fetch"} 1.0' in page
    assert "toolexec_breaker_state{" not in page
