"""What observing calls costs: Redis counters, Prometheus metrics, JSON logs, and traces.

Two workers on one Redis run the same no-op tool, each on a queue and key
prefix of its own: one with everything off (``TOOLEXEC_STATS=false``, no
metrics server, text logs), one with everything on (counters for ``toolexec
status``, ``--metrics-port``, ``TOOLEXEC_LOG_FORMAT=json``). Rounds alternate
between them:

1. sequential round trip of a no-op (``ToolClient.call``): p50 and p99;
2. a burst of calls with ``call_many``: calls/s and the worker's CPU per call.

Then it times one ``toolexec status`` read and one ``/metrics`` scrape of the
observed worker.

Tracing (``toolexec.tracing``) is measured apart, since it is set up per
process: one worker without ``OTEL_*`` and one exporting OTLP/HTTP to a
receiver in this process, and an agent process per round
(``bench/trace_agent.py``) untraced, sampling 10 % (``parentbased_traceidratio``
0.1, the worker following the agent's decision) or sampling everything, in
interleaved rounds: sequential round trip p50 of each.

Usage: ``python bench/observability.py [--quick] [--tracing-only]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

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
from toolexec.ops.traces import OtlpReceiver
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
    parser.add_argument(
        "--tracing-only", action="store_true", help="Only the tracing rows (on vs off)."
    )
    parser.add_argument("--trace-rounds", type=int, default=6, help="Rounds of the tracing rows.")
    parser.add_argument(
        "--loop", type=int, default=20_000, help="Iterations of the client tracing-work loop."
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.sequential, args.burst, args.trace_rounds = 2, 20, 50, 1
        args.loop = 500
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    with ExitStack() as stack:
        server = stack.enter_context(redis_server(args.redis_url))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolexec-obs-")))
        if not args.tracing_only:
            _counters_metrics_logs(args, server.url, tmp)
        rows, spans = _tracing(args, server.url, tmp)
        info = machine_info(server.url)
    print_report(
        "Tracing: OpenTelemetry spans on vs off (toolexec.tracing)",
        rows,
        info,
        [
            "baseline = worker and agent without OTEL_* (no SDK: no-op spans); "
            "toolexec = OTLP/HTTP export to a loopback receiver, batch span processor",
            "A/A = the same untraced setup on a second worker: how far two identical "
            "workers differ here, the noise a ratio must clear; the baseline of the "
            "traced rows pools both untraced workers",
            f"{args.trace_rounds} interleaved rounds of {args.sequential} sequential calls; "
            "a fresh agent process per round; one worker each, threads pool, 16 slots",
            f"{spans} spans received over OTLP/HTTP",
        ],
    )
    return 0


def _counters_metrics_logs(args: argparse.Namespace, url: str, tmp: Path) -> None:
    port = _free_port()
    with ExitStack() as stack:
        modes = {
            "off": ({"TOOLEXEC_STATS": "false"}, run_settings(url, tmp, stats=False)),
            "on": (
                {"TOOLEXEC_LOG_FORMAT": "json", "TOOLEXEC_METRICS_PORT": str(port)},
                run_settings(url, tmp),
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
        info = machine_info(url)
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


def _otel_env(endpoint: str, service: str, ratio: float | None) -> dict[str, str]:
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": service,
    }
    if ratio is not None:
        env |= {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}
        env |= {"OTEL_TRACES_SAMPLER_ARG": str(ratio)}
    return env


def _untraced_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _agent(settings: Settings, otel: dict[str, str], calls: int, loop: int) -> dict[str, Any]:
    env = {
        **_untraced_env(),
        **otel,
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
    }
    script = Path(__file__).with_name("trace_agent.py")
    out = subprocess.run(
        [sys.executable, str(script), str(calls), str(loop)],
        env=env,
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"the agent failed: {out.stderr.decode()[-2000:]}")
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def _tracing(args: argparse.Namespace, url: str, tmp: Path) -> tuple[list[Row], int]:
    with ExitStack() as stack:
        receiver = stack.enter_context(OtlpReceiver())
        untraced = run_settings(url, tmp)
        control = run_settings(url, tmp)  # a second untraced worker: the noise floor
        traced = run_settings(url, tmp)
        for settings, env in (
            (untraced, {}),
            (control, {}),
            (traced, _otel_env(receiver.endpoint, "bench-worker", 0.1)),
        ):
            stack.enter_context(
                worker(
                    settings,
                    "bench_tools",
                    concurrency=16,
                    pool="threads",
                    log_path=tmp / f"trace-{settings.key_prefix}.log",
                    env=env,
                )
            )
        agents = {
            "off": _bound(_agent, untraced, {}, args.sequential, 0),
            "off-b": _bound(_agent, control, {}, args.sequential, 0),
            "10%": _bound(
                _agent,
                traced,
                _otel_env(receiver.endpoint, "bench-agent", 0.1),
                args.sequential,
                0,
            ),
            "100%": _bound(
                _agent,
                traced,
                _otel_env(receiver.endpoint, "bench-agent", 1.0),
                args.sequential,
                0,
            ),
        }
        runs = interleave(args.trace_rounds, agents)
        spans = len(receiver.snapshot())
        # the tracing-work loop, apart: its spans are exported while it runs
        loops = {
            "off": _agent(untraced, {}, 0, args.loop),
            "10%": _agent(traced, _otel_env(receiver.endpoint, "bench-agent", 0.1), 0, args.loop),
            "100%": _agent(traced, _otel_env(receiver.endpoint, "bench-agent", 1.0), 0, args.loop),
        }
    samples = {name: [ms for r in runs[name] for ms in r["round_trips_ms"]] for name in runs}  # type: ignore[index]
    client_us = {name: float(report["client_tracing_us"]) for name, report in loops.items()}
    p50 = {name: _p(values, 50) for name, values in samples.items()}
    # the baseline pools both untraced workers, so one worker's luck does not set it
    base = _p(samples["off"] + samples["off-b"], 50)
    scenario = f"sequential round trip, {args.trace_rounds * args.sequential} calls per agent"
    ratio = p50["10%"] / base
    return [
        _row(scenario, "p50 ms, untraced worker B vs A (A/A)", p50["off"], p50["off-b"]),
        Row(
            scenario,
            "p50 ms, sampling 10 %",
            f"{base:.2f}",
            f"{p50['10%']:.2f}",
            ratio,
            "<= 1.05x",
            ratio <= 1.05,
        ),
        _row(scenario, "p50 ms, sampling 100 %", base, p50["100%"]),
        _work(client_us, "10%", base),
        _work(client_us, "100%", base),
    ], spans


def _work(client_us: dict[str, float], mode: str, base_ms: float) -> Row:
    """The client's own tracing work per call (µs); its ratio is what it adds to the p50."""
    added_ms = (client_us[mode] - client_us["off"]) / 1000
    return Row(
        "client's tracing work per call (in-process loop; ratio: its share of the p50)",
        f"µs, sampling {mode.rstrip('%')} %",
        f"{client_us['off']:.1f}",
        f"{client_us[mode]:.1f}",
        (base_ms + added_ms) / base_ms,
        "-",
        None,
    )


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
