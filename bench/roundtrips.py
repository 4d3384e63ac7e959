"""Redis round trips and commands per attempt on the worker, and the p50 of a no-op call.

Starts two private ``redis-server`` processes on free loopback ports, one for
toolexec's state and one as the broker, so that the state server's
``INFO commandstats`` holds only toolexec's commands, and a real
``toolexec worker`` (threads pool) that counts, in its own process, every round
trip and command it sends to the state server (``roundtrip_tools.py``). Then:

1. ``--calls`` sequential no-op calls through ``ToolClient.call``, timed;
2. an idle window of the same length, to learn what the worker sends on its
   own (catalog heartbeat, lease sweeper, fleet clock) and what reading the
   counters costs;
3. per call: the worker's round trips and commands (run minus idle window,
   over the calls), and the state server's commands from ``INFO
   commandstats`` (worker and client together, those run inside scripts
   included);
4. the same for ``--flaky`` calls whose first attempt fails transiently and
   whose second succeeds (two attempts each: the retry path).

With ``--baseline-rev REV`` a second worker runs REV's executor/, tasks/ and
fallback/ (``git archive``, put first on its ``PYTHONPATH``) under a key
prefix and queue of its own, against the same servers and the same client
code, and the timed rounds alternate between the two.

Usage: ``python bench/roundtrips.py [--calls N] [--rounds N] [--flaky N]
[--baseline-rev REV]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from _common import (
    BENCH_DIR,
    command_line,
    interleave,
    machine_info,
    markdown_table,
    percentile,
    progress,
    require,
    run_settings,
    worker,
)

from toolexec.client import ToolClient


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _server(binary: str) -> Iterator[int]:
    """A private redis-server on a free loopback port, without persistence."""
    port = _free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        end = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            require(time.monotonic() < end, f"{binary} did not start on port {port}")
            time.sleep(0.05)
        yield port
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def _commandstats(client: redis.Redis) -> Counter[str]:
    stats: dict[str, Any] = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def _counters(client: ToolClient) -> Counter[str]:
    result = client.call("bench_counters", {})
    require(result.status == "ok", f"bench_counters failed: {result.error}")
    return Counter(result.data)


def _window(client: ToolClient, state: redis.Redis, work: Any) -> tuple[Counter[str], ...]:
    """The worker's and the server's counts over ``work`` (each bracketed by counter calls)."""
    before, server_before = _counters(client), _commandstats(state)
    work()
    after, server_after = _counters(client), _commandstats(state)
    return after - before, server_after - server_before


def _per_call(run: Counter[str], idle: Counter[str], calls: int) -> dict[str, float]:
    names = set(run) | set(idle)
    return {n: (run[n] - idle[n]) / calls for n in sorted(names) if run[n] - idle[n] > 0}


def _measure(
    client: ToolClient, state: redis.Redis, work: Any, calls: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Per call of ``work``: the worker's counts and the server's, less an idle window's."""
    start = time.monotonic()
    run_worker, run_server = _window(client, state, work)
    elapsed = time.monotonic() - start
    progress(f"idle window of {elapsed:.1f} s")
    idle_worker, idle_server = _window(client, state, lambda: time.sleep(elapsed))
    return _per_call(run_worker, idle_worker, calls), _per_call(run_server, idle_server, calls)


@dataclass
class Side:
    """One worker and its client: this tree's code, or a baseline revision's."""

    label: str
    client: ToolClient
    latencies: list[float] = field(default_factory=list)

    def noops(self, count: int) -> None:
        for _ in range(count):
            start = time.perf_counter()
            result = self.client.call("bench_noop", {})
            self.latencies.append(time.perf_counter() - start)
            require(result.status == "ok", f"{self.label}: no-op failed: {result.error}")

    def flaky(self, count: int) -> None:
        for index in range(count):
            result = self.client.call("bench_flaky", {"token": f"t{index}"})
            require(result.status == "ok", f"{self.label}: flaky call failed: {result.error}")
            require(result.attempts == 2, f"{self.label}: {result.attempts} attempts, not 2")


def _baseline_tree(rev: str, tmp: Path) -> Path:
    """``rev``'s executor/, tasks/ and fallback/ laid out as the ``toolexec`` package."""
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"],
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    src, view = tmp / "baseline-src", tmp / "baseline-view" / "toolexec"
    src.mkdir()
    view.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", rev, "executor", "tasks", "fallback"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    for entry in (src / "executor").iterdir():
        (view / entry.name).symlink_to(entry)
    (view / "tasks").symlink_to(src / "tasks")
    (view / "fallback").symlink_to(src / "fallback")
    return view.parent


