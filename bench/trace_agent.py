"""The agent side of bench/observability.py's tracing rows, in a process of its own.

Tracing is set up per process (``OTEL_*``, one global tracer provider), so the
traced and untraced agents cannot share the benchmark's process: each round
runs this script with or without the variables. It makes ``N`` sequential
no-op calls after a warm-up and prints their round trips (ms) as JSON.
Usage: ``python bench/trace_agent.py N`` with ``TOOLEXEC_*`` and ``OTEL_*`` set.
"""

from __future__ import annotations

import json
import sys
import time

from toolexec.client import ToolClient

CALL_TIMEOUT_S = 600.0


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
    json.dump(samples, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
