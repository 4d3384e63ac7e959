"""Starting a worker: ``toolexec worker`` beside ``celery -A plain_app worker``.

The suite and an autoscaling fleet start many workers, so what one start costs
matters: each side is started on a fresh Valkey of its own, asked for a first
no-op, and measured when that answer is back: the wall time from the process's
start, the CPU the process has used by then, and its RSS. The baseline is plain
Celery as a user starts it (``plain_app``); toolexec's own app is also started
through Celery's command line, as ``toolexec worker`` started it before it built
Celery's Worker itself. All run the threads pool with 8 slots and task events on;
the rounds alternate the order (``_common.interleave``).

Usage: ``python bench/worker_start.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import plain_app
from _common import (
    _worker_env,
    command_line,
    cpu_seconds,
    interleave,
    machine_info,
    markdown_table,
    median,
    rss_kib,
    run_settings,
    spawn,
    worker,
)
from overhead import celery_worker, own_server

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.results import ToolResult


@dataclass(frozen=True)
class Start:
    wall_s: float
    cpu_s: float
    rss_mib: float


def _measure(pid: int, began: float) -> Start:
    return Start(time.perf_counter() - began, cpu_seconds(pid) or 0.0, rss_kib(pid) / 1024)


def toolexec_start() -> Start:
    """``toolexec worker --tools bench_tools -c 8 -P threads`` until a no-op is answered."""
    with own_server() as server, tempfile.TemporaryDirectory(prefix="toolexec-bench-") as tmp:
        settings = run_settings(server.url, Path(tmp), task_events=True)
        began = time.perf_counter()
        with (
            worker(
                settings, "bench_tools", concurrency=8, pool="threads", log_path=Path(tmp) / "w.log"
            ) as proc,
            ToolClient(settings) as client,
        ):
            result = client.call("bench_noop", {}, timeout=60)
            if result.status != "ok":
                raise RuntimeError(f"the first call failed: {result}")
            assert proc.process is not None
            return _measure(proc.process.pid, began)


def toolexec_app_under_celery_start() -> Start:
    """``celery -A toolexec.worker.app worker``: the same app through Celery's command line.

    What ``toolexec worker`` itself did before it built Celery's Worker directly
    (``executor/worker/start.py``); the difference is the command line's imports.
    """
    with own_server() as server, tempfile.TemporaryDirectory(prefix="toolexec-bench-") as tmp:
        settings = run_settings(server.url, Path(tmp), task_events=True)
        env = {**os.environ, **_worker_env(settings), "TOOLEXEC_TOOLS": "bench_tools"}
        argv = [sys.executable, "-m", "celery", "-A", "toolexec.worker.app", "worker"]
        argv += ["-P", "threads", "-c", "8", "-E", "-Q", settings.default_queue]
        argv += ["--without-mingle", "--without-gossip", "--loglevel", "WARNING"]
        began = time.perf_counter()
        with spawn(argv, env) as proc, ToolClient(settings) as client:
            result = _first_answer(client, proc)
            if result.status != "ok":
                raise RuntimeError(f"the first call failed: {result}")
            return _measure(proc.pid, began)


def _first_answer(client: ToolClient, proc: subprocess.Popen[bytes]) -> ToolResult:
    """A no-op's result once a worker has published its catalog (polled as WorkerProcess does)."""
    end = time.monotonic() + 60
    while True:
        result = client.call("bench_noop", {}, timeout=60)
        waiting = result.error is not None and result.error.type == ErrorType.NO_WORKER
        if not waiting or time.monotonic() > end or proc.poll() is not None:
            return result
        time.sleep(0.05)


def celery_start() -> Start:
    """``celery -A plain_app worker -P threads -c 8 -E`` until a no-op's result is back."""
    with own_server() as server:
        app = plain_app.make_app(server.url)
        with contextlib.closing(app):
            began = time.perf_counter()
            with celery_worker(server.url, queue="celery", slots=8, events=True) as pid:
                app.tasks["plain_app.noop"].delay().get(timeout=60)
                return _measure(pid, began)


def _row(name: str, starts: Sequence[Start]) -> list[str]:
    return [
        name,
        f"{median([s.wall_s for s in starts]):.2f}",
        f"{median([s.cpu_s for s in starts]):.2f}",
        f"{median([s.rss_mib for s in starts]):.1f}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="starts of each side (default 5)")
    args = parser.parse_args(argv)
    contenders: dict[str, Callable[[], Start]] = {
        "toolexec worker": toolexec_start,
        "celery -A toolexec.worker.app worker": toolexec_app_under_celery_start,
        "celery -A plain_app worker (baseline)": celery_start,
    }
    results = interleave(args.rounds, contenders)
    print(f"\n## Starting a worker, to its first answer (median of {args.rounds})\n")
    headers = ["worker", "wall s", "CPU s (the worker process)", "RSS MiB"]
    print(markdown_table(headers, [_row(name, starts) for name, starts in results.items()]))
    print(f"\ncommand: `{command_line()}`\n")
    with own_server() as server:
        print("machine: " + "; ".join(f"{k} {v}" for k, v in machine_info(server.url)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
