"""What one call costs, and how throughput grows with worker processes: the capacity model's inputs.

toolexec's state on a local 3-master Redis Cluster (redis-server on loopback
ports, started here), RabbitMQ on 127.0.0.1:5672 as the broker. Three tables:

1. per call and per feature: Redis commands, bytes and script CPU (INFO
   commandstats of every master, reset before each feature), broker messages
   (tasks the workers received), worker CPU by pool type;
2. throughput against the number of worker processes (1, 2, 4, 8), with the CPU
   each party used per call, so the table says where the cores went;
3. the capacity model built from table 1 and checked against table 2.

    .venv/bin/python bench/scaling.py [--calls 300] [--seconds 8] [--broker amqp://.../vhost]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    BENCH_DIR,
    command_line,
    cpu_seconds,
    machine_info,
    markdown_table,
    progress,
    require,
    run_settings,
    worker,
)
from rigs.localcluster import LocalCluster

from toolexec.client import ToolClient
from toolexec.settings import Settings

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
CLIENT_THREADS = 12
RUN = uuid.uuid4().hex[:8]


# -- measuring ------------------------------------------------------------------


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live process in its process group (prefork children)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == root:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def rabbit_pid() -> int | None:
    """RabbitMQ's Erlang VM on this machine, to read its CPU (``/proc``, read-only)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "beam.smp":
                return int(entry.name)
    return None


@dataclass
class RedisTotals:
    by_command: dict[str, int] = field(default_factory=dict)
    commands: int = 0
    script_usec: float = 0.0
    usec: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    cpu_s: float = 0.0


