"""bench/breaker.py still runs end to end; its figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "breaker.py"

pytestmark = pytest.mark.integration


def test_a_tiny_breaker_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    """Given the test Redis, when a tiny breaker benchmark runs, then it prints every row."""
    tiny = ["--quick", "--outage", "2", "--loops", "5", "--fastfail-calls", "30"]
    tiny += ["--normal-calls", "10", "--overhead-calls", "20", "--redis-url", redis_url]
    done = subprocess.run(
        [sys.executable, str(BENCH), *tiny], capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in done.stdout
    for row in ("client fast fail while open", "calls reaching a service", "per breaker check"):
        assert row in done.stdout
    assert "command: `" in done.stdout and "--outage 2" in done.stdout
