"""bench/idempotency.py still runs end to end; its timing figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "idempotency.py"

pytestmark = pytest.mark.integration


def test_quick_idempotency_benchmark_prints_its_table_with_no_duplicate(redis_url: str) -> None:
    """Given the test Redis, when `bench/idempotency.py --quick` runs, then it reports 0 dups."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--calls", "20", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in done.stdout
    assert "| duplicate writes | - | 0 | 0.00x | 0 | PASS |" in done.stdout
    assert "| calls not ok by their deadline | - | 0 | 0.00x | 0 | PASS |" in done.stdout
    assert "command: `" in done.stdout and "--quick" in done.stdout
