"""Retry storms: Brooker's backoff-and-jitter experiment reproduced, then an outage.

a. Simulation of Brooker (AWS Architecture Blog, 2015; docs/background.md, Retry storms): N clients
   start together and each updates one row once with optimistic concurrency
   (read the version, write on condition; a failed write backs off and reads
   again, without limit). Each network hop takes |Normal(10 ms, 2 ms)|;
   base 5 ms, cap 2 s; 100 runs per cell. Event-driven in virtual time (no
   sleeping); the delays come from toolexec's own ``RetryPolicy.backoff``.
   Target: full jitter's calls within ±10% of the reference table.
b. The same contention through toolexec with real workers: a local HTTP
   service holds a versioned row (GET, then PUT ?version=, 409 on conflict,
   which the tool raises as a TransientError), each hop delayed as in (a);
   N agents' calls per backoff kind. Target: full jitter <= 0.5x the calls
   of no backoff.
c. An outage: the service fails every call for 10 s under steady load from
   50 agents (one call per agent every 0.5 s). Load amplification (calls at
   the service / calls the agents made, both during the outage) with three
   attempts alone, with the retry budget, with budget and breaker; and how
   long after the outage goodput is back. Target: <= 1.1x with the budget,
   where attempts alone give about 3x.

d. The default defences tell a blip from an outage: 100 calls at once to a
   service that answers 503 once per key, then 200 (target: >= 95 ok, and a
   later call ok at once); then 80 calls at once to a service that is down
   (target: <= 1.5 requests per call), and 20 later calls (target: all
   answered within 2.5 s, at most 2 of them reaching the service).

Usage: ``python bench/storm.py [--quick] [--parts abc] [--redis-url URL]``;
see ``--help``. Exits 0 whatever the figures (``--strict``: 1 when a target
is missed), and non-zero when a call fails where it must not.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from _common import (
    command_line,
    forget,
    interleave,
    machine_info,
    markdown_table,
    progress,
    redis_server,
    require,
    run_settings,
    worker,
)
from storm_tools import BASE_S, CAP_S, OUTAGE_SETUPS, TIME_SCALES, row_policies, row_tool

from toolexec.client import ToolClient
from toolexec.policies import RetryPolicy
from toolexec.results import ToolResult
from toolexec.settings import Settings

KINDS = ("none", "exponential", "equal", "full", "decorrelated")
HOP_MEAN_S = 0.010
HOP_SD_S = 0.002
SIM_TARGET = 0.10  # full jitter within ±10% of the reference calls
ROW_TARGET = 0.5  # full jitter <= 0.5x the calls of no backoff
OUTAGE_TARGET = 1.1  # amplification with the retry budget
RECOVERED = 0.9  # goodput is back at 90% of its level before the outage
#: (b)'s agents start together this long after submitting, once workers hold every call.
START_MARGIN_S = 1.0

#: Mean calls (completion ms) of a re-run of Brooker's 2015 simulator (docs/background.md).
REFERENCE: dict[int, dict[str, tuple[float, float]]] = {
    10: {
        "none": (51, 377),
        "exponential": (50, 3401),
        "equal": (43, 738),
        "full": (39, 467),
        "decorrelated": (38, 432),
    },
    50: {
        "none": (689, 1140),
        "exponential": (621, 36196),
        "equal": (347, 4201),
        "full": (333, 3005),
        "decorrelated": (375, 2234),
    },
    100: {
        "none": (2420, 2020),
        "exponential": (1853, 63394),
        "equal": (812, 6598),
        "full": (795, 4931),
        "decorrelated": (1001, 4604),
    },
}


@dataclass(frozen=True)
class Config:
    parts: str = "abcd"
    sim_clients: tuple[int, ...] = (10, 50, 100)
    sim_runs: int = 100
    row_agents: tuple[int, ...] = (20, 50)
    row_runs: int = 3
    row_scales: tuple[int, ...] = (1,)
    outage_agents: int = 50
    period_s: float = 0.5
    before_s: float = 5.0
    outage_s: float = 10.0
    after_s: float = 10.0
    workers: int = 2
    concurrency: int = 32
    seed: int = 2015
    #: (d): calls of the blip, of the outage, and later calls during it
    defaults_calls: tuple[int, int, int] = (100, 80, 20)
    redis_url: str | None = None
    strict: bool = False


QUICK: dict[str, Any] = {
    "sim_clients": (10, 50),
    "sim_runs": 10,
    "row_agents": (5,),
    "row_runs": 1,
    "outage_agents": 10,
    "before_s": 1.0,
    "outage_s": 2.0,
    "after_s": 3.0,
    "workers": 1,
    "defaults_calls": (20, 16, 4),
}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help=f"a fast smoke run: {QUICK}")
    add("--parts", help="which parts to run, any of a, b, c, d (abcd)")
    add("--sim-clients", type=_ints, help="(a) client counts, comma-separated (10,50,100)")
    add("--sim-runs", type=int, help="(a) runs per cell (100)")
    add("--row-agents", type=_ints, help="(b) agent counts, comma-separated (20,50)")
    add("--row-runs", type=int, help="(b) runs per cell (3)")
    add(
        "--row-scales",
        type=_ints,
        help=f"(b) time scales, comma-separated, of {TIME_SCALES}: hops, base and cap times it (1)",
    )
    add("--outage-agents", type=int, help="(c) agents calling steadily (50)")
    add("--outage-s", type=float, help="(c) seconds the service fails every call (10)")
    add("--workers", type=int, help="(b, c) worker processes (2)")
    add("--concurrency", type=int, help="(b, c) slots per worker (32)")
    add("--seed", type=int, help="(a) seed of the simulation (2015)")
    add("--redis-url", help="use this server instead of a fresh embedded Valkey")
    add("--strict", action="store_true", help="exit 1 when a target is missed")
    args = vars(parser.parse_args(argv))
    config = replace(Config(), **QUICK) if args.pop("quick") else Config()
    given = {name: value for name, value in args.items() if value is not None}
    return replace(config, **given)


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


@dataclass
class Report:
    """What the parts print, and whether every target was met."""

    sections: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)

    def add(self, title: str, table: str, notes: Sequence[str] = ()) -> None:
        lines = [f"## {title}", "", table, ""] + [f"- {note}" for note in notes]
        self.sections.append("\n".join(lines))

    def target(self, name: str, passed: bool) -> str:
        if not passed:
            self.missed.append(name)
        return _verdict(passed)


# --- (a) the simulation ----------------------------------------------------------


class OccSimulation:
    """One run of Brooker's model: N clients, one row, events in virtual time.

    Events are (time, order, handler, client, value) in a heap; a handler
    schedules what follows. Brooker's simulator counts failures from 1 and
    its first backoff is ``base * 2**1``; toolexec counts attempts from 1 with
    ``base * 2**0`` first, so failure n asks toolexec for attempt n + 1.
    """

    def __init__(self, clients: int, policy: RetryPolicy, rng: random.Random) -> None:
        self.policy = policy
        self.rng = rng
        self.version = 0
        self.writes = 0
        self.failures = [0] * clients
        self.previous: list[float | None] = [None] * clients
        self._order = itertools.count()
        self._queue: list[tuple[float, int, Callable[[float, int, int], None], int, int]] = []
        for client in range(clients):
            self._at(self._hop(), self._read, client)

    def _hop(self) -> float:
        return abs(self.rng.normalvariate(HOP_MEAN_S, HOP_SD_S))

    def _at(
        self, when: float, handler: Callable[[float, int, int], None], client: int, value: int = 0
    ) -> None:
        heapq.heappush(self._queue, (when, next(self._order), handler, client, value))

    def _read(self, now: float, client: int, _: int) -> None:
        """At the server: the version as of now goes back to the client."""
        self._at(now + self._hop(), self._write, client, self.version)

    def _write(self, now: float, client: int, version: int) -> None:
        """The client got the version and sends it back with its write (one hop)."""
        self._at(now + self._hop(), self._conditional_write, client, version)

    def _conditional_write(self, now: float, client: int, version: int) -> None:
        """At the server: the write succeeds only if nobody wrote since the read."""
        self.writes += 1
        ok = version == self.version
        if ok:
            self.version += 1
        self._at(now + self._hop(), self._written, client, int(ok))

    def _written(self, now: float, client: int, ok: int) -> None:
        """At the client: done, or back off and read again."""
        if ok:
            return
        self.failures[client] += 1
        delay = self.policy.backoff(self.failures[client] + 1, self.previous[client], self.rng)
        self.previous[client] = delay
        self._at(now + self._hop() + delay, self._read, client)

    def run(self) -> tuple[int, float]:
        """Conditional writes made, and the virtual second the last client finished."""
        now = 0.0
        while self._queue:
            now, _, handler, client, value = heapq.heappop(self._queue)
            handler(now, client, value)
        return self.writes, now


def simulate(clients: int, kind: str, runs: int, seed: int) -> tuple[float, float]:
    """Mean calls and mean completion ms over ``runs`` runs."""
    rng = random.Random(f"{seed}:{clients}:{kind}")
    policy = row_policies()[kind]
    outcomes = [OccSimulation(clients, policy, rng).run() for _ in range(runs)]
    return (
        statistics.fmean(calls for calls, _ in outcomes),
        statistics.fmean(seconds for _, seconds in outcomes) * 1000,
    )


def _cell(ours: float, reference: tuple[float, float] | None, index: int) -> str:
    ref = "" if reference is None else f" (ref {reference[index]:.0f})"
    return f"{ours:.0f}{ref}"


def part_a(cfg: Config, report: Report) -> None:
    progress(f"(a) simulating {cfg.sim_runs} runs per cell for N = {cfg.sim_clients}")
    results = {
        n: {kind: simulate(n, kind, cfg.sim_runs, cfg.seed) for kind in KINDS}
        for n in cfg.sim_clients
    }
    checks = []
    for n in cfg.sim_clients:
        if n in REFERENCE:
            ratio = results[n]["full"][0] / REFERENCE[n]["full"][0]
            passed = abs(ratio - 1) <= SIM_TARGET
            checks.append(f"N={n}: {ratio:.3f}x {report.target(f'(a) full N={n}', passed)}")
    notes = [
        f"{cfg.sim_runs} runs per cell, seed {cfg.seed}; hops |Normal({HOP_MEAN_S * 1000:g} ms, "
        f"{HOP_SD_S * 1000:g} ms)|; base {BASE_S * 1000:g} ms, cap {CAP_S:g} s; "
        "no backoff = a RetryPolicy with base 0",
        f"target: full jitter's calls within ±{SIM_TARGET:.0%} of the reference: "
        + ("; ".join(checks) or "no reference for these N"),
    ]
    for index, what in ((0, "mean calls (conditional writes)"), (1, "mean completion ms")):
        rows = [
            [
                str(n),
                *(_cell(results[n][k][index], REFERENCE.get(n, {}).get(k), index) for k in KINDS),
            ]
            for n in cfg.sim_clients
        ]
        title = f"(a) simulation, {what}: toolexec's RetryPolicy (reference)"
        report.add(title, markdown_table(["N", *KINDS], rows), notes if index else ())


# --- the local service of (b) and (c) -------------------------------------------


class StormService:
    """A local HTTP service: a versioned row at /row, and /work, which an outage takes down.

    Every /row request waits one network hop before it touches the row and
    one after, as in (a); /work answers at once, 503 during the outage.
    """

    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.version = 0
        self.reads = 0
        self.writes = 0
        self.scale = 1
        self.outage = (float("inf"), float("inf"))
        self.work_hits: list[float] = []
        self.blip_seen: set[str] = set()
        self.hits: Counter[str] = Counter()  # (d): requests per scenario
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 512

    def url(self, path: str) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}{path}"

    @contextlib.contextmanager
    def running(self) -> Iterator[StormService]:
        thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()

    def hop(self) -> None:
        with self.lock:
            seconds = abs(self.rng.normalvariate(HOP_MEAN_S, HOP_SD_S)) * self.scale
        time.sleep(seconds)

    def reset_row(self) -> None:
        with self.lock:
            self.version, self.reads, self.writes = 0, 0, 0

    def read(self) -> tuple[int, dict[str, Any]]:
        self.hop()
        with self.lock:
            self.reads += 1
            version = self.version
        self.hop()
        return 200, {"version": version}

    def write(self, expected: int) -> tuple[int, dict[str, Any]]:
        self.hop()
        with self.lock:
            self.writes += 1
            ok = expected == self.version
            if ok:
                self.version += 1
            version = self.version
        self.hop()
        return (200 if ok else 409), {"version": version}

    def defaults(self, path: str) -> tuple[int, dict[str, Any]]:
        """(d): /blip/<key> answers 503 the first time per key, then 200; /down/ 503 always;
        /fine/ 200 always."""
        scenario = path.split("/")[1]
        with self.lock:
            self.hits[scenario] += 1
            first = scenario == "blip" and path not in self.blip_seen
            self.blip_seen.add(path)
        if scenario == "down" or first:
            return 503, {"error": scenario}
        return 200, {"ok": True}

    def work(self) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            self.work_hits.append(now)
            down = self.outage[0] <= now < self.outage[1]
        return (503, {"error": "outage"}) if down else (200, {"ok": True})


def _handler(service: StormService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(payload)

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path.startswith(("/blip/", "/down/", "/fine/")):
                self._answer(*service.defaults(path))
                return
            self._answer(*(service.read() if path == "/row" else service.work()))

        def do_PUT(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            self._answer(*service.write(int(query["version"][0])))

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


# --- (b) contention through real workers ---------------------------------------------


@dataclass(frozen=True)
class RowRun:
    """One run of (b): calls at the service, seconds to the last success, queueing per attempt."""

    calls: int
    seconds: float
    queued_ms: float


def _row_run(
    client: ToolClient, service: StormService, kind: str, agents: int, scale: int
) -> RowRun:
    """One run: every agent updates the row once."""
    service.reset_row()
    service.scale = scale
    start_at = time.time() + START_MARGIN_S
    arguments = {"url": service.url("/row"), "start_at": start_at}
    results = client.call_many([(row_tool(kind, scale), arguments)] * agents, timeout=900)
    seconds = time.time() - start_at
    failed = [r for r in results if not r.ok]
    require(not failed, f"{len(failed)} row update(s) failed, e.g. {failed[:1]}")
    require(service.version == agents, f"the row is at {service.version}, not {agents}")
    queued = statistics.fmean(r.timings.queued_ms / max(1, r.attempts) for r in results)
    return RowRun(service.writes, seconds, queued)


def _row_contenders(
    client: ToolClient, service: StormService, agents: int, scale: int
) -> dict[str, Callable[[], RowRun]]:
    def contender(kind: str) -> Callable[[], RowRun]:
        return lambda: _row_run(client, service, kind, agents, scale)

    return {kind: contender(kind) for kind in KINDS}


def _row_rows(cfg: Config, n: int, runs: dict[str, list[RowRun]]) -> list[list[str]]:
    rows = []
    for kind in KINDS:
        calls = statistics.fmean(r.calls for r in runs[kind])
        seconds = statistics.fmean(r.seconds for r in runs[kind])
        queued = statistics.fmean(r.queued_ms for r in runs[kind])
        model = simulate(n, kind, 100, cfg.seed)[0]
        rows.append(
            [
                str(n),
                kind,
                f"{calls:.0f}",
                f"{model:.0f}",
                f"{seconds:.2f}",
                f"{calls / n:.1f}",
                f"{queued:.1f}",
            ]
        )
    return rows


def part_b(cfg: Config, client: ToolClient, service: StormService, report: Report) -> None:
    for scale in cfg.row_scales:
        rows, checks = [], []
        for n in cfg.row_agents:
            progress(f"(b) x{scale}: {n} agents x {len(KINDS)} kinds x {cfg.row_runs} run(s)")
            runs = interleave(cfg.row_runs, _row_contenders(client, service, n, scale))
            rows += _row_rows(cfg, n, runs)
            ratio = statistics.fmean(r.calls for r in runs["full"]) / statistics.fmean(
                r.calls for r in runs["none"]
            )
            passed = report.target(f"(b) x{scale} full vs none N={n}", ratio <= ROW_TARGET)
            checks.append(f"N={n}: {ratio:.2f}x {passed}")
        headers = [
            "N",
            "backoff",
            "calls at the service",
            "simulated (a)",
            "completion s",
            "writes per agent",
            "queued ms per attempt",
        ]
        notes = [
            f"hops |Normal({HOP_MEAN_S * 1000 * scale:g} ms, {HOP_SD_S * 1000 * scale:g} ms)| at "
            f"the service, base {BASE_S * 1000 * scale:g} ms, cap {CAP_S * scale:g} s; the agents' "
            f"first reads wait for a common start {START_MARGIN_S:g} s after submission",
            f"{cfg.row_runs} run(s) per cell, kinds interleaved; {cfg.workers} worker(s) x "
            f"{cfg.concurrency} slots; every call a toolexec call_many item; retries are Celery "
            "retries with toolexec's countdown; calls = conditional writes (PUT), as in (a); "
            "simulated: (a)'s model, 100 runs (the same at any time scale); queued: what an "
            "attempt waited for a worker beyond its backoff (ToolResult.timings.queued_ms / "
            "attempts): the broker's own spreading of retries",
            f"target: full jitter <= {ROW_TARGET}x the calls of no backoff: " + "; ".join(checks),
        ]
        title = f"(b) the same contention through toolexec workers, time scale x{scale}"
        report.add(title, markdown_table(headers, rows), notes)


# --- (c) an outage under steady load ------------------------------------------------


@dataclass(frozen=True)
class AgentCall:
    submitted: float
    done: float
    ok: bool
    error: str | None
    attempts: int


@dataclass(frozen=True)
class Window:
    start: float
    outage: tuple[float, float]
    end: float


def _agent(
    client: ToolClient,
    tool: str,
    url: str,
    first: float,
    cfg: Config,
    window: Window,
    out: list[AgentCall],
) -> None:
    """One agent: a call every period (sooner never; later if the last one ran long)."""
    next_start = first
    while next_start < window.end:
        time.sleep(max(0.0, next_start - time.monotonic()))
        submitted = time.monotonic()
        result: ToolResult = client.call(tool, {"url": url}, timeout=10)
        done = time.monotonic()
        error = None if result.error is None else str(result.error.type)
        out.append(AgentCall(submitted, done, result.ok, error, result.attempts))
        next_start = max(next_start + cfg.period_s, time.monotonic())


def _outage_run(
    cfg: Config, client: ToolClient, service: StormService, setup: str
) -> dict[str, Any]:
    start = time.monotonic() + 0.5
    t0 = start + cfg.before_s
    window = Window(start, (t0, t0 + cfg.outage_s), t0 + cfg.outage_s + cfg.after_s)
    with service.lock:
        service.work_hits = []
        service.outage = window.outage
    calls: list[AgentCall] = []
    agents = [
        threading.Thread(
            target=_agent,
            args=(
                client,
                f"outage_{setup}",
                service.url("/work"),
                start + i * cfg.period_s / cfg.outage_agents,
                cfg,
                window,
                calls,
            ),
        )
        for i in range(cfg.outage_agents)
    ]
    for agent in agents:
        agent.start()
    for agent in agents:
        agent.join()
    return _outage_figures(cfg, window, calls, list(service.work_hits))


def _within(t: float, span: tuple[float, float]) -> bool:
    return span[0] <= t < span[1]


def _recovery_s(cfg: Config, window: Window, calls: list[AgentCall]) -> float | None:
    """Seconds from the outage's end to the first 0.5 s with 90% of the goodput before it."""
    before = (window.start + cfg.period_s, window.outage[0])
    baseline = sum(c.ok and _within(c.done, before) for c in calls) / (before[1] - before[0])
    width = 0.5
    t = window.outage[1]
    while t + width <= window.end:
        good = sum(c.ok and _within(c.done, (t, t + width)) for c in calls) / width
        if good >= RECOVERED * baseline:
            return t - window.outage[1]
        t += width
    return None


