"""What toolexec costs over plain Celery as a user runs it, side by side in one run.

The baseline is honest: plain Celery is its own app (bench/plain_app.py, default
settings, JSON, Redis broker and result backend) served by its own
``celery -A plain_app worker -P threads -c 8`` process, once without and once
with ``-E`` (task events, as Flower needs), called with ``task.delay().get()``.
toolexec is ``ToolClient.call`` / ``call_many`` against a
``toolexec worker -P threads -c 8`` (every default layer on). Each side has a
Redis server of its own (a fresh Valkey), so that its command counts and its
server's CPU are its own, and the rounds of the sides are interleaved, the
order reversed every other round, so machine noise hits them all.

Figures: sequential round trip p50/p95; a burst of N no-ops (``delay()`` each
then ``get()`` each, vs ``call_many``); a fan-out of 200 calls x 0.2 s on 100
thread slots (a second worker per side, on a queue of its own) vs the ideal;
Redis commands per call (``INFO commandstats`` deltas); CPU seconds per call of
worker, caller and server (``/proc``). With ``--peers`` (extra ``[bench]``),
Dramatiq runs the same no-op afterwards (arq cannot share kombu's redis-py).

Usage: ``python bench/overhead.py [--quick] [--rounds N] [--peers] [--only fanout,burst]``; see
``--help``. The process exits 0 whatever the figures (``--strict`` exits 1
when a target is missed), and non-zero when a call fails.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import plain_app
import redis
from _common import (
    BENCH_DIR,
    command_line,
    cpu_seconds,
    interleave,
    machine_info,
    markdown_table,
    median,
    percentile,
    progress,
    require,
    run_settings,
    spawn,
    tree_cpu_seconds,
    worker,
)

from toolexec.client import ToolClient
from toolexec.embedded import ensure_embedded, stop_embedded
from toolexec.settings import Settings

LATENCY_TARGET = 1.15
BURST_TARGET = 1.5
FANOUT_TARGET = 1.3
CALL_TIMEOUT_S = 600.0  # a stuck worker ends the run instead of hanging it
FANOUT_QUEUE = "bench-fanout"  # bench_tools.bench_fanout_sleep's queue
#: The figures a run can be limited to (``--only``); the commands and CPU per call are
#: measured with the sequential and burst rounds they belong to.
FIGURES = frozenset({"sequential", "burst", "fanout"})


@dataclass(frozen=True)
class Config:
    calls: int = 300
    warmup: int = 30
    burst_calls: int = 2000
    fanout_calls: int = 200
    fanout_sleep: float = 0.2
    fanout_slots: int = 100
    rounds: int = 3
    concurrency: int = 8
    peers: bool = False
    strict: bool = False
    only: frozenset[str] = FIGURES
    processes: int = 1


QUICK: dict[str, Any] = {
    "calls": 30,
    "warmup": 5,
    "burst_calls": 100,
    "fanout_calls": 20,
    "fanout_sleep": 0.05,
    "fanout_slots": 10,
    "rounds": 1,
}


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help=f"a fast, smaller run: {QUICK}")
    add("--calls", type=int, help="sequential calls per side per round (300)")
    add("--warmup", type=int, help="unmeasured calls per side first (30)")
    add("--burst-calls", type=int, help="no-op calls in each burst (2000)")
    add("--fanout-calls", type=int, help="sleeping calls in each fan-out (200)")
    add("--fanout-sleep", type=float, help="seconds each fan-out call sleeps (0.2)")
    add("--fanout-slots", type=int, help="thread slots of the fan-out workers (100)")
    add("--rounds", type=int, help="rounds per figure, the sides interleaved (3)")
    add("--concurrency", type=int, help="thread slots of the no-op workers (8)")
    add("--peers", action="store_true", help="Dramatiq on the same no-op too (extra [bench])")
    add("--processes", type=int, help="toolexec worker processes (--processes N; 1)")
    add("--strict", action="store_true", help="exit 1 when a target is missed")
    add(
        "--only",
        type=_figures,
        help="comma-separated figures to measure, of " + ",".join(sorted(FIGURES)) + " (all)",
    )
    args = vars(parser.parse_args(argv))
    config = replace(Config(), **QUICK) if args.pop("quick") else Config()
    given = {name: value for name, value in args.items() if value not in (None, False)}
    return replace(config, **given)


def _figures(text: str) -> frozenset[str]:
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = chosen - FIGURES
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {', '.join(sorted(FIGURES))}")
    return chosen


# -- what is measured around every round --------------------------------------------


def command_counts(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the server started (``INFO commandstats``)."""
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def load_average() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return float(Path("/proc/loadavg").read_text().split()[0])
    return float("nan")