class ClusterMeter:
    """Counters of every master of the cluster, summed: what the state costs the shards."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.nodes = [cluster.node(p) for p in cluster.master_ports()]
        self._cpu0 = 0.0

    def reset(self) -> None:
        for node in self.nodes:
            node.config_resetstat()
        self._cpu0 = self._cpu()

    def _cpu(self) -> float:
        total = 0.0
        for node in self.nodes:
            info = node.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return total

    def read(self) -> RedisTotals:
        out = RedisTotals(cpu_s=self._cpu() - self._cpu0)
        for node in self.nodes:
            for name, stat in node.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                if command in ("config", "info"):
                    continue  # the meter's own
                out.commands += int(stat["calls"])
                out.by_command[command] = out.by_command.get(command, 0) + int(stat["calls"])
                out.usec += float(stat["usec"])
                if command in ("eval", "evalsha"):
                    out.script_usec += float(stat["usec"])
            stats = node.info("stats")
            out.bytes_in += int(stats["total_net_input_bytes"])
            out.bytes_out += int(stats["total_net_output_bytes"])
        return out


def received(log: Path) -> int:
    """Task messages the worker took from the broker so far (its log says each)."""
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if "] received" in line)


# -- table 1: per call, per feature ----------------------------------------------


@dataclass(frozen=True)
class Feature:
    name: str
    run: Callable[[ToolClient, int], bool]


def _plain(tool: str) -> Callable[[ToolClient, int], bool]:
    return lambda client, _i: client.call(tool, {}, timeout=30).ok


def _idempotent(client: ToolClient, i: int) -> bool:
    key = f"k-{uuid.uuid4().hex}-{i}"
    return client.call("scale_idempotent", {"n": i}, timeout=30, idempotency_key=key).ok


def _payload(client: ToolClient, _i: int) -> bool:
    return client.call("scale_payload", {"size": 20_000}, timeout=30).ok


def _guarded(client: ToolClient, i: int) -> bool:
    """One call per round, each with other arguments (a repeat would be refused), 10 per run."""
    arguments = json.dumps({"n": i})
    call = {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "scale_echo", "arguments": arguments},
    }
    replies = client.run_tool_calls([call], run_id=f"run-{RUN}-{i // 10}")
    return len(replies) == 1 and f"echo-{i}" in json.dumps(replies)


def _retried(client: ToolClient, i: int) -> bool:
    """Two attempts: the first fails (transient), the second answers."""
    result = client.call("scale_retry", {"key": f"{RUN}-{uuid.uuid4().hex}-{i}"}, timeout=30)
    return result.ok


def _fell_back(client: ToolClient, _i: int) -> bool:
    """The primary fails once; its one alternative answers (a degraded result)."""
    result = client.call("scale_falls_back", {}, timeout=30)
    return result.ok and result.source == "scale_alternative"


FEATURES = [
    Feature("plain (no breaker)", _plain("scale_plain")),
    Feature("+ circuit breaker", _plain("scale_breaker")),
    Feature("+ idempotency key", _idempotent),
    Feature("+ payload offload (20 kB)", _payload),
    Feature("+ run guard (run_tool_calls)", _guarded),
    Feature("a retry (2 attempts)", _retried),
    Feature("a fallback (chain of one)", _fell_back),
]


#: Features whose Redis commands are listed by name (plain, and the two with extra messages).
BY_NAME = ("plain (no breaker)", "a retry (2 attempts)", "a fallback (chain of one)")


def per_feature(
    settings: Settings, meter: ClusterMeter, calls: int, pool: str, tmp: Path
) -> tuple[list[list[str]], dict[str, dict[str, float]]]:
    """Table 1's rows for ``pool``, and some features' Redis commands by name (per call)."""
    rows = []
    breakdown: dict[str, dict[str, float]] = {}
    log = tmp / f"features-{pool}.log"
    with (
        worker(settings, "scaling_tools", concurrency=8, pool=pool, log_path=log) as proc,
        ToolClient(settings) as client,
    ):
        features = FEATURES if pool == "threads" else FEATURES[:1]
        for feature in features:
            for i in range(20):  # warm: connections, script caches, catalog
                feature.run(client, i)
            meter.reset()
            got0, cpu0 = received(log), tree_cpu(proc.process.pid)
            start = time.perf_counter()
            for i in range(calls):
                require(feature.run(client, i), f"{feature.name}: call {i} failed")
            elapsed = time.perf_counter() - start
            cpu = tree_cpu(proc.process.pid) - cpu0
            messages = (received(log) - got0) / calls
            r = meter.read()
            if feature.name in BY_NAME:
                breakdown[feature.name] = {name: n / calls for name, n in r.by_command.items()}
            rows.append(
                [
                    feature.name,
                    pool,
                    f"{r.commands / calls:.1f}",
                    f"{(r.bytes_in + r.bytes_out) / calls / 1024:.1f}",
                    f"{r.script_usec / calls:.0f}",
                    f"{r.usec / calls:.0f}",
                    f"{1000 * r.cpu_s / calls:.2f}",
                    f"{messages:.2f}",
                    f"{1000 * cpu / calls:.2f}",
                    f"{1000 * elapsed / calls:.1f}",
                ]
            )
            progress(f"{feature.name} ({pool}): {rows[-1]}")
    return rows, breakdown


# -- table 2: throughput against worker processes ---------------------------------


def load_child(seconds: float, threads: int) -> None:
    """Run in a subprocess: call scale_plain from ``threads`` threads for ``seconds``."""
    settings = Settings.from_env()
    done, failed = [0], [0]
    lock = threading.Lock()
    with ToolClient(settings) as client:
        client.call("scale_plain", {}, timeout=30)
        end = time.monotonic() + seconds

        def loop() -> None:
            while time.monotonic() < end:
                ok = client.call("scale_plain", {}, timeout=30).ok
                with lock:
                    (done if ok else failed)[0] += 1

        pool = [threading.Thread(target=loop) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    cpu = os.times()
    print(json.dumps({"done": done[0], "failed": failed[0], "cpu": cpu.user + cpu.system}))


def _client_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_BROKER_URL": settings.broker_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
    }


@contextlib.contextmanager
def workers(settings: Settings, count: int, tmp: Path) -> Iterator[list[int]]:
    with contextlib.ExitStack() as stack:
        pids = []
        for n in range(count):
            log = tmp / f"tp-{count}-{n}.log"
            proc = stack.enter_context(
                worker(settings, "scaling_tools", concurrency=8, pool="threads", log_path=log)
            )
            pids.append(proc.process.pid)
        yield pids


def throughput(
    settings: Settings, meter: ClusterMeter, counts: Sequence[int], seconds: float, tmp: Path
) -> list[dict[str, float]]:
    out = []
    rabbit = rabbit_pid()
    for count in counts:
        with workers(settings, count, tmp) as pids:
            meter.reset()
            w0 = sum(tree_cpu(p) for p in pids)
            b0 = cpu_seconds(rabbit) if rabbit else None
            children = [
                subprocess.Popen(
                    [sys.executable, __file__, "--load-child", str(seconds)],
                    env=_client_env(settings),
                    stdout=subprocess.PIPE,
                    cwd=BENCH_DIR,
                )
                for _ in range(2)
            ]
            results = [json.loads(c.communicate(timeout=seconds + 120)[0]) for c in children]
            calls = sum(r["done"] for r in results)
            require(calls > 0 and not sum(r["failed"] for r in results), f"{results}")
            r = meter.read()
            b1 = cpu_seconds(rabbit) if rabbit else None
            row = {
                "workers": count,
                "calls_s": calls / seconds,
                "worker_ms": 1000 * (sum(tree_cpu(p) for p in pids) - w0) / calls,
                "redis_ms": 1000 * r.cpu_s / calls,
                "broker_ms": 1000 * (b1 - b0) / calls if b0 is not None and b1 is not None else 0.0,
                "client_ms": 1000 * sum(x["cpu"] for x in results) / calls,
            }
            out.append(row)
            progress(f"{count} worker process(es): {row}")
    return out


# -- the report --------------------------------------------------------------------


def _total_ms(t: dict[str, float]) -> float:
    return t["worker_ms"] + t["redis_ms"] + t["broker_ms"] + t["client_ms"]


def report(
    features: list[list[str]],
    breakdown: dict[str, dict[str, float]],
    tput: list[dict[str, float]],
    info: list[Any],
) -> None:
    print("\n## Cost of one call, per feature (3-master Redis Cluster, RabbitMQ broker)\n")
    print(
        markdown_table(
            [
                "feature",
                "pool",
                "Redis cmds",
                "Redis kB in+out",
                "script µs",
                "all cmds µs",
                "Redis CPU ms",
                "broker msgs",
                "worker CPU ms",
                "latency ms",
            ],
            features,
        )
    )
    print("\n## Redis commands of one call, by name (those inside scripts included)\n")
    names = [n for n in BY_NAME if n in breakdown]
    every = {c for n in names for c in breakdown[n]}
    ranked = sorted(every, key=lambda c: [-breakdown[n].get(c, 0.0) for n in names])
    print(
        markdown_table(
            ["command", *names],
            [
                [c.replace("|", "\\|"), *(f"{breakdown[n].get(c, 0.0):.2f}" for n in names)]
                for c in ranked
                if max(breakdown[n].get(c, 0.0) for n in names) >= 0.05
            ],
        )
    )
    print("\n## Throughput against worker processes (threads pool, 8 slots each)\n")
    rows = [
        [
            str(int(t["workers"])),
            f"{t['calls_s']:.0f}",
            f"{t['worker_ms']:.2f}",
            f"{t['redis_ms']:.2f}",
            f"{t['broker_ms']:.2f}",
            f"{t['client_ms']:.2f}",
            f"{t['worker_ms'] + t['redis_ms'] + t['broker_ms'] + t['client_ms']:.2f}",
            f"{2000 / (t['worker_ms'] + t['redis_ms'] + t['broker_ms'] + t['client_ms']):.0f}",
            f"{t['calls_s'] * _total_ms(t) / 1000:.2f}",
        ]
        for t in tput
    ]
    print(
        markdown_table(
            [
                "worker processes",
                "calls/s",
                "worker CPU ms/call",
                "Redis CPU ms/call",
                "RabbitMQ CPU ms/call",
                "client CPU ms/call",
                "total CPU ms/call",
                "model: 2 cores / total",
                "cores used (calls/s × total)",
            ],
            rows,
        )
    )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (other sessions share the cores)")
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument(
        "--broker", default=BROKER, help="AMQP URL; a vhost of the run's own keeps it apart"
    )
    parser.add_argument("--load-child", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load_child is not None:
        load_child(args.load_child, CLIENT_THREADS)
        return
    with tempfile.TemporaryDirectory(prefix="toolexec-scaling-") as tmp_name:
        tmp = Path(tmp_name)
        cluster = LocalCluster(tmp / "cluster").start()
        try:
            settings = run_settings(cluster.url, tmp / "data", broker_url=args.broker)
            meter = ClusterMeter(cluster)
            features, breakdown = per_feature(settings, meter, args.calls, "threads", tmp)
            features += per_feature(settings, meter, args.calls, "prefork", tmp)[0]
            counts = [int(c) for c in args.workers.split(",")]
            tput = throughput(settings, meter, counts, args.seconds, tmp)
            port = cluster.master_ports()[0]
            report(features, breakdown, tput, machine_info(f"redis://127.0.0.1:{port}"))
        finally:
            cluster.stop()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
