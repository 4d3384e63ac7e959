"""The overhead benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

import pytest
from integration_support import run_bench

pytestmark = pytest.mark.integration


def test_quick_overhead_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    """Given the test Redis, when `bench/overhead.py --quick` runs, then it prints the report."""
    stdout = run_bench("overhead.py", "--quick", "--redis-url", redis_url)
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in stdout
    assert "command: `" in stdout and "--quick" in stdout
