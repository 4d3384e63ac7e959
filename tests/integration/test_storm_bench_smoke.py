"""The retry-storm benchmark still runs end to end; its figures are never asserted here."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_quick_storm_benchmark_exits_0_and_prints_its_tables(redis_url: str) -> None:
    """Given the test Redis, when `bench/storm.py --quick` runs, then it prints every part."""
    stdout = run_bench("storm.py", "--quick", "--redis-url", redis_url)
    for header in (
        "## (a) simulation, mean calls",
        "## (b) the same contention through toolexec workers",
        "## (c) an outage under steady load",
        "## (d) the default defences: a blip and an outage",
        "| N | none | exponential | equal | full | decorrelated |",
        "| N | backoff | calls at the service |",
        "| setup | agent calls | calls at the service | amplification |",
        "| batch | ok | requests at the service | per call |",
    ):
        assert header in stdout, header
    assert "command: `" in stdout and "--quick" in stdout