def _cpu(name: str, pid: int) -> float | None:
    """A party's CPU seconds: a worker's with its processes', the others' own alone.

    The client is this process, whose children are the workers: never summed.
    """
    return tree_cpu_seconds(pid) if name == "worker" else cpu_seconds(pid)


@dataclass
class Meter:
    """What one side spent over its rounds: CPU per process and server commands."""

    pids: dict[str, int]
    server: redis.Redis
    cpu: dict[str, float] = field(default_factory=dict)
    commands: dict[str, int] = field(default_factory=dict)
    calls: int = 0

    def measure(self, calls: int, func: Callable[[], Any]) -> Any:
        before_cpu = {name: _cpu(name, pid) for name, pid in self.pids.items()}
        before_cmd = command_counts(self.server)
        value = func()
        after_cmd = command_counts(self.server)
        for name, pid in self.pids.items():
            start, end = before_cpu[name], _cpu(name, pid)
            if start is not None and end is not None:
                self.cpu[name] = self.cpu.get(name, 0.0) + end - start
        for name, count in after_cmd.items():
            # INFO itself is counted once per measurement; leave it out
            delta = count - before_cmd.get(name, 0) - (name == "info")
            if delta:
                self.commands[name] = self.commands.get(name, 0) + delta
        self.calls += calls
        return value

    def cpu_ms(self, name: str) -> float:
        return 1000 * self.cpu.get(name, float("nan")) / max(1, self.calls)

    def commands_per_call(self) -> float:
        return sum(self.commands.values()) / max(1, self.calls)

    def top_commands(self, n: int = 8) -> str:
        ranked = sorted(self.commands.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{name} {count / max(1, self.calls):.1f}" for name, count in ranked)


# -- the sides ------------------------------------------------------------------------


class Side(Protocol):
    name: str
    pids: dict[str, int]
    server: redis.Redis

    def round_trip(self) -> float: ...
    def burst(self, calls: int) -> float: ...
    def fanout(self, calls: int, sleep: float) -> float: ...


@dataclass(frozen=True)
class Server:
    url: str
    pid: int


@contextlib.contextmanager
def own_server() -> Iterator[Server]:
    """A fresh Valkey on a free loopback port, for one side only."""
    with tempfile.TemporaryDirectory(prefix="toolexec-bench-") as tmp:
        embedded = ensure_embedded(Path(tmp))
        try:
            yield Server(embedded.url, embedded.pid)
        finally:
            stop_embedded(Path(tmp))


@contextlib.contextmanager
def celery_worker(url: str, *, queue: str, slots: int, events: bool) -> Iterator[int]:
    """``celery -A plain_app worker -P threads -c N [-E]``, exactly as a user types it."""
    argv = [sys.executable, "-m", "celery", "-A", "plain_app", "worker", "-P", "threads"]
    argv += ["-c", str(slots), "-Q", queue, "-n", f"plain-{uuid.uuid4().hex[:6]}@%h"]
    argv += ["--loglevel", "WARNING", *(["-E"] if events else [])]
    env = {**os.environ, "PLAIN_CELERY_URL": url, "PYTHONPATH": str(BENCH_DIR)}
    with spawn(argv, env) as proc:
        yield proc.pid


class PlainCelery:
    """``task.delay().get()`` on plain_app, results through the Redis result backend."""

    def __init__(self, name: str, server: Server, events: bool) -> None:
        self.name, self.events = name, events
        self.app = plain_app.make_app(server.url)
        self.noop = self.app.tasks["plain_app.noop"]
        self.sleep = self.app.tasks["plain_app.sleep"]
        self.server = redis.Redis.from_url(server.url)
        self.pids = {"server": server.pid, "client": os.getpid()}
        self.url = server.url

    @contextlib.contextmanager
    def workers(self, slots: int, fanout: bool) -> Iterator[None]:
        queue = plain_app.FANOUT_QUEUE if fanout else "celery"
        with celery_worker(self.url, queue=queue, slots=slots, events=self.events) as pid:
            self.pids["worker"] = pid
            # ready once it answers (a fresh worker takes a few seconds to start)
            (self.sleep.delay(0.0) if fanout else self.noop.delay()).get(timeout=60)
            yield

    def round_trip(self) -> float:
        start = time.perf_counter()
        self.noop.delay().get(timeout=CALL_TIMEOUT_S)
        return time.perf_counter() - start

    def burst(self, calls: int) -> float:
        return self._send_and_wait(lambda: self.noop.delay(), calls)

    def fanout(self, calls: int, sleep: float) -> float:
        return self._send_and_wait(lambda: self.sleep.delay(sleep), calls)

    @staticmethod
    def _send_and_wait(send: Callable[[], Any], calls: int) -> float:
        start = time.perf_counter()
        pending = [send() for _ in range(calls)]
        for result in pending:
            result.get(timeout=CALL_TIMEOUT_S)  # raises if the task failed
        return time.perf_counter() - start

    def close(self) -> None:
        self.app.close()
        self.server.close()


class Toolexec:
    """``ToolClient.call`` / ``call_many`` against ``toolexec worker``, every default layer on."""

    name = "toolexec"

    def __init__(self, server: Server, data_dir: Path, processes: int = 1) -> None:
        self.settings: Settings = run_settings(server.url, data_dir, task_events=True)
        self.processes = processes
        self.client = ToolClient(self.settings)
        self.server = redis.Redis.from_url(server.url)
        self.pids = {"server": server.pid, "client": os.getpid()}
        self.log = data_dir / "worker.log"

    @contextlib.contextmanager
    def workers(self, slots: int, fanout: bool) -> Iterator[None]:
        queue = FANOUT_QUEUE if fanout else self.settings.default_queue
        with worker(
            self.settings,
            "bench_tools",
            concurrency=max(1, slots // self.processes),  # the same slots in all
            pool="threads",
            log_path=self.log,
            queues=queue,
            processes=self.processes,
        ) as proc:
            assert proc.process is not None
            self.pids["worker"] = proc.process.pid
            yield

    def round_trip(self) -> float:
        start = time.perf_counter()
        result = self.client.call("bench_noop", {}, timeout=CALL_TIMEOUT_S)
        seconds = time.perf_counter() - start
        require(result.ok, f"bench_noop failed: {result}")
        return seconds

    def burst(self, calls: int) -> float:
        return self._run_all([("bench_noop", {})] * calls)

    def fanout(self, calls: int, sleep: float) -> float:
        return self._run_all([("bench_fanout_sleep", {"seconds": sleep})] * calls)

    def _run_all(self, calls: list[tuple[str, dict[str, Any]]]) -> float:
        start = time.perf_counter()
        results = self.client.call_many(calls, timeout=CALL_TIMEOUT_S)
        seconds = time.perf_counter() - start
        failed = [r for r in results if not r.ok]
        require(not failed, f"{len(failed)} call(s) failed, e.g. {failed[:1]}")
        return seconds

    def close(self) -> None:
        self.client.close()
        self.client.app.close()
        self.server.close()


# -- the figures ----------------------------------------------------------------------


@dataclass
class Figures:
    """Everything measured of one side."""

    latencies: list[float] = field(default_factory=list)
    bursts: list[float] = field(default_factory=list)
    fanouts: list[float] = field(default_factory=list)
    seq_meter: Meter | None = None
    burst_meter: Meter | None = None


def _sequential(side: Side, meter: Meter, calls: int) -> list[float]:
    return list(meter.measure(calls, lambda: [side.round_trip() for _ in range(calls)]))


def measure_noops(cfg: Config, sides: Sequence[Side], out: dict[str, Figures]) -> None:
    """Sequential round trips, then bursts, each in interleaved rounds (those asked for)."""
    for side in sides:
        for _ in range(cfg.warmup):
            side.round_trip()
        out[side.name].seq_meter = Meter(dict(side.pids), side.server)
        out[side.name].burst_meter = Meter(dict(side.pids), side.server)
    if "sequential" in cfg.only:
        progress(f"sequential: {cfg.rounds} round(s) of {cfg.calls} calls per side")
        runs = interleave(
            cfg.rounds,
            {
                s.name: _bind(lambda s: _sequential(s, out[s.name].seq_meter, cfg.calls), s)
                for s in sides
            },
        )
        for name, samples in runs.items():
            out[name].latencies = [x for run in samples for x in run]
    if "burst" in cfg.only:
        n = cfg.burst_calls
        progress(f"burst: {cfg.rounds} round(s) of {n} no-ops per side")
        runs_b = interleave(
            cfg.rounds,
            {
                s.name: _bind(lambda s: out[s.name].burst_meter.measure(n, lambda: s.burst(n)), s)
                for s in sides
            },
        )
        for name, seconds in runs_b.items():
            out[name].bursts = seconds


def measure_fanout(cfg: Config, sides: Sequence[Side], out: dict[str, Figures]) -> None:
    n, sleep = cfg.fanout_calls, cfg.fanout_sleep
    progress(f"fan-out: {cfg.rounds} round(s) of {n} x {sleep} s per side")
    runs = interleave(cfg.rounds, {s.name: _bind(lambda s: s.fanout(n, sleep), s) for s in sides})
    for name, seconds in runs.items():
        out[name].fanouts = seconds


def _bind(func: Callable[[Any], Any], side: Side) -> Callable[[], Any]:
    return lambda: func(side)


# -- the report -----------------------------------------------------------------------

BASE = "plain -E"
HEADERS = ["figure", "plain Celery", "plain Celery -E", "toolexec", "toolexec / -E", "target"]


def _fmt(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _row(
    figure: str,
    values: dict[str, float],
    target: str = "-",
    ok: bool | None = None,
    digits: int = 2,
    ratio: float | None = None,
) -> list[str]:
    if ratio is None and values[BASE] > 0:
        ratio = values["toolexec"] / values[BASE]
    verdict = "" if ok is None else (" PASS" if ok else " FAIL")
    return [
        figure,
        _fmt(values["plain"], digits),
        _fmt(values[BASE], digits),
        _fmt(values["toolexec"], digits),
        # a baseline of 0 (a short run below /proc's 10 ms CPU tick) has no ratio
        "n/a" if ratio is None else f"{ratio:.2f}x",
        f"{target}{verdict}",
    ]


def _latency_rows(figs: dict[str, Figures]) -> tuple[list[list[str]], list[bool]]:
    rows = []
    ms = {k: 1000 * percentile(f.latencies, 50) for k, f in figs.items()}
    ok = ms["toolexec"] / ms[BASE] <= LATENCY_TARGET
    rows.append(_row("sequential round trip p50, ms", ms, "<= 1.15x", ok))
    ms = {k: 1000 * percentile(f.latencies, 95) for k, f in figs.items()}
    rows.append(_row("sequential round trip p95, ms", ms))
    return rows, [ok]


def _burst_rows(cfg: Config, figs: dict[str, Figures]) -> tuple[list[list[str]], list[bool]]:
    rate = {k: cfg.burst_calls / median(f.bursts) for k, f in figs.items()}
    ok = rate["toolexec"] / rate[BASE] >= BURST_TARGET
    figure = f"{cfg.burst_calls} no-ops: delay() each then get() each / call_many, calls/s"
    return [_row(figure, rate, ">= 1.5x", ok, 0)], [ok]


def _fanout_rows(cfg: Config, figs: dict[str, Figures]) -> tuple[list[list[str]], list[bool]]:
    ideal = math.ceil(cfg.fanout_calls / cfg.fanout_slots) * cfg.fanout_sleep
    wall = {k: median(f.fanouts) for k, f in figs.items()}
    ok = wall["toolexec"] / ideal <= FANOUT_TARGET
    figure = (
        f"fan-out {cfg.fanout_calls} x {cfg.fanout_sleep} s on {cfg.fanout_slots} slots, "
        f"wall s (ideal {ideal:.2f}; ratio vs ideal)"
    )
    return [_row(figure, wall, "<= 1.3x ideal", ok, 3, wall["toolexec"] / ideal)], [ok]


def _meter_rows(label: str, meters: dict[str, Meter]) -> tuple[list[list[str]], list[bool]]:
    per_call = {k: m.commands_per_call() for k, m in meters.items()}
    rows = [_row(f"Redis commands per call, {label}", per_call, digits=1)]
    for proc in ("worker", "client", "server"):
        cpu = {k: m.cpu_ms(proc) for k, m in meters.items()}
        rows.append(_row(f"CPU ms per call, {label}: {proc}", cpu))
    total = {k: sum(m.cpu_ms(p) for p in ("worker", "client", "server")) for k, m in meters.items()}
    if label != "burst":
        return [*rows, _row(f"CPU ms per call, {label}: total", total)], []
    ok = total["toolexec"] <= total[BASE]
    return [*rows, _row(f"CPU ms per call, {label}: total", total, "<= 1.0x", ok)], [ok]


def report_rows(cfg: Config, figs: dict[str, Figures]) -> tuple[list[list[str]], list[bool]]:
    """The table's rows for the figures measured, and whether each target was met."""
    parts = []
    if "sequential" in cfg.only:
        parts.append(_latency_rows(figs))
    if "burst" in cfg.only:
        parts.append(_burst_rows(cfg, figs))
    if "fanout" in cfg.only:
        parts.append(_fanout_rows(cfg, figs))
    for label, pick in (("sequential", "seq_meter"), ("burst", "burst_meter")):
        if label in cfg.only:
            parts.append(_meter_rows(label, {k: getattr(f, pick) for k, f in figs.items()}))
    rows = [row for part in parts for row in part[0]]
    return rows, [ok for part in parts for ok in part[1]]


def notes_for(cfg: Config, figs: dict[str, Figures], loads: list[float]) -> list[str]:
    notes = [
        f"{cfg.rounds} round(s) per figure, sides interleaved (order reversed every other "
        f"round), {cfg.warmup} warm-up calls per side; medians of the rounds for the burst "
        f"and the fan-out, percentiles over all rounds' calls for the round trip",
        "no-op workers: threads pool, "
        f"{cfg.concurrency} slots; fan-out workers: threads pool, {cfg.fanout_slots} slots; "
        "each side has its own Valkey; toolexec sends task events (worker and client), "
        "plain Celery -E worker events only, as Flower needs; toolexec worker processes: "
        f"{cfg.processes} (the slots shared among them; CPU: the processes' sum)",
        "load average (1 min) during the run: "
        + ", ".join(f"{x:.2f}" for x in loads)
        + f" on {os.cpu_count()} core(s), shared with other work: figures are noisy",
    ]
    for name, f in figs.items():
        notes.append(f"burst s per round, {name}: " + ", ".join(f"{x:.3f}" for x in f.bursts))
        notes.append(f"fan-out s per round, {name}: " + ", ".join(f"{x:.3f}" for x in f.fanouts))
        if f.burst_meter:
            notes.append(f"commands per call in the burst, {name}: {f.burst_meter.top_commands()}")
    return notes


def print_table(cfg: Config, figs: dict[str, Figures], loads: list[float], url: str) -> bool:
    rows, verdicts = report_rows(cfg, figs)
    print("\n## toolexec vs plain Celery, side by side\n")
    print(markdown_table(HEADERS, rows))
    print()
    for note in notes_for(cfg, figs, loads):
        print(f"- {note}")
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine_info(url)))
    sys.stdout.flush()
    return all(verdicts)


# -- the run --------------------------------------------------------------------------


def run(cfg: Config, stack: contextlib.ExitStack, tmp: Path) -> bool:
    servers = [stack.enter_context(own_server()) for _ in range(3)]
    plain = PlainCelery("plain", servers[0], events=False)
    plain_e = PlainCelery(BASE, servers[1], events=True)
    tx = Toolexec(servers[2], tmp, cfg.processes)
    sides: list[Any] = [plain, plain_e, tx]
    for side in sides:
        stack.callback(side.close)
    figs = {s.name: Figures() for s in sides}
    loads = [load_average()]
    if cfg.only & {"sequential", "burst"}:
        progress(f"starting three no-op workers ({cfg.concurrency} slots each)")
        with contextlib.ExitStack() as workers:
            for side in sides:
                workers.enter_context(side.workers(cfg.concurrency, fanout=False))
            measure_noops(cfg, sides, figs)
        loads.append(load_average())
    if "fanout" in cfg.only:
        progress(f"starting three fan-out workers ({cfg.fanout_slots} slots each)")
        with contextlib.ExitStack() as workers:
            for side in sides:
                workers.enter_context(side.workers(cfg.fanout_slots, fanout=True))
            measure_fanout(cfg, sides, figs)
        loads.append(load_average())
    passed = print_table(cfg, figs, loads, servers[2].url)
    if cfg.peers:
        from peers import run_peers

        peer = stack.enter_context(own_server())
        run_peers(peer.url, cfg.calls, cfg.burst_calls, cfg.rounds)
    return passed


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        passed = run(cfg, stack, Path(tmp))
    return 1 if cfg.strict and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
