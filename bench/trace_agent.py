"""The agent side of bench/observability.py's tracing rows, in a process of its own.

Tracing is set up per process (``OTEL_*``, one global tracer provider), so the
traced and untraced agents cannot share the benchmark's process: each round
runs this script with or without the variables. It makes ``N`` sequential
no-op calls after a warm-up and prints their round trips (ms) as JSON, with
with ``LOOP`` > 0, the time the client's own tracing work takes per call (µs:
the call span, the send span and its headers, the end), measured in a loop
afterwards. The loop exports its spans too, so the benchmark runs it apart,
after the round trips, where the export cannot slow another agent's calls.
Usage: ``python bench/trace_agent.py N [LOOP]`` with ``TOOLEXEC_*`` and ``OTEL_*`` set.
"""

from __future__ import annotations

import json
import sys
import time

from toolexec.client import ToolClient
from toolexec.tracing import end_call, inject_headers, start_call

CALL_TIMEOUT_S = 600.0


def client_tracing_us(loop: int) -> float:
    """The client's tracing work for one call, in µs (the best of three loops)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for i in range(loop):
            span = start_call("bench_noop", f"c{i}", None, 0.0, "q")
            inject_headers(span, "q", f"c{i}", "tools.bench_noop")
            end_call(span, "ok", None, 1)
        best = min(best, (time.perf_counter() - started) / loop * 1e6)
    return best


def main() -> int:
    calls = int(sys.argv[1])
    samples = []
    with ToolClient.from_env() as client:
        for _ in range(5):  # catalog, connections, imports
            client.call("bench_noop", {}, timeout=CALL_TIMEOUT_S)
        for _ in range(calls):
            started = time.perf_counter()
            result = client.call("bench_noop", {}, timeout=CALL_TIMEOUT_S)
            samples.append((time.perf_counter() - started) * 1000)
            if not result.ok:
                raise SystemExit(f"a call failed: {result}")
        # after the client configured tracing from OTEL_*
        loop = int(sys.argv[2]) if len(sys.argv) > 2 else 0
        tracing_us = client_tracing_us(loop) if loop else None
    json.dump({"round_trips_ms": samples, "client_tracing_us": tracing_us}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
