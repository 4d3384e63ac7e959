"""Peers on the same no-op: Dramatiq (``bench/overhead.py --peers``, extra ``[bench]``).

Sequential round trip p50 and a burst (``send()`` each, then ``get_result``
each), on a Valkey of its own, with a worker of 1 process x 8 threads like the
other sides. arq is left out: it pins redis-py below 6, which kombu 5.7 cannot
use, so it cannot share this environment.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

from _common import BENCH_DIR, markdown_table, median, percentile, progress, spawn


@contextlib.contextmanager
def dramatiq_worker(url: str) -> Iterator[None]:
    argv = [sys.executable, "-m", "dramatiq", "peer_dramatiq", "--processes", "1"]
    argv += ["--threads", "8"]
    env = {**os.environ, "PEER_REDIS_URL": url, "PYTHONPATH": str(BENCH_DIR)}
    with spawn(argv, env):
        yield


def run_peers(url: str, calls: int, burst: int, rounds: int) -> None:
    os.environ["PEER_REDIS_URL"] = url
    import peer_dramatiq

    progress("peers: Dramatiq")
    with dramatiq_worker(url):
        peer_dramatiq.noop.send().get_result(block=True, timeout=60_000)  # ready
        latencies: list[float] = []
        bursts: list[float] = []
        for _ in range(rounds):
            for _ in range(calls):
                start = time.perf_counter()
                peer_dramatiq.noop.send().get_result(block=True, timeout=600_000)
                latencies.append(time.perf_counter() - start)
            start = time.perf_counter()
            sent = [peer_dramatiq.noop.send() for _ in range(burst)]
            for message in sent:
                message.get_result(block=True, timeout=600_000)
            bursts.append(time.perf_counter() - start)
    rows = [
        [
            "Dramatiq (1 process x 8 threads)",
            f"{1000 * percentile(latencies, 50):.2f}",
            f"{burst / median(bursts):.0f}",
        ]
    ]
    print("\n### Peers on the same no-op (same run, after the sides above)\n")
    print(markdown_table(["peer", "sequential p50 ms", f"{burst} no-ops, calls/s"], rows))
