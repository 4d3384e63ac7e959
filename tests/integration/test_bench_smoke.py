"""The overhead, layer-cost and memory benchmarks still run end to end; figures never asserted.

Each starts its own Valkey (and workers), so none needs the test Redis.
"""

from __future__ import annotations

import pytest
from integration_support import run_bench

pytestmark = pytest.mark.integration


def test_quick_overhead_benchmark_prints_the_side_by_side_table() -> None:
    """Given nothing running, when `bench/overhead.py --quick` runs, then it prints the report."""
    stdout = run_bench("overhead.py", "--quick")
    header = "| figure | plain Celery | plain Celery -E | toolexec | toolexec / -E | target |"
    assert header in stdout
    assert "Redis commands per call, burst" in stdout
    assert "command: `" in stdout and "--quick" in stdout


def test_overhead_benchmark_measures_only_the_figures_asked_for() -> None:
    """Given `--only burst`, when `bench/overhead.py` runs, then no fan-out or round trip row."""
    stdout = run_bench("overhead.py", "--quick", "--only", "burst")
    assert "delay() each then get() each / call_many" in stdout
    assert "CPU ms per call, burst: total" in stdout
    assert "fan-out" not in stdout.split("## toolexec vs plain Celery")[1].split("\n- ")[0]
    assert "sequential round trip" not in stdout


def test_runner_benchmark_compares_a_thread_per_call_with_reused_threads() -> None:
    """Given a tiny run, when `bench/runner.py` runs, then both ways are in the table."""
    stdout = run_bench("runner.py", "--calls", "80", "--rounds", "1")
    assert "thread per call / reused" in stdout
    assert "| 8 |" in stdout


def test_layer_cost_benchmark_prints_a_row_per_layer() -> None:
    """Given a tiny run, when `bench/layers.py` runs, then each layer has a row."""
    stdout = run_bench("layers.py", "--calls", "20", "--rounds", "1")
    for layer in ("breaker permit + record", "retry budget record", "run guard"):
        assert f"| {layer}" in stdout


def test_memory_benchmark_reports_the_loop_slope() -> None:
    """Given a tiny run, when `bench/memory.py` runs, then it reports RSS and the slope."""
    stdout = run_bench("memory.py", "--calls", "400", "--batch", "100", "--in-flight", "20")
    assert "slope over the second half" in stdout


def test_publish_benchmark_compares_the_old_and_new_sending() -> None:
    """Given a tiny run, when `bench/publish.py` runs, then both ways are in the table."""
    stdout = run_bench("publish.py", "--calls", "20", "--rounds", "1")
    assert "| send 20 calls, wall ms |" in stdout


def test_quick_observability_benchmark_reports_tracing_on_and_off(redis_url: str) -> None:
    """`bench/observability.py --quick --tracing-only` runs agents traced and untraced."""
    stdout = run_bench("observability.py", "--quick", "--tracing-only", "--redis-url", redis_url)
    assert "p50 ms, sampling 10 %" in stdout and "p50 ms, untraced worker B vs A (A/A)" in stdout
    spans = int(stdout.split(" spans received over OTLP/HTTP")[0].rsplit("- ", 1)[1])
    assert spans > 0  # the traced agents and worker did export
