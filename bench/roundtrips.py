"""Redis round trips and commands per attempt on the worker, and the p50 of a no-op call.

Starts two private ``redis-server`` processes on free loopback ports, one for
toolexec's state and one as the broker, so that the state server's
``INFO commandstats`` holds only toolexec's commands, and a real
``toolexec worker`` (threads pool) that counts, in its own process, every round
trip and command it sends to the state server (``roundtrip_tools.py``). Then:

1. an idle window, to learn what the worker sends on its own (catalog
   heartbeat, lease sweeper, fleet clock) and what reading the counters costs;
2. ``--calls`` sequential no-op calls through ``ToolClient.call``, timed;
3. per call: the worker's round trips and commands (run minus idle window of
   the same length, over the calls), and the state server's commands from
   ``INFO commandstats`` (worker and client together).

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
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
            start = time.monotonic()
            run_worker, run_server = _window(client, state, calls)
            elapsed = time.monotonic() - start
            progress(f"idle window of {elapsed:.1f} s")
            idle_worker, idle_server = _window(client, state, lambda: time.sleep(elapsed))
            client.close()
            state.close()
        worker_rows = _per_call(run_worker, idle_worker, opts.calls)
        server_rows = _per_call(run_server, idle_server, opts.calls)
        _report(opts, worker_rows, server_rows, latencies, state_url)
    return 0


def _report(
    opts: argparse.Namespace,
    worker_rows: dict[str, float],
    server_rows: dict[str, float],
    latencies: list[float],
    url: str,
) -> None:
    trips = worker_rows.pop("round trips", 0.0)
    rows = [
        ["worker: Redis round trips per call", f"{trips:.2f}"],
        ["worker: Redis commands per call", f"{sum(worker_rows.values()):.2f}"],
        *[[f"worker: {name}", f"{v:.2f}"] for name, v in worker_rows.items()],
        ["server (worker + client): commands per call", f"{sum(server_rows.values()):.2f}"],
        *[[f"server: {name}", f"{v:.2f}"] for name, v in server_rows.items()],
        ["no-op `ToolClient.call` p50", f"{1000 * percentile(latencies, 50):.2f} ms"],
        ["no-op `ToolClient.call` p90", f"{1000 * percentile(latencies, 90):.2f} ms"],
    ]
    print(f"\n## Redis round trips per no-op call ({opts.calls} sequential calls)\n")
    print(markdown_table(["figure", "value"], rows))
    print(
        "\n- one call is one attempt here; the idle window's counts (heartbeat, sweeper,"
        " clock, the counter calls) are subtracted"
    )
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine_info(url)))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
