"""The payload benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_a_small_payload_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    """Given the test Redis, when `bench/payloads.py --quick --max-size-mb 1` runs, then it
    prints the report with the message sizes measured off Redis."""
    stdout = run_bench("payloads.py", "--quick", "--max-size-mb", "1", "--redis-url", redis_url)
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in stdout
    assert "| 1 MB | backend value / reply entry |" in stdout
    assert "command: `" in stdout and "--max-size-mb 1" in stdout
