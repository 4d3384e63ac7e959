"""What observing calls costs: per-minute Redis counters, Prometheus metrics and JSON logs.

Two workers on one Redis run the same no-op tool, each on a queue and key
prefix of its own: one with everything off (``TOOLEXEC_STATS=false``, no
metrics server, text logs), one with everything on (counters for ``toolexec
status``, ``--metrics-port``, ``TOOLEXEC_LOG_FORMAT=json``). Rounds alternate
between them:

1. sequential round trip of a no-op (``ToolClient.call``): p50 and p99;
2. a burst of calls with ``call_many``: calls/s and the worker's CPU per call.

Then it times one ``toolexec status`` read and one ``/metrics`` scrape of the
observed worker. Usage: ``python bench/observability.py [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from _common import (
    CpuMeter,
    Row,
    interleave,
    machine_info,
    percentile,
    print_report,
    redis_server,
    run_settings,
    timed,
    worker,
)

from toolexec.client import ToolClient
from toolexec.ops.status import gather
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

CALL_TIMEOUT_S = 600.0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sequential(client: ToolClient, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        took, result = timed(lambda: client.call("bench_noop", {}, timeout=CALL_TIMEOUT_S))
        if not result.ok:
            raise SystemExit(f"a call failed: {result}")
        samples.append(took * 1000)
    return samples


def _burst(client: ToolClient, meter: CpuMeter, calls: int) -> float:
    def run() -> float:
        took, results = timed(
            lambda: client.call_many([("bench_noop", {})] * calls, timeout=CALL_TIMEOUT_S)
        )
        if not all(r.ok for r in results):
            raise SystemExit("a call of the burst failed")
        return calls / took

    return meter.measure(run)


def _row(scenario: str, metric: str, off: float, on: float, fmt: str = "{:.2f}") -> Row:
    return Row(scenario, metric, fmt.format(off), fmt.format(on), on / off, "-", None)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="A few calls, to check it runs.")
    parser.add_argument("--redis-url", default=None, help="Default: a fresh embedded Valkey.")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sequential", type=int, default=400, help="Calls per round.")
    parser.add_argument("--burst", type=int, default=1500, help="Calls per burst.")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.sequential, args.burst = 2, 20, 50
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    port = _free_port()
    with ExitStack() as stack:
        server = stack.enter_context(redis_server(args.redis_url))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolexec-obs-")))
        modes = {
            "off": ({"TOOLEXEC_STATS": "false"}, run_settings(server.url, tmp, stats=False)),
            "on": (
                {"TOOLEXEC_LOG_FORMAT": "json", "TOOLEXEC_METRICS_PORT": str(port)},
                run_settings(server.url, tmp),
            ),
        }
        workers: dict[str, WorkerProcess] = {}
        clients: dict[str, ToolClient] = {}
        for name, (env, settings) in modes.items():
            workers[name] = stack.enter_context(
                worker(
                    settings,
                    "bench_tools",
                    concurrency=16,
                    pool="threads",
                    log_path=tmp / f"{name}.log",
                    env=env,
                )
            )
            clients[name] = stack.enter_context(ToolClient(settings))
        rows = _measure(args, clients, workers)
        rows += _reads(modes["on"][1], port)
        info = machine_info(server.url)
    print_report(
        "Observing calls: counters, metrics and JSON logs on vs off",
        rows,
        info,
        [
            "baseline = TOOLEXEC_STATS=false, no metrics server, text logs; "
            "toolexec = counters + --metrics-port + JSON logs",
            f"{args.rounds} interleaved rounds; one worker each, threads pool, 16 slots",
        ],
    )
    return 0


def _measure(
    args: argparse.Namespace, clients: dict[str, ToolClient], workers: dict[str, WorkerProcess]
) -> list[Row]:
    for client in clients.values():  # warm up: catalog, connections, imports
        _sequential(client, 5)
    latency = interleave(
        args.rounds,
        {name: _bound(_sequential, client, args.sequential) for name, client in clients.items()},
    )
    meters = {
        name: CpuMeter({"worker": proc.process.pid}) if proc.process else CpuMeter({})
        for name, proc in workers.items()
    }
    throughput = interleave(
        args.rounds,
        {name: _bound(_burst, clients[name], meters[name], args.burst) for name in clients},
    )
    off, on = ([ms for r in latency[k] for ms in r] for k in ("off", "on"))  # type: ignore[attr-defined]
    calls = args.rounds * args.burst
    cpu = {k: 1000 * meters[k].total_per_call_s(calls) for k in meters}
    return [
        _row(f"sequential round trip, {len(off)} calls", "p50 ms", _p(off, 50), _p(on, 50)),
        _row(f"sequential round trip, {len(off)} calls", "p99 ms", _p(off, 99), _p(on, 99)),
        _row(
            f"call_many burst, {args.burst} calls",
            "calls/s",
            max(throughput["off"]),
            max(throughput["on"]),
            "{:.0f}",
        ),
        _row(f"call_many burst, {args.burst} calls", "worker CPU ms/call", cpu["off"], cpu["on"]),
    ]


def _reads(settings: Settings, port: int) -> list[Row]:
    status_s, _ = timed(lambda: gather(settings, minutes=5))
    scrape_s, _ = timed(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    )
    return [
        Row("toolexec status --json (gather)", "ms", "-", f"{status_s * 1000:.1f}", 1.0, "-", None),
        Row("GET /metrics", "ms", "-", f"{scrape_s * 1000:.1f}", 1.0, "-", None),
    ]


def _bound(func: Callable[..., object], *args: object) -> Callable[[], object]:
    return lambda: func(*args)


def _p(samples: list[float], q: float) -> float:
    return percentile(samples, q)


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"\n(took {time.monotonic() - started:.0f} s)")
    sys.exit(code)
