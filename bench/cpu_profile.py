"""Where the CPU of one call goes, on the worker and on the client (py-spy).

A ``toolexec worker -P threads -c 8`` and a client on a fresh Valkey of their
own; while the client runs ``call_many`` rounds of no-ops, ``py-spy`` (extra
``[bench]``) samples both processes. Each stack is put
in one bucket, the first of a list (toolexec's parts first, then Celery's
tracing, events, kombu, redis-py, ...) that any of its frames names, so a
bucket holds the part's own work and the I/O it causes; only threads holding
the GIL are sampled; the table gives milliseconds of CPU per call per bucket, and the
hottest functions follow.

Usage: ``python bench/cpu_profile.py [--seconds S] [--round N]`` (named so as not to
shadow the standard library's ``profile`` for scripts run from bench/).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from _common import command_line, markdown_table, progress, require, run_settings, worker
from overhead import load_average, own_server

from toolexec.client import ToolClient

RATE = 250

#: (bucket, what a frame's "function (path:line)" contains), in priority order:
#: a stack goes to the first bucket any of its frames matches, so a toolexec part
#: holds its own work and the redis-py / kombu work it causes.
BUCKETS: list[tuple[str, str]] = [
    ("toolexec: breaker (layer, scripts)", "(executor/breaker"),
    ("toolexec: retry budget", "(executor/retry_budget"),
    ("toolexec: idempotency", "(executor/idempotency"),
    ("toolexec: rate limit", "(executor/ratelimit"),
    ("toolexec: stats + in-flight lease", "(executor/stats"),
    ("toolexec: metrics (prometheus)", "(executor/ops/metrics"),
    ("toolexec: replies (worker: push; client: collect)", "(executor/replies"),
    ("toolexec: runner (body on its own thread)", "(executor/runner"),
    ("toolexec: payloads", "(executor/payloads"),
    ("toolexec: fallback / last-good", "(fallback/"),
    ("toolexec: faults", "(executor/faults"),
    ("toolexec: log line", "(executor/logs"),
    ("toolexec: lease sweeper (background)", "(tasks/lease_sweeper"),
    ("toolexec: catalog heartbeat (background)", "(tasks/catalog_publisher"),
    ("toolexec: client validation (jsonschema)", "(jsonschema/"),
    ("toolexec: publish (send_task, events)", "(executor/client/publish"),
    ("toolexec: client prepare (rest)", "(executor/client/prepare"),
    ("pydantic (arguments, results)", "(pydantic"),
    ("toolexec: task + executor (rest)", "(tasks/tool_task"),
    ("toolexec: task + executor (rest)", "(executor/execution"),
    ("toolexec: task + executor (rest)", "(tasks/runtime"),
    ("toolexec: task + executor (rest)", "(executor/layers"),
    ("toolexec: client (rest)", "(executor/client"),
    ("celery: events", "(celery/events"),
    ("celery: task tracing", "(celery/app/trace"),
    ("kombu (transport: receive, ack, publish)", "(kombu/"),
    ("celery: worker consumer + request", "(celery/worker"),
    ("redis-py", "(redis/"),
    ("logging", "(logging/"),
    ("json", "(json/"),
]


def bucket_of(stack: list[str]) -> str:
    for name, needle in BUCKETS:
        if any(needle in frame for frame in stack):
            return name
    return "other"


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw format: ``frame;frame;... count`` per line, outermost first."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            out.append((stack.split(";"), int(count)))
    return out


def table(samples: list[tuple[list[str], int]], calls: int) -> list[list[str]]:
    per_bucket: Counter[str] = Counter()
    for stack, count in samples:
        per_bucket[bucket_of(stack)] += count
    total = sum(per_bucket.values()) or 1
    rows = []
    for name, count in per_bucket.most_common():
        ms = 1000 * count / RATE / calls
        rows.append([name, f"{ms:.3f}", f"{100 * count / total:.0f}%"])
    rows.append(["total (sampled)", f"{1000 * total / RATE / calls:.3f}", "100%"])
    return rows


def hottest(samples: list[tuple[list[str], int]], calls: int, n: int = 15) -> list[list[str]]:
    """toolexec functions by inclusive CPU per call (a frame counted once per stack)."""
    inclusive: Counter[str] = Counter()
    for stack, count in samples:
        for frame in {_function(f) for f in stack}:
            ours = any(k in frame for k in ("(executor/", "(tasks/", "(fallback/"))
            if ours and not any(k in frame for k in ("(executor/ops/cli", "(executor/__main__")):
                inclusive[frame] += count
    return [
        [frame[:110], f"{1000 * count / RATE / calls:.3f}"]
        for frame, count in inclusive.most_common(n)
    ]


def _function(frame: str) -> str:
    """``name (path:line)`` without the line, so a function counts once."""
    return re.sub(r":\d+\)$", ")", frame)


def spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    require(Path(exe).exists(), "py-spy is not installed: pip install -e '.[bench]'")
    argv = [exe, "record", "-p", str(pid), "-r", str(RATE), "-d", str(int(seconds))]
    # --gil: only threads holding the GIL, i.e. Python at work, not waiting on a socket
    argv += ["-f", "raw", "-o", str(out), "--nonblocking", "--gil"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds sampled (20)")
    parser.add_argument("--round", type=int, default=200, help="calls per call_many (200)")
    args = parser.parse_args(argv)
    loads = [load_average()]
    with own_server() as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        settings = run_settings(server.url, tmp)
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
            client.call_many([("bench_noop", {})] * 50, timeout=60)
            progress(f"sampling worker and client for {args.seconds} s of call_many rounds")
            spies = [
                spy(proc.process.pid, args.seconds, tmp / "worker.txt"),
                spy(os.getpid(), args.seconds, tmp / "client.txt"),
            ]
            time.sleep(0.5)  # py-spy attaches
            calls, end = 0, time.monotonic() + args.seconds - 1.0
            while time.monotonic() < end:
                results = client.call_many([("bench_noop", {})] * args.round, timeout=600)
                require(all(r.ok for r in results), "a profiled call failed")
                calls += args.round
            for s in spies:
                s.wait(args.seconds + 30)
            worker_samples = read_raw(tmp / "worker.txt")
            client_samples = read_raw(tmp / "client.txt")
        loads.append(load_average())
    print(f"\n## Where the CPU goes: {calls} no-op calls in call_many rounds of {args.round}\n")
    for who, samples in (("worker", worker_samples), ("client", client_samples)):
        print(f"### {who}: ms of CPU per call, by part\n")
        print(markdown_table(["part", "ms per call", "share"], table(samples, calls)))
        print(f"\n### {who}: hottest functions, inclusive ms per call\n")
        print(markdown_table(["function (file)", "ms per call"], hottest(samples, calls)))
        print()
    print(
        f"- py-spy at {RATE} Hz, threads holding the GIL only; load average "
        + ", ".join(f"{x:.2f}" for x in loads)
        + f" on {os.cpu_count()} core(s)"
    )
    print(f"\ncommand: `{command_line()}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