@contextlib.contextmanager
def _side(
    label: str, state_url: str, broker_url: str, tmp: Path, opts: Any, path: Path | None
) -> Iterator[Side]:
    """A worker (from ``path``'s code when given) under a key prefix and queue of its own."""
    settings = run_settings(state_url, tmp, broker_url=broker_url)
    env = {
        "TOOLEXEC_BROKER_URL": broker_url,
        "TOOLEXEC_BENCH_COUNT_PORT": str(
            redis.Redis.from_url(state_url).get_connection_kwargs()["port"]
        ),
    }
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(BENCH_DIR)])
    log_path = tmp / f"worker-{settings.key_prefix}.log"
    with worker(
        settings,
        "roundtrip_tools",
        concurrency=opts.concurrency,
        pool="threads",
        log_path=log_path,
        env=env,
    ):
        side = Side(label, ToolClient(settings))
        try:
            side.noops(opts.warmup)
            side.latencies.clear()
            yield side
        finally:
            side.client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="no-op calls per side")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds of them")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--flaky", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--baseline-rev", help="also run a worker from this git revision, interleaved"
    )
    opts = parser.parse_args()
    binary = shutil.which("redis-server")
    require(binary is not None, "redis-server is not on PATH")
    assert binary is not None
    with (
        tempfile.TemporaryDirectory(prefix="toolexec-rt-") as tmp_name,
        _server(binary) as state_port,
        _server(binary) as broker_port,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        state_url = f"redis://127.0.0.1:{state_port}/0"
        broker_url = f"redis://127.0.0.1:{broker_port}/0"
        sides = []
        if opts.baseline_rev:
            view = _baseline_tree(opts.baseline_rev, tmp)
            label = f"baseline {opts.baseline_rev}"
            sides.append(stack.enter_context(_side(label, state_url, broker_url, tmp, opts, view)))
        sides.append(
            stack.enter_context(_side("this tree", state_url, broker_url, tmp, opts, None))
        )
        state = stack.enter_context(contextlib.closing(redis.Redis(port=state_port)))
        per_round = max(1, opts.calls // opts.rounds)
        progress(f"{opts.rounds} interleaved rounds of {per_round} no-op calls per side")
        interleave(
            opts.rounds, {side.label: lambda side=side: side.noops(per_round) for side in sides}
        )
        figures = [_figures(side, state, opts) for side in sides]
        _report(opts, figures, state_url)
    return 0


def _figures(side: Side, state: redis.Redis, opts: Any) -> list[list[str]]:
    """The counts of ``side`` (measured alone, after the timed rounds) and its latencies."""
    count = max(1, opts.calls // 4)
    progress(f"{side.label}: counting {count} no-op calls")
    rows = _rows(
        f"{side.label}, no-op", _measure(side.client, state, lambda: side.noops(count), count)
    )
    if opts.flaky:
        progress(f"{side.label}: counting {opts.flaky} calls that retry once")
        counts = _measure(side.client, state, lambda: side.flaky(opts.flaky), opts.flaky)
        rows += _rows(f"{side.label}, retried once (2 attempts)", counts)
    timed = side.latencies[: opts.calls]  # the interleaved rounds only
    rows += [
        [f"{side.label}, no-op: `ToolClient.call` p50", f"{1000 * percentile(timed, 50):.2f} ms"],
        [f"{side.label}, no-op: `ToolClient.call` p90", f"{1000 * percentile(timed, 90):.2f} ms"],
    ]
    return rows


def _rows(label: str, counts: tuple[dict[str, float], dict[str, float]]) -> list[list[str]]:
    worker_rows, server_rows = dict(counts[0]), counts[1]
    trips = worker_rows.pop("round trips", 0.0)
    return [
        [f"{label}: worker's Redis round trips per call", f"{trips:.2f}"],
        [f"{label}: worker's Redis commands per call", f"{sum(worker_rows.values()):.2f}"],
        *[[f"{label}: worker's {name}", f"{v:.2f}"] for name, v in worker_rows.items()],
        [
            f"{label}: server's commands per call (worker + client, in scripts too)",
            f"{sum(server_rows.values()):.2f}",
        ],
    ]


def _report(opts: argparse.Namespace, figures: list[list[list[str]]], url: str) -> None:
    rows = [row for side in figures for row in side]
    print("\n## Redis round trips and latency per call on the worker\n")
    print(markdown_table(["figure", "value"], rows))
    print(
        f"\n- latency: {opts.rounds} rounds of sequential no-op calls, the sides' order"
        " reversed every other round; counts: measured per side afterwards, less an idle"
        " window as long as the calls (heartbeat, sweeper, clock, reading the counters)"
    )
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine_info(url)))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
