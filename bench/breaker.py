"""What a circuit breaker buys and costs, measured in one run on a real worker.

1. Fast fail: ``ToolClient.call`` of a tool whose breaker is open (refused by
   the client's pre-check, no queue round trip) next to a normal call of a
   healthy tool; target: fast-fail p99 <= 2 ms.
2. An outage: a local service answers 503 to everything for ``--outage``
   seconds (30) while 50 agent loops call it (one call, a think time, the next
   call); the same three attempts with the breaker and without. Counted at
   the service. Target: once the breaker is open, the service sees only the
   half-open probes (at most K per half-open period).
3. Closed-state overhead: Redis round trips per call (``INFO commandstats``
   deltas of EVALSHA over sequential calls, a breaker-guarded no-op against a
   bare one; a fast-failed call gives the client's share) and the p50 delta;
   target: one round trip per breaker check.

Usage: ``python bench/breaker.py [--quick] [--outage S] [--redis-url URL]``;
see ``--help``. Exits 0 whatever the figures (``--strict``: 1 when a target
is missed), and non-zero when a call ends in a way it must not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import redis
from _common import (
    Row,
    forget,
    interleave,
    machine_info,
    percentile,
    print_report,
    progress,
    redis_server,
    require,
    run_settings,
    worker,
)
from breaker_bench_tools import OUTAGE_BREAKER

from toolexec.breaker import BreakerState, CircuitBreaker
from toolexec.client import ToolClient
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Hit, Reply

FAST_FAIL_P99_MS = 2.0
ROUND_TRIPS_PER_CHECK = 1.0


@dataclass(frozen=True)
class Config:
    fastfail_calls: int = 2000
    normal_calls: int = 300
    overhead_calls: int = 500
    rounds: int = 3
    outage_s: float = 30.0
    loops: int = 50
    think_s: float = 0.2
    concurrency: int = 64
    redis_url: str | None = None
    strict: bool = False


QUICK: dict[str, Any] = {
    "fastfail_calls": 300,
    "normal_calls": 50,
    "overhead_calls": 100,
    "rounds": 1,
    "outage_s": 8.0,
}


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help=f"a fast, smaller run: {QUICK}")
    add("--fastfail-calls", type=int, help="fast-failed calls measured (2000)")
    add("--normal-calls", type=int, help="normal calls measured next to them (300)")
    add("--overhead-calls", type=int, help="sequential calls per side per round (500)")
    add("--rounds", type=int, help="overhead rounds, guarded and bare alternating (3)")
    add("--outage", dest="outage_s", type=float, help="seconds the service is down (30)")
    add("--loops", type=int, help="concurrent agent loops during the outage (50)")
    add("--think", dest="think_s", type=float, help="seconds an agent thinks between calls (0.2)")
    add("--concurrency", type=int, help="worker slots (64)")
    add("--redis-url", help="use this server instead of a fresh embedded Valkey")
    add("--strict", action="store_true", help="exit 1 when a target is missed")
    args = vars(parser.parse_args(argv))
    config = replace(Config(), **QUICK) if args.pop("quick") else Config()
    return replace(config, **{k: v for k, v in args.items() if v is not None})


def _kind(result: ToolResult) -> str:
    return "ok" if result.error is None else str(result.error.type)


def _latencies(call: Callable[[], ToolResult], calls: int, expect: str) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        result = call()
        out.append(time.perf_counter() - start)
        require(_kind(result) == expect, f"expected {expect}, got {result}")
    return out


@dataclass(frozen=True)
class Bench:
    cfg: Config
    client: ToolClient
    redis: redis.Redis
    breakers: CircuitBreaker


# -- 1. fast fail -------------------------------------------------------------------


def fast_fail(b: Bench) -> tuple[list[Row], list[str]]:
    cfg = b.cfg
    progress(f"fast fail: {cfg.fastfail_calls} calls of an open breaker, {cfg.normal_calls} normal")
    b.breakers.trip("tripped_noop")  # isolated until reset: open for the whole measurement

    def refused() -> ToolResult:
        return b.client.call("tripped_noop", {})

    def normal() -> ToolResult:
        return b.client.call("breaker_noop", {})

    _latencies(refused, 300, "circuit_open")  # warm-up: connections, caches, the catalog
    _latencies(normal, 30, "ok")
    samples = {
        "fast": _latencies(refused, cfg.fastfail_calls, "circuit_open"),
        "normal": _latencies(normal, cfg.normal_calls, "ok"),
    }
    rows = []
    for q in (50, 99):
        ms = {side: percentile(s, q) * 1000 for side, s in samples.items()}
        target = q == 99
        rows.append(
            Row(
                "client fast fail while open (baseline: a normal call, breaker closed)",
                f"p{q} ms",
                f"{ms['normal']:.2f}",
                f"{ms['fast']:.2f}",
                ms["fast"] / ms["normal"],
                f"<= {FAST_FAIL_P99_MS} ms" if target else "-",
                ms["fast"] <= FAST_FAIL_P99_MS if target else None,
            )
        )
    b.breakers.reset("tripped_noop")
    return rows, []


# -- 2. an outage -------------------------------------------------------------------


@dataclass
class Outage:
    """One side's outage run, as the service and the agents saw it.

    ``started`` is, for each hit, when its tool body started (the tools send
    it along). The first open period also sees calls admitted just before the
    breaker opened that were still on their way (through the worker's other
    layers and a thread start) to the body; from the first half-open period
    on (``opened_at + open_s``), a body can only start as one of K probes.
    """

    started: list[float]
    calls: Counter[str]
    opened_at: float | None = None
    transitions: int = 0

    def started_between(self, start: float, end: float = float("inf")) -> list[float]:
        return [t for t in self.started if start <= t < end]


def _started(hits: list[Hit]) -> list[float]:
    return sorted(float(parse_qs(h.query)["started"][0]) for h in hits)


@contextmanager
def _watch_opening(b: Bench, name: str) -> Iterator[dict[str, float | int]]:
    """Note when ``name`` first opens (its transition time, Redis clock) and count transitions."""
    seen: dict[str, float | int] = {}
    start_gen = b.breakers.snapshot(name).generation
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.002):
            view = b.breakers.snapshot(name)
            if view.state is not BreakerState.CLOSED and view.generation == start_gen + 1:
                seen["opened_at"] = view.changed_at or 0.0
                return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        seen["transitions"] = b.breakers.snapshot(name).generation - start_gen


def _agents(b: Bench, tool: str, url: str) -> Counter[str]:
    """``loops`` agents calling ``tool`` for the outage's duration; their results by kind."""
    cfg, counts, lock = b.cfg, Counter[str](), threading.Lock()
    end = time.monotonic() + cfg.outage_s

    def agent() -> None:
        while time.monotonic() < end:
            kind = _kind(b.client.call(tool, {"url": url}, timeout=15))
            with lock:
                counts[kind] += 1
            time.sleep(cfg.think_s)

    threads = [threading.Thread(target=agent) for _ in range(cfg.loops)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    require("ok" not in counts, f"a call succeeded during the outage: {counts}")
    return counts


def _outage_side(b: Bench, flaky: FlakyServer, tool: str) -> Outage:
    path = flaky.unique_path(tool)
    url = flaky.script(path, Reply(503, {"error": "down for maintenance"}))
    with _watch_opening(b, tool) as seen:
        calls = _agents(b, tool, url)
    run = Outage(_started(flaky.hits(path)), calls)
    run.opened_at = float(seen["opened_at"]) if "opened_at" in seen else None
    run.transitions = int(seen["transitions"])
    return run


def outage(b: Bench) -> tuple[list[Row], list[str]]:
    cfg = b.cfg
    progress(f"outage: {cfg.loops} agent loops for {cfg.outage_s:.0f} s, without then with")
    with FlakyServer() as flaky:
        bare = _outage_side(b, flaky, "bare_fetch")
        guarded = _outage_side(b, flaky, "guarded_fetch")
    require(guarded.opened_at is not None, "the breaker never opened during the outage")
    assert guarded.opened_at is not None
    k = OUTAGE_BREAKER.half_open_probes
    periods = guarded.transitions // 2  # open -> half_open -> open ... after the first opening
    first_half_open = guarded.opened_at + OUTAGE_BREAKER.open_s
    probes = len(guarded.started_between(first_half_open))
    drained = [t - guarded.opened_at for t in guarded.started_between(guarded.opened_at)]
    drained = [d for d in drained if d < OUTAGE_BREAKER.open_s]
    bare_n, guarded_n = len(bare.started), len(guarded.started)
    rows = [
        Row(
            f"calls reaching a service that is down for {cfg.outage_s:.0f} s, "
            f"{cfg.loops} agent loops (baseline: no breaker)",
            "service hits",
            str(bare_n),
            str(guarded_n),
            guarded_n / max(bare_n, 1),
            "-",
            None,
        ),
        Row(
            "... of which started once it could first half-open (only probes may)",
            "service hits",
            "-",
            str(probes),
            probes / max(bare_n, 1),
            f"<= K x half-open periods = {k} x {periods}",
            probes <= k * periods,
        ),
    ]
    notes = [
        f"outage agent calls made: no breaker {sum(bare.calls.values())} "
        f"({dict(bare.calls)}), with breaker {sum(guarded.calls.values())} "
        f"({dict(guarded.calls)}); {cfg.think_s} s think time; three attempts per call "
        "on both sides",
        f"breaker: {OUTAGE_BREAKER.consecutive_failures} consecutive failures or "
        f"{OUTAGE_BREAKER.failure_rate:.0%} of {OUTAGE_BREAKER.window_size} open it for "
        f"{OUTAGE_BREAKER.open_s} s; K={k}; it opened "
        f"{guarded.opened_at - guarded.started[0]:.2f} s after the first failure and made "
        f"{guarded.transitions} transitions ({periods} half-open periods); "
        f"{guarded_n - probes - len(drained)} hit(s) started before it opened, "
        f"{len(drained)} in its first open period, all admitted before it opened and at most "
        f"{max(drained, default=0.0):.2f} s late (through the worker's other layers)",
    ]
    return rows, notes


# -- 3. closed-state overhead -------------------------------------------------------


def _evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def _background_rate(b: Bench, seconds: float = 1.0) -> float:
    """Scripts per second the server runs with no call in flight (an idle worker's own)."""
    before = _evalsha_calls(b.redis)
    time.sleep(seconds)
    return (_evalsha_calls(b.redis) - before) / seconds


def _evalsha_per_call(
    b: Bench, call: Callable[[], ToolResult], calls: int, expect: str, background: float
) -> float:
    """Top-level script calls (round trips: a script's own commands are not counted) per call.

    INFO commandstats is server-wide, so the idle background is taken off.
    """
    before, start = _evalsha_calls(b.redis), time.monotonic()
    _latencies(call, calls, expect)
    spent = time.monotonic() - start
    return (_evalsha_calls(b.redis) - before - background * spent) / calls


def overhead(b: Bench) -> tuple[list[Row], list[str]]:
    cfg, n = b.cfg, b.cfg.overhead_calls
    progress(f"closed-state overhead: {cfg.rounds} round(s) of {n} calls per side")

    def guarded() -> ToolResult:
        return b.client.call("breaker_noop", {})

    def bare() -> ToolResult:
        return b.client.call("bare_noop", {})

    def refused() -> ToolResult:
        return b.client.call("tripped_noop", {})

    background = _background_rate(b)
    b.breakers.trip("tripped_noop")
    per_check = _evalsha_per_call(b, refused, n, "circuit_open", background)
    b.breakers.reset("tripped_noop")
    scripts = {
        "guarded": _evalsha_per_call(b, guarded, n, "ok", background),
        "bare": _evalsha_per_call(b, bare, n, "ok", background),
    }
    runs = interleave(
        cfg.rounds,
        {
            "guarded": lambda: _latencies(guarded, n, "ok"),
            "bare": lambda: _latencies(bare, n, "ok"),
        },
    )
    p50 = {side: percentile([s for r in run for s in r], 50) * 1000 for side, run in runs.items()}
    per_call = scripts["guarded"] - scripts["bare"]
    checks = 2  # the client's pre-check and the worker's acquire; record is the third trip
    rows = [
        Row(
            "breaker round trips per call while closed (baseline: breaker disabled)",
            "EVALSHA/call",
            f"{scripts['bare']:.2f}",
            f"{scripts['guarded']:.2f}",
            scripts["guarded"] / max(scripts["bare"], 0.01),
            "-",
            None,
        ),
        Row(
            "... per breaker check (the client's pre-check alone, on fast-failed calls)",
            "round trips",
            "-",
            f"{per_check:.2f}",
            per_check,
            f"<= {ROUND_TRIPS_PER_CHECK:.0f}",
            round(per_check, 2) <= ROUND_TRIPS_PER_CHECK,
        ),
        Row(
            "sequential no-op call, breaker closed vs disabled",
            "p50 ms",
            f"{p50['bare']:.2f}",
            f"{p50['guarded']:.2f}",
            p50["guarded"] / p50["bare"],
            "-",
            None,
        ),
    ]
    notes = [
        f"closed state: {per_call:.2f} breaker round trips per call = {checks} checks "
        "(client pre-check, worker acquire) + 1 record, each one EVALSHA; "
        f"p50 delta {p50['guarded'] - p50['bare']:+.2f} ms per call; round trips are "
        f"INFO commandstats EVALSHA deltas less the idle background ({background:.1f}/s)"
    ]
    return rows, notes


def run(cfg: Config, settings: Settings) -> tuple[list[Row], list[str]]:
    client = ToolClient(settings)
    admin = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    b = Bench(cfg, client, admin, client.breakers)
    try:
        rows: list[Row] = []
        notes: list[str] = []
        for scenario in (fast_fail, outage, overhead):
            more_rows, more_notes = scenario(b)
            rows += more_rows
            notes += more_notes
        return rows, notes
    finally:
        client.close()
        client.app.close()
        admin.close()


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    with redis_server(cfg.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
        settings = run_settings(server.url, Path(tmp))
        progress(f"starting a threads worker with {cfg.concurrency} slots on {server.url}")
        try:
            with worker(
                settings,
                "breaker_bench_tools",
                concurrency=cfg.concurrency,
                pool="threads",
                log_path=Path(tmp) / "worker.log",
            ):
                rows, notes = run(cfg, settings)
        finally:
            forget(server.url, settings)
        info = machine_info(server.url)
    notes = [f"worker: threads pool, {cfg.concurrency} slots; one client process", *notes]
    print_report("circuit breakers: fast fail, outage, closed-state overhead", rows, info, notes)
    missed = [row for row in rows if row.passed is False]
    return 1 if cfg.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
