"""Memory: the worker with many calls in flight, the client with a big batch, and no leak.

Three figures, each from real processes on a fresh Valkey of its own:

1. worker RSS with ``--in-flight`` calls (1000) running at once: a threads
   worker with that many slots, every call sleeping until all have started;
2. the client's memory for one ``call_many`` of ``--batch`` no-ops (10 000):
   the Python heap's peak (tracemalloc) and the RSS growth;
3. a loop of ``--calls`` no-ops (100 000), in ``call_many`` rounds of 100,
   sampling worker and client RSS: the slope over the second half of the loop
   (KiB per 1000 calls) says whether memory grows without bound.

Usage: ``python bench/memory.py [--calls N] [--batch N] [--in-flight N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

from _common import (
    command_line,
    machine_info,
    markdown_table,
    progress,
    require,
    rss_kib,
    run_settings,
    worker,
)
from overhead import load_average, own_server

from toolexec.client import ToolClient
from toolexec.settings import Settings

TIMEOUT_S = 600.0
ROUND = 100


def in_flight(settings: Settings, tmp: Path, n: int) -> list[list[str]]:
    """Peak worker RSS while ``n`` sleeping calls run at once on ``n`` thread slots."""
    progress(f"in flight: {n} calls on a worker with {n} thread slots")
    with (
        worker(
            settings,
            "bench_tools",
            concurrency=n,
            pool="threads",
            log_path=tmp / "w-inflight.log",
            queues="bench-fanout",
        ) as proc,
        ToolClient(settings) as client,
    ):
        assert proc.process is not None
        pid = proc.process.pid
        client.call("bench_fanout_sleep", {"seconds": 0.0}, timeout=60)
        idle = rss_kib(pid)
        peak = [idle]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak.append(rss_kib(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        sleep = max(2.0, n / 200)  # long enough that the last call starts before the first ends
        results = client.call_many(
            [("bench_fanout_sleep", {"seconds": sleep})] * n, timeout=TIMEOUT_S
        )
        done.set()
        sampler.join()
        require(all(r.ok for r in results), "an in-flight call failed")
    return [
        [f"worker RSS, idle ({n} thread slots)", f"{idle / 1024:.1f} MiB", ""],
        [
            f"worker RSS, peak with {n} calls in flight",
            f"{max(peak) / 1024:.1f} MiB",
            f"{(max(peak) - idle) / n:.1f} KiB per call in flight",
        ],
    ]


def batch(client: ToolClient, n: int) -> list[list[str]]:
    progress(f"client: one call_many of {n} no-ops")
    before = rss_kib(os.getpid())
    tracemalloc.start()
    results = client.call_many([("bench_noop", {})] * n, timeout=TIMEOUT_S)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    require(all(r.ok for r in results), "a batched call failed")
    after = rss_kib(os.getpid())
    del results
    return [
        [
            f"client heap peak, call_many of {n}",
            f"{peak / 2**20:.1f} MiB",
            f"{peak / n / 1024:.1f} KiB per call (tracemalloc)",
        ],
        [f"client RSS growth, call_many of {n}", f"{(after - before) / 1024:.1f} MiB", ""],
    ]


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares KiB per 1000 calls over the second half of the samples."""
    half = points[len(points) // 2 :]
    xs, ys = [p[0] for p in half], [p[1] for p in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def loop(client: ToolClient, worker_pid: int, n: int) -> list[list[str]]:
    progress(f"loop: {n} no-ops in call_many rounds of {ROUND}")
    worker_pts, client_pts = [], []
    done = 0
    every = max(ROUND, n // 40)
    while done < n:
        results = client.call_many([("bench_noop", {})] * ROUND, timeout=TIMEOUT_S)
        require(all(r.ok for r in results), "a looped call failed")
        done += ROUND
        if done % every == 0:
            worker_pts.append((done, rss_kib(worker_pid)))
            client_pts.append((done, rss_kib(os.getpid())))
    rows = []
    for who, pts in (("worker", worker_pts), ("client", client_pts)):
        rows.append(
            [
                f"{who} RSS over a loop of {n} calls",
                f"{pts[0][1] / 1024:.1f} -> {pts[-1][1] / 1024:.1f} MiB",
                f"slope over the second half {slope(pts):+.1f} KiB per 1000 calls",
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls in the loop (100000)")
    parser.add_argument("--batch", type=int, default=10_000, help="calls in one call_many (10000)")
    parser.add_argument("--in-flight", type=int, default=1000, help="calls in flight (1000)")
    args = parser.parse_args(argv)
    loads = [load_average()]
    with own_server() as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        settings = run_settings(server.url, tmp)
        rows = in_flight(settings, tmp, args.in_flight)
        with (
            worker(
                settings,
                "bench_tools",
                concurrency=8,
                pool="threads",
                log_path=tmp / "w.log",
                queues=settings.default_queue,
            ) as proc,
            ToolClient(settings) as client,
        ):
            assert proc.process is not None
            client.call("bench_noop", {}, timeout=60)
            rows += batch(client, args.batch)
            rows += loop(client, proc.process.pid, args.calls)
        loads.append(load_average())
        info = machine_info(server.url)
    print("\n## Memory\n")
    print(markdown_table(["figure", "value", "note"], rows))
    print(
        "\n- load average (1 min): "
        + ", ".join(f"{x:.2f}" for x in loads)
        + f" on {os.cpu_count()} core(s)"
    )
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
