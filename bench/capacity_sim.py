"""The capacity model as a simulation: checked against this machine, then run where it cannot reach.

Two tables (rigs.capacity holds the model; tests/unit/test_capacity.py its checks):

1. **The model against this machine.** A local 3-master Redis Cluster and
   RabbitMQ, 2 client processes x 12 threads calling ``scale_plain`` for
   ``--seconds`` against 1, 2 and 4 worker processes (bench/scaling.py's
   throughput run). The per-call CPU of each party is calibrated on the
   1-process row; what the other rows add is each idle worker process's own
   CPU (heartbeats, the lease sweeper, broker polls; measured apart, workers
   idle) and the cores other sessions took from the machine during each row
   (``/proc/stat``'s busy time less this run's processes). The model then
   predicts calls/s for 2 and 4 processes, by division and by simulation
   (24 callers waiting for their replies, one pool of shared cores).
2. **Fleets this machine cannot be.** 1 000, 10 000 and 100 000 calls/s
   through the fleets of docs/scaling.md's table and through the model's own
   sizing, simulated: throughput reached, latency, the busiest party; then
   the same at 10 000 calls/s with every call behind one circuit breaker.

    .venv/bin/python bench/capacity_sim.py [--seconds 8] [--broker amqp://.../tx-cluster]
    .venv/bin/python bench/capacity_sim.py --no-measure   # table 2 only
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from _common import command_line, markdown_table, progress, run_settings
from rigs.capacity import HOT as HOT_SLOT
from rigs.capacity import CallCost, Fleet, bottleneck, capacities, simulate, size_fleet
from rigs.localcluster import LocalCluster
from scaling import ClusterMeter, rabbit_pid, throughput, tree_cpu, workers

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
CALLERS = 24  # scaling.py: 2 client processes x 12 threads

#: docs/scaling.md section 3's call (breaker, idempotency key, run guard): CPU ms per call.
#: ``hot_ms`` is the breaker's scripts (one slot), the rest of Redis spreads over shards.
DOCS_CALL = CallCost(
    worker_ms=2.8, client_ms=1.7, broker_ms=0.65, redis_ms=0.6, hot_ms=0.2, messages=1.0
)
#: The breaker's and the retry budget's scripts a worker process runs per flush of its
#: tally (toolexec.stores.tally: one record of each per breaker every 0.25 s, whatever the
#: calls), on the breaker's slot: ms of Redis CPU per flush, and flushes a second.
FLUSH_HOT_MS = 0.2
FLUSHES_S = 4.0


def fast_path(cost: CallCost, rate: float, processes: float) -> CallCost:
    """``cost`` with the optimistic fast path: the hot slot's share is per flush, not per call.

    A healthy call writes nothing on the breaker's slot; each worker process writes
    its sums there ``FLUSHES_S`` times a second, so the slot's load follows the
    process count, and its share of one call shrinks as the rate grows.
    """
    return replace(cost, hot_ms=FLUSH_HOT_MS * FLUSHES_S * processes / rate)


#: The fleets of docs/scaling.md's sizing table (4-core RabbitMQ nodes).
DOCS_FLEETS = {
    1_000: Fleet(worker_cores=4, client_cores=3, redis_shards=3, broker_nodes=1),
    10_000: Fleet(worker_cores=40, client_cores=24, redis_shards=12, broker_nodes=3),
    100_000: Fleet(worker_cores=400, client_cores=240, redis_shards=115, broker_nodes=24),
}


# -- table 1: against this machine ----------------------------------------------------


def _machine_busy() -> float:
    with open("/proc/stat") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def idle_worker_cores(settings: object, tmp: Path, seconds: float) -> float:
    """Cores one idle worker process uses (the cost a process adds whatever the load)."""
    with workers(settings, 2, tmp) as pids:  # type: ignore[arg-type]
        time.sleep(2.0)
        before = sum(tree_cpu(p) for p in pids)
        time.sleep(seconds)
        return (sum(tree_cpu(p) for p in pids) - before) / seconds / 2


def measure(broker: str, seconds: float, counts: Sequence[int]) -> list[dict[str, float]]:
    """bench/scaling.py's throughput rows, each with the cores other sessions took meanwhile."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="toolexec-capsim-") as name:
        tmp = Path(name)
        cluster = LocalCluster(tmp / "cluster").start()
        try:
            settings = run_settings(cluster.url, tmp / "data", broker_url=broker)
            meter = ClusterMeter(cluster)
            idle = idle_worker_cores(settings, tmp, seconds)
            progress(f"an idle worker process: {idle:.3f} cores")
            for count in counts:
                busy0, t0 = _machine_busy(), time.monotonic()
                (row,) = throughput(settings, meter, [count], seconds, tmp)
                busy = (_machine_busy() - busy0) / (time.monotonic() - t0)
                ours = row["calls_s"] * _row_ms(row) / 1000.0  # during the calls
                row["others"] = max(0.0, busy - ours)
                row["idle"] = idle
                rows.append(row)
        finally:
            cluster.stop()
    return rows


