"""What toolexec costs over bare Celery, measured in one run on one worker.

Three scenarios, each run for a few rounds with the baseline and toolexec
alternating, on the same Redis and the same worker process (bench_tools.py
holds both the tools and the bare tasks):

1. sequential round trip of a no-op: ``noop.delay().get()`` with Celery's
   Redis result backend vs ``ToolClient.call`` (validation, catalog, reply
   list); target: toolexec p50 <= 1.15x bare Celery;
2. throughput of a burst of calls: bare ``delay()`` one by one, then
   ``get()`` each, vs ``ToolClient.call_many``; target: >= 2x bare Celery;
3. fan-out of sleeping calls over the worker's slots with ``call_many`` vs
   the ideal (waves x sleep); target: <= 1.3x ideal.

Usage: ``python bench/overhead.py [--quick] [--redis-url URL] [...]``; see
``--help``. The process exits 0 whatever the figures (``--strict`` exits 1
when a target is missed), and non-zero when a call fails.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from _common import (
    CpuMeter,
    Row,
    forget,
    interleave,
    machine_info,
    median,
    percentile,
    print_report,
    progress,
    redis_server,
    require,
    run_settings,
    timed,
    worker,
)
from celery import Celery

from toolexec.app import celery_config
from toolexec.client import ToolClient
from toolexec.settings import Settings

LATENCY_TARGET = 1.15
THROUGHPUT_TARGET = 2.0
FANOUT_TARGET = 1.3
CORES = os.cpu_count() or 1
CALL_TIMEOUT_S = 600.0  # a stuck worker ends the run instead of hanging it


@dataclass(frozen=True)
class Config:
    calls: int = 500
    warmup: int = 50
    throughput_calls: int = 5000
    fanout_calls: int = 200
    fanout_sleep: float = 0.2
    rounds: int = 3
    concurrency: int = 100
    pool: str = "threads"
    redis_url: str | None = None
    task_events: bool = True
    strict: bool = False


QUICK: dict[str, Any] = {"calls": 50, "warmup": 10, "throughput_calls": 500, "rounds": 1}


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help=f"a fast, smaller run: {QUICK}")
    add("--calls", type=int, help="sequential calls per side per round (500)")
    add("--warmup", type=int, help="unmeasured calls per side first (50)")
    add("--throughput-calls", type=int, help="calls in each burst (5000)")
    add("--fanout-calls", type=int, help="sleeping calls in each fan-out (200)")
    add("--fanout-sleep", type=float, help="seconds each fan-out call sleeps (0.2)")
    add("--rounds", type=int, help="rounds per scenario, baseline and toolexec alternating (3)")
    add("--concurrency", type=int, help="worker slots (100)")
    add("--pool", choices=["threads", "prefork", "solo"], help="worker pool (threads)")
    add("--redis-url", help="use this server instead of a fresh embedded Valkey")
    add(
        "--task-events",
        action=argparse.BooleanOptionalAction,
        help="Celery task events for Flower, on both sides (on, as toolexec ships)",
    )
    add("--strict", action="store_true", help="exit 1 when a target is missed")
    args = vars(parser.parse_args(argv))
    config = replace(Config(), **QUICK) if args.pop("quick") else Config()
    given = {name: value for name, value in args.items() if value is not None}
    return replace(config, **given)


class BareCelery:
    """The baseline: plain Celery tasks on toolexec's settings, results in the backend."""

    def __init__(self, settings: Settings, result_ids: list[str]) -> None:
        self.app = Celery("bench-bare", set_as_current=False)
        self.app.conf.update({**celery_config(settings), "task_ignore_result": False})
        # Client-side handles of the tasks bench_tools.py defines on the worker.
        self.noop = self.app.task(name="bench.noop")(_runs_on_the_worker)
        self.sleep = self.app.task(name="bench.sleep")(_sleeps_on_the_worker)
        self.result_ids = result_ids  # to delete from the server afterwards

    def round_trip(self) -> float:
        start = time.perf_counter()
        pending = self.noop.delay()
        result = pending.get(timeout=CALL_TIMEOUT_S)
        seconds = time.perf_counter() - start
        self.result_ids.append(pending.id)
        require(result is None, f"bench.noop returned {result!r}")
        return seconds

    def burst(self, calls: int) -> float:
        return self._send_and_wait(lambda: self.noop.delay(), calls)

    def fanout(self, calls: int, sleep: float) -> float:
        return self._send_and_wait(lambda: self.sleep.delay(sleep), calls)

    def _send_and_wait(self, send: Callable[[], Any], calls: int) -> float:
        """Seconds from the first send until every result is in."""
        start = time.perf_counter()
        pending = [send() for _ in range(calls)]
        for result in pending:
            result.get(timeout=CALL_TIMEOUT_S)  # raises if the task failed
        seconds = time.perf_counter() - start
        self.result_ids += [r.id for r in pending]
        return seconds

    def close(self) -> None:
        self.app.close()


