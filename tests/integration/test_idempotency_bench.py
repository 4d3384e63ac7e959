"""bench/idempotency.py still runs end to end; its timing figures are never asserted here."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_quick_idempotency_benchmark_prints_its_table_with_no_duplicate(redis_url: str) -> None:
    """Given the test Redis, when `bench/idempotency.py --quick` runs, then it reports 0 dups."""
    stdout = run_bench("idempotency.py", "--quick", "--calls", "20", "--redis-url", redis_url)
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in stdout
    assert "| duplicate writes | - | 0 | 0.00x | 0 | PASS |" in stdout
    assert "| calls not ok by their deadline | - | 0 | 0.00x | 0 | PASS |" in stdout
    assert "command: `" in stdout and "--quick" in stdout
