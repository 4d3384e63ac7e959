"""The overhead benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "overhead.py"

pytestmark = pytest.mark.integration


def test_quick_overhead_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    """Given the test Redis, when `bench/overhead.py --quick` runs, then it prints the report."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in done.stdout
    assert "command: `" in done.stdout and "--quick" in done.stdout