def _row_ms(row: dict[str, float]) -> float:
    return row["worker_ms"] + row["redis_ms"] + row["broker_ms"] + row["client_ms"]


def calibrate(first: dict[str, float]) -> CallCost:
    """The 1-process row's CPU per call, less that process's idle share (added back per row)."""
    idle_ms = 1000.0 * first["idle"] / first["calls_s"]
    return CallCost(
        worker_ms=max(0.1, first["worker_ms"] - idle_ms),
        client_ms=first["client_ms"],
        broker_ms=first["broker_ms"],
        redis_ms=first["redis_ms"],
    )


def against_machine(rows: list[dict[str, float]], cores: float, seed: int) -> list[list[str]]:
    cost = calibrate(rows[0])
    out = []
    for row in rows:
        n = int(row["workers"])
        # Cores left to the calls: the machine's, less other sessions', less idle processes'.
        left = max(0.1, cores - row["others"] - n * row["idle"])
        fleet = Fleet(shared_cores=left)
        divided = bottleneck(cost, fleet)[1]
        sim = simulate(cost, fleet, population=CALLERS, calls=6_000, seed=seed)
        out.append(
            [
                str(n),
                f"{row['calls_s']:.0f}",
                f"{row['others']:.2f}",
                f"{n * row['idle']:.2f}",
                f"{divided:.0f}",
                f"{sim.throughput:.0f}",
                f"{100 * (sim.throughput - row['calls_s']) / row['calls_s']:+.0f}%",
                f"{1000 * CALLERS / row['calls_s']:.0f}",
                f"{1000 * CALLERS / sim.throughput:.0f}",
            ]
        )
        progress(f"{n} process(es): {out[-1]}")
    return out


# -- table 2: fleets this machine cannot be ---------------------------------------------


def _describe(fleet: Fleet) -> str:
    return (
        f"{fleet.worker_cores:g} worker / {fleet.client_cores:g} client cores, "
        f"{fleet.redis_shards} shards, {fleet.broker_nodes} broker nodes, {fleet.queues} queue(s)"
    )


def scenario(name: str, cost: CallCost, fleet: Fleet, rate: float, seed: int) -> list[str]:
    calls = int(min(60_000, max(6_000, rate * 0.6)))
    sim = simulate(cost, fleet, rate=rate, calls=calls, seed=seed)
    first, allows = bottleneck(cost, fleet)
    use = sim.utilisation
    busiest = max(use, key=lambda k: use[k])
    row = [
        name,
        f"{rate:,.0f}",
        _describe(fleet),
        f"{allows:,.0f} ({first})",
        f"{sim.throughput:,.0f}",
        f"{sim.p50_ms:.1f} / {sim.p99_ms:.1f}",
        f"{busiest} {100 * use[busiest]:.0f}%",
    ]
    progress(f"{name} at {rate:g}/s: {row}")
    return row


