"""What idempotency costs per call, and what it buys when a worker is killed.

Two scenarios, each on its own fresh workers and one Redis:

1. cost: sequential round trips of a side-effecting no-op against a read-only
   no-op on the same worker (rounds alternating): the p50 delta, and the Redis
   commands each side sends per call (``INFO commandstats``), whose difference
   is the round trips idempotency adds;
2. crash: ``--crash-calls`` side-effecting writes in flight on one worker, which
   is SIGKILLed while a second one runs: duplicates at the ledger (target 0),
   calls that did not end ok before their deadline (target 0), and the takeover
   time of each call after the kill (target <= lease + 2 s). Half the writes had
   landed when the worker died (the taker's check finds them), half had not
   started (the check finds nothing and the taker writes).

Usage: ``python bench/idempotency.py [--quick] [--redis-url URL] [...]``; see
``--help``. Exits 0 whatever the figures (``--strict``: 1 when a target is
missed), non-zero when the run itself fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

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

from toolexec.client import CallHandle, ToolClient
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Ledger, Reply

TOOLS = "idempotency_tools"
#: A reply slower than the whole scenario: the first worker's requests stay in flight.
STUCK = Reply(delay=120.0)


@dataclass(frozen=True)
class Config:
    calls: int = 300
    warmup: int = 30
    rounds: int = 3
    crash_calls: int = 50
    lease: float = 5.0
    sweep: float = 0.5
    deadline: float = 60.0
    redis_url: str | None = None
    strict: bool = False


QUICK: dict[str, Any] = {"calls": 40, "warmup": 5, "rounds": 1, "crash_calls": 10, "lease": 2.0}


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help=f"a fast, smaller run: {QUICK}")
    add("--calls", type=int, help="sequential calls per side per round (300)")
    add("--warmup", type=int, help="unmeasured calls per side first (30)")
    add("--rounds", type=int, help="rounds, the two sides alternating (3)")
    add("--crash-calls", type=int, help="writes in flight when the worker is killed (50)")
    add("--lease", type=float, help="TOOLEXEC_IDEMPOTENCY_LEASE_S of the crash workers (5)")
    add("--sweep", type=float, help="TOOLEXEC_IDEMPOTENCY_SWEEP_S of the crash workers (0.5)")
    add("--redis-url", help="use this server instead of a fresh embedded Valkey")
    add("--strict", action="store_true", help="exit 1 when a target is missed")
    args = vars(parser.parse_args(argv))
    config = replace(Config(), **QUICK) if args.pop("quick") else Config()
    return replace(config, **{k: v for k, v in args.items() if v is not None})


# -- 1. what a side-effecting call costs -------------------------------------


def _commands(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


@dataclass
class Side:
    """One contender: its round trips and the Redis commands it sent."""

    tool: str
    seconds: list[float]
    commands: dict[str, int]
    calls: int = 0

    def run(self, client: ToolClient, calls: int) -> None:
        before = _commands(client.redis)
        for _ in range(calls):
            start = time.perf_counter()
            result = client.call(self.tool, {})
            self.seconds.append(time.perf_counter() - start)
            require(result.ok and not result.replayed, f"{self.tool}: {result}")
        after = _commands(client.redis)
        for name, count in after.items():
            self.commands[name] = self.commands.get(name, 0) + count - before.get(name, 0)
        self.calls += calls

    def per_call(self, name: str | None = None) -> float:
        total = self.commands.get(name, 0) if name else sum(self.commands.values())
        return total / self.calls


def cost(cfg: Config, settings: Settings, log: Path) -> tuple[list[Row], list[str]]:
    progress(f"cost: {cfg.rounds} round(s) of {cfg.calls} sequential calls per side")
    sides = {"read-only": Side("idem_read", [], {}), "side effects": Side("idem_write", [], {})}
    with (
        worker(settings, TOOLS, concurrency=8, pool="threads", log_path=log),
        ToolClient(settings) as client,
    ):
        for side in sides.values():
            for _ in range(cfg.warmup):
                client.call(side.tool, {})
        runs: dict[str, Callable[[], None]] = {
            name: partial(side.run, client, cfg.calls) for name, side in sides.items()
        }
        interleave(cfg.rounds, runs)
    base, write = sides["read-only"], sides["side effects"]
    p50 = {name: percentile(s.seconds, 50) * 1000 for name, s in sides.items()}
    p99 = {name: percentile(s.seconds, 99) * 1000 for name, s in sides.items()}
    added = write.per_call("evalsha") - base.per_call("evalsha")
    rows = [
        _row("p50 ms", p50, f"+{p50['side effects'] - p50['read-only']:.2f} ms"),
        _row("p99 ms", p99, f"+{p99['side effects'] - p99['read-only']:.2f} ms"),
        Row(
            f"sequential no-op round trip ({base.calls} calls per side)",
            "script calls (EVALSHA) per call",
            f"{base.per_call('evalsha'):.2f}",
            f"{write.per_call('evalsha'):.2f}",
            write.per_call("evalsha") / max(base.per_call("evalsha"), 0.01),
            f"+{added:.2f} round trips (begin, finish)",
            None,
        ),
    ]
    notes = [
        f"Redis commands per call (round trips and the commands scripts run inside Redis): "
        f"read-only {base.per_call():.1f}, side effects {write.per_call():.1f}; by name, "
        "side effects minus read-only: "
        + ", ".join(
            f"{name} {write.per_call(name) - base.per_call(name):+.2f}"
            for name in sorted(set(write.commands) | set(base.commands))
            if abs(write.per_call(name) - base.per_call(name)) >= 0.05
        )
    ]
    return rows, notes


def _row(metric: str, ms: dict[str, float], delta: str) -> Row:
    return Row(
        "sequential no-op round trip (read-only vs side effects)",
        metric,
        f"{ms['read-only']:.2f}",
        f"{ms['side effects']:.2f}",
        ms["side effects"] / ms["read-only"],
        delta,
        None,
    )


# -- 2. a worker killed with writes in flight ---------------------------------


@dataclass(frozen=True)
class CrashRun:
    results: list[ToolResult]
    writes: list[int]
    takeovers: list[float]
    deadline_ok: int


def _submit_writes(
    client: ToolClient, flaky: FlakyServer, ledger: Ledger, cfg: Config
) -> tuple[list[CallHandle], list[str]]:
    """Half the writes land and hang; half hang in a read before writing."""
    handles, gates = [], []
    for i in range(cfg.crash_calls):
        landed = i % 2 == 0
        order = ledger.entry(f"o{i}", STUCK, Reply()) if landed else ledger.entry(f"o{i}")
        gate = "" if landed else flaky.script(flaky.unique_path("gate"), STUCK, Reply())
        arguments = {"order_id": order, "ledger": ledger.url, "prepare": gate or None}
        gates.append(gate.removeprefix(flaky.url))
        handles.append(client.submit("idem_order", arguments, timeout=cfg.deadline))
    return handles, gates


def _wait_in_flight(flaky: FlakyServer, ledger: Ledger, gates: list[str], n: int) -> None:
    end = time.monotonic() + 120
    while True:
        started = sum(
            len(flaky.hits(gate)) if gate else len(ledger.writes(f"o{i}"))
            for i, gate in enumerate(gates)
        )
        if started == n:
            return
        require(time.monotonic() < end, f"only {started} of {n} writes started in 120 s")
        time.sleep(0.05)


def crash_once(cfg: Config, settings: Settings, tmp: Path) -> CrashRun:
    env = {
        "TOOLEXEC_IDEMPOTENCY_LEASE_S": str(cfg.lease),
        "TOOLEXEC_IDEMPOTENCY_SWEEP_S": str(cfg.sweep),
    }
    slots = max(16, cfg.crash_calls + 8)
    with FlakyServer() as flaky, ToolClient(settings) as client:
        ledger = Ledger.open(flaky)
        with worker(
            settings, TOOLS, concurrency=slots, pool="threads", log_path=tmp / "doomed.log", env=env
        ) as doomed:
            handles, gates = _submit_writes(client, flaky, ledger, cfg)
            _wait_in_flight(flaky, ledger, gates, cfg.crash_calls)
            with worker(
                settings,
                TOOLS,
                concurrency=slots,
                pool="threads",
                log_path=tmp / "taker.log",
                env=env,
            ):
                killed_at = time.time()
                doomed.kill()
                results = [h.result() for h in handles]
        n = cfg.crash_calls
        return CrashRun(
            results=results,
            writes=[len(ledger.writes(f"o{i}")) for i in range(n)],
            takeovers=[ledger.checks(f"o{i}")[0].at - killed_at for i in range(n)],
            deadline_ok=sum(r.elapsed_ms < cfg.deadline * 1000 for r in results),
        )


def crash(cfg: Config, settings: Settings, tmp: Path) -> tuple[list[Row], list[str]]:
    progress(f"crash: SIGKILL with {cfg.crash_calls} writes in flight, lease {cfg.lease} s")
    run = crash_once(cfg, settings, tmp)
    n, target = cfg.crash_calls, cfg.lease + 2.0
    duplicates = sum(max(0, w - 1) for w in run.writes)
    ok = sum(r.ok for r in run.results)
    scenario = f"SIGKILL, {n} writes in flight (lease {cfg.lease:g} s, sweep {cfg.sweep:g} s)"
    rows = [
        Row(scenario, "duplicate writes", "-", str(duplicates), 0.0, "0", duplicates == 0),
        Row(
            scenario,
            "calls not ok by their deadline",
            "-",
            str(n - min(ok, run.deadline_ok)),
            0.0,
            "0",
            ok == n == run.deadline_ok,
        ),
        _takeover(scenario, "median", statistics.median(run.takeovers), target),
        _takeover(scenario, "max", max(run.takeovers), target),
    ]
    notes = [
        f"crash: writes per order {sorted(set(run.writes))}; checks found "
        f"{sum(r.source == 'check' for r in run.results)} landed writes, the takers wrote "
        f"{sum(r.ok and r.source is None for r in run.results)}; takeover p90 "
        f"{percentile(run.takeovers, 90):.2f} s (from the SIGKILL to the taker's check)"
    ]
    return rows, notes


def _takeover(scenario: str, which: str, seconds: float, target: float) -> Row:
    return Row(
        scenario,
        f"takeover s after the kill, {which}",
        f"{target:g} (target)",
        f"{seconds:.2f}",
        seconds / target,
        "<= lease + 2 s",
        seconds <= target,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    with redis_server(cfg.redis_url) as server, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        settings = run_settings(server.url, tmp, default_timeout=cfg.deadline)
        try:
            rows, notes = cost(cfg, settings, tmp / "cost.log")
            more_rows, more_notes = crash(cfg, settings, tmp)
        finally:
            forget(server.url, settings)
        info = machine_info(server.url)
    notes = [
        f"cost: one threads worker with 8 slots, {cfg.rounds} round(s), sides alternating, "
        f"{cfg.warmup} warm-up calls per side; tools without a breaker",
        *notes,
        *more_notes,
    ]
    print_report("idempotency: cost per call and crash safety", rows + more_rows, info, notes)
    missed = [row for row in rows + more_rows if row.passed is False]
    return 1 if cfg.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