def _outage_figures(
    cfg: Config, window: Window, calls: list[AgentCall], hits: list[float]
) -> dict[str, Any]:
    during = [c for c in calls if _within(c.submitted, window.outage)]
    service_during = sum(_within(t, window.outage) for t in hits)
    outcomes = Counter("ok" if c.ok else (c.error or "?") for c in during)
    attempts = sum(c.attempts for c in during)
    return {
        "agent_calls": len(during),
        "attempts": attempts,
        "amplification": attempts / max(1, len(during)),
        "service_load": service_during / max(1, len(during)),
        "whole_run": len(hits) / max(1, len(calls)),
        "recovery_s": _recovery_s(cfg, window, calls),
        "outcomes": ", ".join(f"{k} {v}" for k, v in outcomes.most_common()),
    }


def part_c(cfg: Config, client: ToolClient, service: StormService, report: Report) -> None:
    rows, checks = [], []
    for setup in OUTAGE_SETUPS:
        progress(f"(c) outage of {cfg.outage_s:g} s, {cfg.outage_agents} agents, setup {setup}")
        f = _outage_run(cfg, client, service, setup)
        recovery = "never" if f["recovery_s"] is None else f"{f['recovery_s']:.1f} s"
        rows.append(
            [
                SETUP_NAMES[setup],
                str(f["agent_calls"]),
                str(f["attempts"]),
                f"{f['amplification']:.3f}x",
                f"{f['service_load']:.3f}x",
                f"{f['whole_run']:.3f}x",
                recovery,
                f["outcomes"],
            ]
        )
        if setup == "attempts":
            checks.append(f"attempts alone {f['amplification']:.2f}x (expected about 3x)")
        if setup in ("budget", "token_budget"):
            passed = report.target(f"(c) {setup}", f["amplification"] <= OUTAGE_TARGET)
            checks.append(f"{SETUP_NAMES[setup]} {f['amplification']:.3f}x {passed}")
    headers = [
        "setup",
        "agent calls",
        "calls at the service",
        "amplification",
        "service load",
        "whole run",
        "goodput back after",
        "outcomes of the outage's calls",
    ]
    notes = [
        f"{cfg.outage_agents} agents, one call each every {cfg.period_s:g} s; {cfg.before_s:g} s "
        f"healthy, {cfg.outage_s:g} s of 503s, {cfg.after_s:g} s healthy; 3 attempts, full jitter "
        "(base 50 ms, cap 1 s); the budgets are the defaults: ratio = retries at most 10% of "
        "the calls of the last 10 s (at least 10), tokens = gRPC A6 (100 tokens, a failure "
        "costs 1, a success gives back 0.1, no retries at or below 50); breaker: 50% of 20 "
        "calls, open 2 s, on top of the ratio budget",
        "agent calls: started during the outage; calls at the service: the attempts they made "
        "(ToolResult.attempts); amplification: the two divided; service load: requests the "
        "service got during the outage / agent calls started in it; whole run: requests / "
        "agent calls over the whole run",
        f"goodput back: the first 0.5 s after the outage with {RECOVERED:.0%} of the "
        "successful calls per second before it",
        f"target: amplification <= {OUTAGE_TARGET}x with the budget: " + "; ".join(checks),
    ]
    report.add("(c) an outage under steady load", markdown_table(headers, rows), notes)