def _queues(cost: CallCost, rate: float, queue_msgs_s: float) -> int:
    """Queues enough to keep each at 70% of one queue's rate (the model's sizing)."""
    return size_fleet(cost, rate, base=Fleet(queue_msgs_s=queue_msgs_s)).queues


def fleets(cost: CallCost, queue_msgs_s: float, seed: int) -> list[list[str]]:
    rows = []
    for rate, docs in DOCS_FLEETS.items():
        queues = _queues(cost, rate, queue_msgs_s)
        as_docs = replace(docs, queue_msgs_s=queue_msgs_s, queues=queues, hot_share=0.0)
        rows.append(scenario("docs/scaling.md's fleet", cost, as_docs, rate, seed))
        sized = size_fleet(cost, rate, base=Fleet(queue_msgs_s=queue_msgs_s))
        rows.append(scenario("the model's own sizing", cost, sized, rate, seed))
    queues = _queues(cost, 10_000, queue_msgs_s)
    one_breaker = replace(
        DOCS_FLEETS[10_000], queue_msgs_s=queue_msgs_s, queues=queues, hot_share=1.0
    )
    before = replace(cost, hot_ms=DOCS_CALL.hot_ms)
    name = "10k, every call behind one breaker"
    rows.append(scenario(f"{name}, a script per call (before)", before, one_breaker, 10_000, seed))
    more = replace(one_breaker, redis_shards=36)
    rows.append(scenario("the same, 3x the shards (before)", before, more, 10_000, seed))
    fast = fast_path(cost, 10_000, one_breaker.worker_cores)
    rows.append(scenario(f"{name}, fast path", fast, one_breaker, 10_000, seed))
    for label, hot in (("before", before), ("fast path", fast)):
        ceiling = capacities(hot, replace(one_breaker, redis_shards=10**6))
        progress(f"one breaker's ceiling, {label}: {ceiling[HOT_SLOT]:,.0f} calls/s (hot slot)")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--broker", default=BROKER)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--cores", type=float, default=float(os.cpu_count() or 2))
    parser.add_argument("--queue-msgs", type=float, default=None, help="one queue's msgs/s")
    parser.add_argument("--no-measure", action="store_true", help="table 2 only")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    queue_msgs = args.queue_msgs or QUEUE_MSGS_S
    if not args.no_measure:
        counts = [int(c) for c in args.workers.split(",")]
        rows = measure(args.broker, args.seconds, counts)
        table = against_machine(rows, args.cores, args.seed)
        print("\n## The model against this machine (scale_plain, 24 callers, shared cores)\n")
        headers = [
            "worker processes",
            "measured calls/s",
            "cores other sessions took",
            "cores idle workers took",
            "model: division",
            "model: simulation",
            "simulation vs measured",
            "measured latency ms (Little)",
            "simulated latency ms",
        ]
        print(markdown_table(headers, table))
        print(f"\ncalibrated on the 1-process row: {calibrate(rows[0])}")
    print(f"\n## Fleets this machine cannot be (one queue carries {queue_msgs:,.0f} msgs/s)\n")
    headers = [
        "fleet",
        "calls/s offered",
        "size",
        "model: ceiling (first bottleneck)",
        "simulated calls/s",
        "simulated p50 / p99 ms",
        "busiest (simulated)",
    ]
    print(markdown_table(headers, fleets(DOCS_CALL, queue_msgs, args.seed)))
    print(f"\nper call: {DOCS_CALL}")
    print(f"\ncommand: `{command_line()}`")
    if rabbit_pid() is None:
        print("(RabbitMQ's CPU could not be read: its column is 0)")


#: One queue's publish+consume rate with confirms measured by bench/rabbit_queue.py here
#: (a lower bound: the machine's 2 cores, not the queue, were saturated).
QUEUE_MSGS_S = 1_000.0


if __name__ == "__main__":
    main()
