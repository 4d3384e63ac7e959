"""bench/observability.py still runs end to end; its figures are never asserted here."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_quick_observability_benchmark_reports_tracing_on_and_off(redis_url: str) -> None:
    """`bench/observability.py --quick --tracing-only` runs agents traced and untraced."""
    stdout = run_bench("observability.py", "--quick", "--tracing-only", "--redis-url", redis_url)
    assert "p50 ms, sampling 10 %" in stdout and "p50 ms, untraced worker B vs A (A/A)" in stdout
    spans = int(stdout.split(" spans received over OTLP/HTTP")[0].rsplit("- ", 1)[1])
    assert spans > 0  # the traced agents and worker did export
