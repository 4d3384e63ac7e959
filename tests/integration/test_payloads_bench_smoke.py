"""The payload benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "payloads.py"

pytestmark = pytest.mark.integration


def test_a_small_payload_benchmark_exits_0_and_prints_its_table(redis_url: str) -> None:
    """Given the test Redis, when `bench/payloads.py --quick --max-size-mb 1` runs, then it
    prints the report with the message sizes measured off Redis."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--max-size-mb", "1", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| scenario | metric | baseline | toolexec | ratio | target | result |" in done.stdout
    assert "| 1 MB | backend value / reply entry |" in done.stdout
    assert "command: `" in done.stdout and "--max-size-mb 1" in done.stdout
