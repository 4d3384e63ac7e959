"""Fast-call latency while slow tools saturate their workers: two pools against one.

Two runs on the same Redis. Split: a slow pool (``-Q bench-slow -c 4``) and a
fast pool (``-Q bench-fast -c 8``). Shared: one worker consuming both queues
(``-c 4``). In each, 16 slow calls of 2 s are queued (four rounds of the slow
slots), then fast calls are made one after another; the table gives their
round-trip latency. Run: ``python bench/pools.py [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _common import (
    BENCH_DIR,
    command_line,
    machine_info,
    markdown_table,
    percentile,
    redis_server,
    run_settings,
)

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

SLOW_S = 2.0
SLOW_SLOTS = 4
BACKLOG = 4 * SLOW_SLOTS


@contextlib.contextmanager
def _pools(settings: Settings, split: bool, logs: Path) -> Iterator[None]:
    env = {
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
        "PYTHONPATH": str(BENCH_DIR),
    }
    specs = (
        [("bench-slow", SLOW_SLOTS), ("bench-fast", 8)]
        if split
        else [("bench-slow,bench-fast", SLOW_SLOTS)]
    )
    procs = [
        WorkerProcess(
            "pool_tools", env, queues=q, concurrency=c, log_path=logs / f"{q}.log", cwd=BENCH_DIR
        )
        for q, c in specs
    ]
    try:
        for proc in procs:
            proc.start(settings.redis_url or "", settings.key_prefix, timeout=60.0)
        yield
    finally:
        for proc in procs:
            proc.stop(timeout=60.0)


def _measure(settings: Settings, fast_calls: int) -> list[float]:
    with ToolClient(settings) as client:
        slow = [client.submit("bench_slow", {"seconds": SLOW_S}) for _ in range(BACKLOG)]
        time.sleep(0.3)  # the slow calls take their slots
        latencies = []
        for i in range(fast_calls):
            start = time.monotonic()
            result = client.call("bench_fast", {"key": str(i)}, timeout=60)
            latencies.append((time.monotonic() - start) * 1000)
            assert result.ok, result
        assert all(h.result().ok for h in slow)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    rows = []
    with redis_server(args.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
        for split, fast_calls in ((True, 50), (False, 5)):
            settings = run_settings(server.url, Path(tmp))
            with _pools(settings, split, Path(tmp)):
                ms = _measure(settings, fast_calls)
            label = "split: slow pool + fast pool" if split else "shared: one pool, both queues"
            rows.append(
                [
                    label,
                    str(fast_calls),
                    f"{percentile(ms, 50):.1f}",
                    f"{percentile(ms, 99):.1f}",
                    f"{max(ms):.1f}",
                ]
            )
        info = machine_info(server.url)
    print(
        markdown_table(["pools", "fast calls", "p50 ms", "p99 ms", "max ms"], rows)
        + f"\n\n{BACKLOG} slow calls of {SLOW_S} s queued on {SLOW_SLOTS} slow slots first."
        + f"\ncommand: `{command_line()}`\nmachine: "
        + "; ".join(f"{k} {v}" for k, v in info)
    )


if __name__ == "__main__":
    main()
