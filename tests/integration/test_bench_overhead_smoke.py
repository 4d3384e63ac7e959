"""bench/overhead.py still runs end to end, whole and limited to a figure; figures never
asserted.

It starts its own Valkey and workers, plain Celery's among them.
"""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


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
