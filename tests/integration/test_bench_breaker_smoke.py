"""bench/breaker.py still runs end to end; its figures are never asserted here."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_a_tiny_breaker_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    """Given the test Redis, when a tiny breaker benchmark runs, then it prints every row."""
    tiny = ["--quick", "--outage", "2", "--loops", "5", "--fastfail-calls", "30"]
    tiny += ["--normal-calls", "10", "--overhead-calls", "20", "--redis-url", redis_url]
    stdout = run_bench("breaker.py", *tiny)
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in stdout
    for row in ("client fast fail while open", "calls reaching a service", "per breaker check"):
        assert row in stdout
    assert "command: `" in stdout and "--outage 2" in stdout
