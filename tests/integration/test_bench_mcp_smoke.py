"""The MCP front benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_quick_mcp_front_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    stdout = run_bench("mcp_front.py", "--quick", "--redis-url", redis_url)
    assert "| MCP HTTP, run guard | p50 ms |" in stdout
    assert "| MCP stdio, run guard | p50 ms |" in stdout
    assert "adds" in stdout and "command: `" in stdout and "--quick" in stdout
