"""The runner, layer-cost, memory, publish and worker-start benchmarks still run end to end;
figures never asserted.

Each starts its own Valkey (and workers), so none needs the test Redis.
"""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


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


def test_worker_start_benchmark_starts_each_kind_of_worker() -> None:
    """Given one round, when `bench/worker_start.py` runs, then each worker has a row."""
    stdout = run_bench("worker_start.py", "--rounds", "1")
    workers = ("toolexec worker", "celery -A toolexec.worker.app worker", "celery -A plain_app")
    for name in workers:
        assert f"| {name}" in stdout