def _runs_on_the_worker() -> None:
    raise AssertionError("bench.noop runs on the worker, never in the benchmark process")


def _sleeps_on_the_worker(seconds: float) -> float:
    raise AssertionError("bench.sleep runs on the worker, never in the benchmark process")


class Toolexec:
    """The full toolexec path: client-side validation, catalog, routing, reply lists."""

    def __init__(self, settings: Settings) -> None:
        self.client = ToolClient(settings)

    def round_trip(self) -> float:
        seconds, result = timed(lambda: self.client.call("bench_noop", {}))
        require(result.ok, f"bench_noop failed: {result}")
        return seconds

    def burst(self, calls: int) -> float:
        return self._run_all([("bench_noop", {})] * calls)

    def fanout(self, calls: int, sleep: float) -> float:
        return self._run_all([("bench_sleep", {"seconds": sleep})] * calls)

    def _run_all(self, calls: list[tuple[str, dict[str, Any]]]) -> float:
        seconds, results = timed(lambda: self.client.call_many(calls, timeout=CALL_TIMEOUT_S))
        failed = [r for r in results if not r.ok]
        require(not failed, f"{len(failed)} call(s) failed, e.g. {failed[:1]}")
        return seconds

    def close(self) -> None:
        self.client.close()
        self.client.app.close()


def _sequential(round_trip: Callable[[], float], calls: int) -> list[float]:
    return [round_trip() for _ in range(calls)]


def _ratios(top: list[float], bottom: list[float]) -> str:
    return ", ".join(f"{a / b:.2f}" for a, b in zip(top, bottom, strict=True))


@dataclass(frozen=True)
class Bench:
    """One run's configuration, both contenders and the processes whose CPU is watched."""

    cfg: Config
    bare: BareCelery
    tx: Toolexec
    pids: dict[str, int]


def latency(b: Bench) -> tuple[list[Row], list[str]]:
    cfg = b.cfg
    progress(f"sequential: {cfg.rounds} round(s) of {cfg.calls} calls per side")
    _sequential(b.bare.round_trip, cfg.warmup)
    _sequential(b.tx.round_trip, cfg.warmup)
    runs = interleave(
        cfg.rounds,
        {
            "bare": lambda: _sequential(b.bare.round_trip, cfg.calls),
            "toolexec": lambda: _sequential(b.tx.round_trip, cfg.calls),
        },
    )
    pooled = {side: [s for run in samples for s in run] for side, samples in runs.items()}
    scenario = f"sequential no-op round trip ({len(pooled['bare'])} calls per side)"
    rows = []
    for q, target in ((50, LATENCY_TARGET), (99, None)):
        ms = {side: percentile(samples, q) * 1000 for side, samples in pooled.items()}
        ratio = ms["toolexec"] / ms["bare"]
        rows.append(
            Row(
                scenario,
                f"p{q} ms",
                f"{ms['bare']:.2f}",
                f"{ms['toolexec']:.2f}",
                ratio,
                f"<= {target}x" if target else "-",
                (ratio <= target) if target else None,
            )
        )
    p50s = {side: [percentile(run, 50) for run in samples] for side, samples in runs.items()}
    note = f"sequential p50 ratio per round: {_ratios(p50s['toolexec'], p50s['bare'])}"
    return rows, [note]


def throughput(b: Bench) -> tuple[list[Row], list[str]]:
    n = b.cfg.throughput_calls
    progress(f"throughput: {b.cfg.rounds} round(s) of {n} calls per side")
    meters, runs = _metered(b, lambda: b.bare.burst(n), lambda: b.tx.burst(n))
    rate = {side: n / median(seconds) for side, seconds in runs.items()}
    ratio = rate["toolexec"] / rate["bare"]
    row = Row(
        f"throughput, {n} no-op calls (bare: delay() each then get(); toolexec: call_many)",
        "calls/s",
        f"{rate['bare']:.0f}",
        f"{rate['toolexec']:.0f}",
        ratio,
        f">= {THROUGHPUT_TARGET}x",
        ratio >= THROUGHPUT_TARGET,
    )
    notes = [f"throughput ratio per round: {_ratios(runs['bare'], runs['toolexec'])}"]
    if meters["bare"].spent:
        calls = n * b.cfg.rounds
        notes.append(
            f"throughput CPU ms per call: {_cpu_per_call(meters, calls)}. All of it shares "
            f"{CORES} core(s), so at most "
            + ", ".join(
                f"{side} {CORES / m.total_per_call_s(calls):.0f} calls/s"
                for side, m in meters.items()
            )
        )
    return [row], notes