# --- (d) the default defences: a blip and an outage ------------------------------------

BLIP_OK = 0.95  # of the blip's calls
DOWN_PER_CALL = 1.5
LATER_S = 2.5
LATER_REACHED = 2


def _outcomes(results: Sequence[ToolResult]) -> str:
    kinds = Counter("ok" if r.ok else str(r.error.type if r.error else "?") for r in results)
    return ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())


def _batch(
    client: ToolClient, service: StormService, tool: str, paths: Sequence[str]
) -> tuple[list[ToolResult], int, float]:
    """The batch's results, the requests it cost the service, and its seconds."""
    scenario = tool.removeprefix("defaults_")
    before, started = service.hits[scenario], time.monotonic()
    results = client.call_many([(tool, {"url": service.url(p)}) for p in paths], timeout=30)
    return results, service.hits[scenario] - before, time.monotonic() - started


def part_d(cfg: Config, client: ToolClient, service: StormService, report: Report) -> None:
    tag = f"{time.time_ns():x}"
    blip_calls, down_calls, later_calls = cfg.defaults_calls
    progress(f"(d) a blip: {blip_calls} calls, 503 once per key")
    blip, blip_hits, blip_s = _batch(
        client, service, "defaults_blip", [f"/blip/{tag}-{i}" for i in range(blip_calls)]
    )
    after = client.call("defaults_blip", {"url": service.url(f"/fine/{tag}")}, timeout=10)
    progress(f"(d) an outage: {down_calls} calls, then {later_calls} more")
    down, down_hits, down_s = _batch(
        client, service, "defaults_down", [f"/down/{tag}"] * down_calls
    )
    later, later_hits, later_s = _batch(
        client, service, "defaults_down", [f"/down/{tag}"] * later_calls
    )
    ok = sum(r.ok for r in blip)
    blip_pass = report.target(
        "(d) blip", ok >= BLIP_OK * blip_calls and after.ok and after.attempts == 1
    )
    per_call = down_hits / down_calls
    down_pass = report.target("(d) outage", per_call <= DOWN_PER_CALL)
    later_pass = report.target("(d) later", later_s <= LATER_S and later_hits <= LATER_REACHED)
    rows = [
        [
            f"blip: {blip_calls} calls",
            str(ok),
            str(blip_hits),
            f"{blip_hits / blip_calls:.2f}",
            f"{blip_s:.2f} s",
            _outcomes(blip),
            blip_pass,
        ],
        [
            f"outage: {down_calls} calls",
            "0",
            str(down_hits),
            f"{per_call:.2f}",
            f"{down_s:.2f} s",
            _outcomes(down),
            down_pass,
        ],
        [
            f"outage: {later_calls} later calls",
            str(sum(r.ok for r in later)),
            str(later_hits),
            f"{later_hits / later_calls:.2f}",
            f"{later_s:.2f} s",
            _outcomes(later),
            later_pass,
        ],
    ]
    headers = [
        "batch",
        "ok",
        "requests at the service",
        "per call",
        "seconds",
        "outcomes",
        "target",
    ]
    notes = [
        "a user's tool at the default policies but max_attempts=4 (retry budget: 10% of the "
        "calls of 10 s, at least 10, retries that work given back; breaker: 5 in a row or 50% "
        "of 20 with at least 10, open 2 s growing x2 per consecutive trip up to 60 s, one "
        "probe success closes it; a refused call may wait up to 5 s for budget or 2 s for a "
        "first trip's probe)",
        f"after the blip, a call to a healthy key: {'ok' if after.ok else 'FAILED'} in "
        f"{after.elapsed_ms:.0f} ms, {after.attempts} attempt(s)",
        f"targets: blip >= {BLIP_OK:.0%} ok and the later call ok; outage <= {DOWN_PER_CALL} "
        f"requests per call; later calls all answered within {LATER_S:g} s, at most "
        f"{LATER_REACHED} reaching the service",
    ]
    report.add(
        "(d) the default defences: a blip and an outage", markdown_table(headers, rows), notes
    )


