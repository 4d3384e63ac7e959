"""``bench/fairness.py`` runs end to end and prints its tables; its figures are never asserted."""

from __future__ import annotations

from integration_support import BENCH_MARKS, run_bench

pytestmark = BENCH_MARKS


def test_dispatch_bench_prints_the_plain_baseline_and_each_key_count() -> None:
    stdout = run_bench("fairness.py", "dispatch", "--messages", "300")
    assert "| plain queue (LMOVE), baseline | 300 |" in stdout
    assert "| lanes, 10,000 active keys | 300 |" in stdout
    assert "command: `" in stdout


def test_shares_bench_prints_a_row_per_weight() -> None:
    stdout = run_bench("fairness.py", "shares", "--seconds", "2", "--backlog", "60")
    for key, weight in (("w1", "1"), ("w2", "2"), ("w4", "4")):
        assert f"| {key} | {weight} |" in stdout
