"""The retry-storm benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "storm.py"

pytestmark = pytest.mark.integration


def test_quick_storm_benchmark_exits_0_and_prints_its_tables(redis_url: str) -> None:
    """Given the test Redis, when `bench/storm.py --quick` runs, then it prints every part."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for header in (
        "## (a) simulation, mean calls",
        "## (b) the same contention through toolexec workers",
        "## (c) an outage under steady load",
        "| N | none | exponential | equal | full | decorrelated |",
        "| N | backoff | calls at the service |",
        "| setup | agent calls | calls at the service | amplification |",
    ):
        assert header in done.stdout, header
    assert "command: `" in done.stdout and "--quick" in done.stdout