SETUP_NAMES = {
    "attempts": "3 attempts alone",
    "budget": "+ ratio budget",
    "token_budget": "+ token budget",
    "budget_breaker": "+ ratio budget + breaker",
}


# --- running it all --------------------------------------------------------------------


@contextlib.contextmanager
def fleet(cfg: Config, settings: Settings, tmp: Path) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for index in range(cfg.workers):
            stack.enter_context(
                worker(
                    settings,
                    "storm_tools",
                    concurrency=cfg.concurrency,
                    pool="threads",
                    log_path=tmp / f"worker-{index}.log",
                )
            )
        yield


def run_workers(cfg: Config, report: Report, url: str, tmp: Path) -> None:
    settings = run_settings(url, tmp, task_events=False)
    service = StormService(cfg.seed)
    progress(f"starting {cfg.workers} worker(s) x {cfg.concurrency} slots on {url}")
    try:
        with service.running(), fleet(cfg, settings, tmp), ToolClient(settings) as client:
            if "b" in cfg.parts:
                part_b(cfg, client, service, report)
            if "c" in cfg.parts:
                part_c(cfg, client, service, report)
            if "d" in cfg.parts:
                part_d(cfg, client, service, report)
    finally:
        forget(url, settings)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    report = Report()
    if "a" in cfg.parts:
        part_a(cfg, report)
    info: list[tuple[str, str]] = []
    if any(part in cfg.parts for part in "bcd"):
        with redis_server(cfg.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
            run_workers(cfg, report, server.url, Path(tmp))
            info = machine_info(server.url)
    print("# Retry storms\n")
    print("\n\n".join(report.sections))
    print(f"\ncommand: `{command_line()}`\n")
    if info:
        print("machine: " + "; ".join(f"{key} {value}" for key, value in info))
    missed = ", ".join(report.missed) or "none"
    print(f"\ntargets missed: {missed}")
    return 1 if cfg.strict and report.missed else 0


if __name__ == "__main__":
    sys.exit(main())
