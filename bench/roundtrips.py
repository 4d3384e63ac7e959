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

Usage: ``python bench/roundtrips.py [--calls N] [--warmup N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from _common import (
    command_line,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--flaky", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    opts = parser.parse_args()
    binary = shutil.which("redis-server")
    require(binary is not None, "redis-server is not on PATH")
    assert binary is not None
    with (
        tempfile.TemporaryDirectory(prefix="toolexec-rt-") as tmp,
        _server(binary) as state_port,
        _server(binary) as broker_port,
    ):
        state_url = f"redis://127.0.0.1:{state_port}/0"
        broker_url = f"redis://127.0.0.1:{broker_port}/0"
        settings = run_settings(state_url, Path(tmp), broker_url=broker_url)
        env = {"TOOLEXEC_BROKER_URL": broker_url, "TOOLEXEC_BENCH_COUNT_PORT": str(state_port)}
        log_path = Path(tmp) / "worker.log"
        with worker(
            settings,
            "roundtrip_tools",
            concurrency=opts.concurrency,
            pool="threads",
            log_path=log_path,
            env=env,
        ):
            client = ToolClient(settings)
            state = redis.Redis(port=state_port)
            for _ in range(opts.warmup):
                require(client.call("bench_noop", {}).status == "ok", "warm-up call failed")
            latencies: list[float] = []

            def calls() -> None:
                for _ in range(opts.calls):
                    start = time.perf_counter()
                    result = client.call("bench_noop", {})
                    latencies.append(time.perf_counter() - start)
                    require(result.status == "ok", f"no-op failed: {result.error}")

            progress(f"{opts.calls} sequential no-op calls")
            noop = _measure(client, state, calls, opts.calls)

            def flaky() -> None:
                for index in range(opts.flaky):
                    result = client.call("bench_flaky", {"token": f"t{index}"})
                    require(result.status == "ok", f"flaky call failed: {result.error}")
                    require(result.attempts == 2, f"flaky call took {result.attempts} attempts")

            progress(f"{opts.flaky} sequential calls that retry once")
            retried = _measure(client, state, flaky, opts.flaky) if opts.flaky else None
            client.close()
            state.close()
        _report(opts, noop, retried, latencies, state_url)
    return 0


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


def _report(
    opts: argparse.Namespace,
    noop: tuple[dict[str, float], dict[str, float]],
    retried: tuple[dict[str, float], dict[str, float]] | None,
    latencies: list[float],
    url: str,
) -> None:
    rows = [
        *_rows("no-op", noop),
        ["no-op: `ToolClient.call` p50", f"{1000 * percentile(latencies, 50):.2f} ms"],
        ["no-op: `ToolClient.call` p90", f"{1000 * percentile(latencies, 90):.2f} ms"],
    ]
    if retried is not None:
        rows += _rows("retried once (2 attempts)", retried)
    print(f"\n## Redis round trips per call ({opts.calls} no-op, {opts.flaky} retried calls)\n")
    print(markdown_table(["figure", "value"], rows))
    print(
        "\n- sequential calls, one at a time; the counts of an idle window as long as the"
        " calls (heartbeat, sweeper, clock, reading the counters) are subtracted"
    )
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine_info(url)))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