def _metered(
    b: Bench, bare: Callable[[], float], toolexec: Callable[[], float]
) -> tuple[dict[str, CpuMeter], dict[str, list[float]]]:
    """Each side's seconds per round, interleaved, and the CPU each process spent on it."""
    meters = {"bare": CpuMeter(b.pids), "toolexec": CpuMeter(b.pids)}
    runs = interleave(
        b.cfg.rounds,
        {
            "bare": lambda: meters["bare"].measure(bare),
            "toolexec": lambda: meters["toolexec"].measure(toolexec),
        },
    )
    return meters, runs


def _cpu_per_call(meters: dict[str, CpuMeter], calls: int) -> str:
    return "; ".join(f"{side}: {m.per_call_ms(calls)}" for side, m in meters.items())


def fanout(b: Bench) -> tuple[list[Row], list[str]]:
    cfg, n, sleep = b.cfg, b.cfg.fanout_calls, b.cfg.fanout_sleep
    progress(f"fan-out: {cfg.rounds} round(s) of {n} x {sleep} s per side")
    ideal = math.ceil(n / cfg.concurrency) * sleep
    meters, runs = _metered(b, lambda: b.bare.fanout(n, sleep), lambda: b.tx.fanout(n, sleep))
    wall = {side: median(seconds) for side, seconds in runs.items()}
    ratio = wall["toolexec"] / ideal
    row = Row(
        f"fan-out, {n} calls x {sleep} s on {cfg.concurrency} slots (call_many vs ideal)",
        "wall s",
        f"{ideal:.3f} (ideal)",
        f"{wall['toolexec']:.3f}",
        ratio,
        f"<= {FANOUT_TARGET}x",
        ratio <= FANOUT_TARGET,
    )
    notes = [
        f"fan-out wall s per round: toolexec {_rounded(runs['toolexec'])}, "
        f"bare Celery {_rounded(runs['bare'])} (bare median {wall['bare'] / ideal:.2f}x ideal)"
    ]
    if meters["toolexec"].spent:
        calls = n * cfg.rounds
        floor = n * meters["toolexec"].total_per_call_s(calls) / CORES
        notes.append(
            f"fan-out CPU ms per call: {_cpu_per_call(meters, calls)}; toolexec's {n} calls "
            f"need {floor:.3f} s of all {CORES} core(s) besides the sleeping"
        )
    return [row], notes


def _rounded(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def run(
    cfg: Config, settings: Settings, pids: dict[str, int], result_ids: list[str]
) -> tuple[list[Row], list[str]]:
    """Every scenario's rows and notes; the baseline's results are listed in ``result_ids``."""
    b = Bench(cfg, BareCelery(settings, result_ids), Toolexec(settings), pids)
    try:
        rows: list[Row] = []
        notes: list[str] = []
        for scenario in (latency, throughput, fanout):
            more_rows, more_notes = scenario(b)
            rows += more_rows
            notes += more_notes
        return rows, notes
    finally:
        b.bare.close()
        b.tx.close()


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    with redis_server(cfg.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
        settings = run_settings(server.url, Path(tmp), task_events=cfg.task_events)
        log_path = Path(tmp) / "worker.log"
        progress(f"starting a {cfg.pool} worker with {cfg.concurrency} slots on {server.url}")
        result_ids: list[str] = []
        try:
            with worker(
                settings,
                "bench_tools",
                concurrency=cfg.concurrency,
                pool=cfg.pool,
                log_path=log_path,
            ) as proc:
                assert proc.process is not None
                pids = {"worker": proc.process.pid, "caller": os.getpid()}
                if server.pid is not None:
                    pids["server"] = server.pid
                rows, notes = run(cfg, settings, pids, result_ids)
        finally:
            forget(server.url, settings, result_ids)
        info = machine_info(server.url)
    notes = [
        f"worker: {cfg.pool} pool, {cfg.concurrency} slots, one process serving both sides, "
        f"task events {'on' if cfg.task_events else 'off'}; "
        f"{cfg.rounds} round(s) per scenario, baseline and toolexec alternating; "
        f"{cfg.warmup} warm-up calls per side",
        *notes,
    ]
    print_report("toolexec overhead vs bare Celery", rows, info, notes)
    missed = [row for row in rows if row.passed is False]
    return 1 if cfg.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
