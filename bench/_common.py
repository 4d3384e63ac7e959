"""What every benchmark needs: a Redis, real workers, fair timing and a report.

A benchmark's figures mean something only next to the machine and command
that produced them and next to a baseline measured in the same run, so these
helpers start their own server and worker (or use the one given), alternate
the order of the contenders between rounds so that machine noise hits both,
and print the exact command line and the machine with every table.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import redis

from toolexec.embedded import ensure_embedded, stop_embedded
from toolexec.ops.processes import process_name
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

__all__ = [
    "BENCH_DIR",
    "CpuMeter",
    "Row",
    "Server",
    "command_line",
    "cpu_seconds",
    "forget",
    "interleave",
    "machine_info",
    "markdown_table",
    "median",
    "percentile",
    "print_report",
    "progress",
    "redis_server",
    "require",
    "rss_kib",
    "run_settings",
    "spawn",
    "timed",
    "worker",
]

BENCH_DIR = Path(__file__).resolve().parent
#: The test rigs (chaos, capacity, localcluster) live in tests/rigs/, outside the package.
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
T = TypeVar("T")


@dataclass(frozen=True)
class Server:
    """The Redis a benchmark runs on; ``pid`` is known only for the embedded one."""

    url: str
    pid: int | None = None


def progress(message: str) -> None:
    """Progress goes to stderr, so that stdout holds only the report."""
    print(message, file=sys.stderr, flush=True)


def require(ok: bool, problem: str) -> None:
    """A call that ended wrongly voids the figures: stop the run rather than report them."""
    if not ok:
        raise RuntimeError(problem)


@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[Server]:
    """``url`` when given, else a fresh embedded Valkey that is stopped afterwards."""
    if url:
        yield Server(url)
        return
    with tempfile.TemporaryDirectory(prefix="toolexec-bench-") as tmp:
        data_dir = Path(tmp)
        embedded = ensure_embedded(data_dir)
        try:
            yield Server(embedded.url, embedded.pid)
        finally:
            stop_embedded(data_dir)


def run_settings(redis_url: str, data_dir: Path, **overrides: Any) -> Settings:
    """Settings private to this run: its own key prefix and default queue.

    A shared server may have other workers on the ``tools`` queue; a queue of
    our own keeps them from taking (and skewing) the benchmark's messages.
    """
    run = f"bench-{uuid.uuid4().hex[:8]}"
    fields: dict[str, Any] = {
        "redis_url": redis_url,
        "data_dir": data_dir,
        "key_prefix": run,
        "default_queue": run,
        **overrides,
    }
    return Settings(**fields)


def _worker_env(settings: Settings) -> dict[str, str]:
    paths = [str(BENCH_DIR), os.environ.get("PYTHONPATH", "")]
    return {
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
        "TOOLEXEC_TASK_EVENTS": "true" if settings.task_events else "false",
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        **({"TOOLEXEC_BROKER_URL": settings.broker_url} if settings.broker_url else {}),
    }


@contextlib.contextmanager
def worker(
    settings: Settings,
    tools: str,
    *,
    concurrency: int,
    pool: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    queues: str | None = None,
    processes: int = 1,
) -> Iterator[WorkerProcess]:
    """A real worker importing ``tools`` (a module under bench/), stopped afterwards.

    ``env`` adds variables (settings the worker needs beyond ``settings``');
    ``queues`` limits what it consumes (default: every tool's queue);
    ``processes`` > 1 runs ``toolexec worker --processes N`` (its last process is
    waited for; the supervisor's pid is the process's, :func:`tree_cpu_seconds` adds
    the others' CPU).
    """
    proc = WorkerProcess(
        tools,
        {**_worker_env(settings), **(env or {})},
        queues=queues,
        concurrency=concurrency,
        pool=pool,
        log_path=log_path,
        cwd=BENCH_DIR,
    )
    if processes > 1:
        proc.args += ["--processes", str(processes)]
        proc.hostname = process_name(proc.hostname, processes)  # the last one started
    proc.start(settings.redis_url or "", settings.key_prefix, timeout=60.0)
    try:
        yield proc
    finally:
        proc.stop()


def forget(redis_url: str, settings: Settings, result_ids: Sequence[str] = ()) -> None:
    """Delete what the run left on the server: its keys, queue and stored results."""
    client = redis.Redis.from_url(redis_url)
    with contextlib.closing(client):
        pipe = client.pipeline(transaction=False)
        for key in client.scan_iter(f"{settings.key_prefix}:*", count=1000):
            pipe.delete(key)
        queue = settings.default_queue
        pipe.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        for task_id in result_ids:
            pipe.delete(f"celery-task-meta-{task_id}")
        pipe.execute()


@contextlib.contextmanager
def spawn(argv: Sequence[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A worker or peer process run from bench/, in a session of its own, output discarded.

    Stopped as an operator stops one: SIGTERM to its whole group (a prefork or
    multi-process worker has children), SIGKILL if it has not exited 10 s later.
    """
    proc = subprocess.Popen(
        list(argv),
        cwd=BENCH_DIR,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` (Linux ``/proc``), 0 once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def timed(func: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``func`` took, and what it returned."""
    start = time.perf_counter()
    value = func()
    return time.perf_counter() - start, value


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used (Linux ``/proc``), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float | None:
    """:func:`cpu_seconds` of ``pid`` and of its children (a worker's processes)."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return own + sum(cpu_seconds(int(child)) or 0.0 for child in children)


@dataclass
class CpuMeter:
    """CPU seconds each watched process spends inside :meth:`measure`.

    On a small machine the worker, the caller and the server share the cores;
    the CPU each spends per call says which one bounds the throughput.
    """

    pids: dict[str, int]
    spent: dict[str, float] = field(default_factory=dict)

    def measure(self, func: Callable[[], T]) -> T:
        before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        value = func()
        for name, pid in self.pids.items():
            start, end = before[name], cpu_seconds(pid)
            if start is not None and end is not None:
                self.spent[name] = self.spent.get(name, 0.0) + end - start
        return value

    def per_call_ms(self, calls: int) -> str:
        return " / ".join(f"{name} {1000 * s / calls:.2f}" for name, s in self.spent.items())

    def total_per_call_s(self, calls: int) -> float:
        return sum(self.spent.values()) / calls


def interleave(rounds: int, contenders: Mapping[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Each contender's outcome per round, the order reversed every other round.

    Alternating A B, B A, ... spreads slow drift (thermal, a noisy neighbour,
    a growing Redis) over every contender instead of one.
    """
    names = list(contenders)
    out: dict[str, list[T]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            out[name].append(contenders[name]())
    return out


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0-100) of ``samples``."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


@dataclass(frozen=True)
class Row:
    """One line of a report: a figure for each side, their ratio and the target."""

    scenario: str
    metric: str
    baseline: str
    toolexec: str
    ratio: float
    target: str
    passed: bool | None  # None: for information, no target

    def cells(self) -> list[str]:
        verdict = "-" if self.passed is None else ("PASS" if self.passed else "FAIL")
        return [
            self.scenario,
            self.metric,
            self.baseline,
            self.toolexec,
            f"{self.ratio:.2f}x",
            self.target,
            verdict,
        ]


ROW_HEADERS = ["scenario", "metric", "baseline", "toolexec", "ratio", "target", "result"]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    """The command exactly as typed (interpreter, flags and script arguments)."""
    return shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _server_version(redis_url: str) -> str:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with contextlib.closing(client):
        info: dict[str, Any] = client.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info.get('redis_version', '?')}"


def machine_info(redis_url: str) -> list[tuple[str, str]]:
    return [
        ("cores", str(os.cpu_count())),
        ("cpu", _cpu_model()),
        ("os", platform.platform()),
        ("python", platform.python_version()),
        ("celery", version("celery")),
        ("kombu", version("kombu")),
        ("redis-py", version("redis")),
        ("server", _server_version(redis_url)),
    ]


def print_report(
    title: str, rows: Sequence[Row], info: Sequence[tuple[str, str]], notes: Sequence[str]
) -> None:
    print(f"\n## {title}\n")
    print(markdown_table(ROW_HEADERS, [row.cells() for row in rows]))
    print()
    for note in notes:
        print(f"- {note}")
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{key} {value}" for key, value in info))
    sys.stdout.flush()
