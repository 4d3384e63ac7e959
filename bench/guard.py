"""What the run guard costs, measured in one run.

1. A model turn of three calls on a real worker: ``ToolClient.call_many``
   (no guard) against ``ToolClient.run_tool_calls`` with a run id (parse the
   OpenAI message, plan the round in Redis, run, settle, render), the two
   alternating; target: the guarded p50 at most 3 ms above the bare one.
2. The guard alone, no worker: ``begin_round`` + ``end_round`` of a
   three-call round in a run that is already long; p50/p99, Redis commands per
   round (``INFO stats`` deltas) and the size of the stored state after 25
   and after ``--rounds`` rounds.

Usage: ``python bench/guard.py [--quick] [--redis-url URL]``. Exits 0 whatever
the figures (``--strict``: 1 when a target is missed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from _common import (
    Row,
    interleave,
    machine_info,
    median,
    percentile,
    print_report,
    redis_server,
    run_settings,
    worker,
)

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.guard import RunGuard
from toolexec.keys import Keys
from toolexec.policies import RunBudget
from toolexec.results import ToolResult

GUARD_EXTRA_MS = 3.0
#: No limits: the bench measures cost, so nothing may stop the run early.
OPEN = RunBudget(max_steps=None, max_wall_s=None, max_tool_errors=None)


def _message(turn: int) -> dict[str, Any]:
    """An assistant message with three calls whose arguments never repeat."""
    calls = [
        {
            "id": f"call_{turn}_{i}",
            "type": "function",
            "function": {"name": "bench_sleep", "arguments": json.dumps({"seconds": turn * 1e-9})},
        }
        for i in range(3)
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def turn_overhead(client: ToolClient, rounds: int) -> list[Row]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    counter = iter(range(1, 10 * rounds + 10))

    def bare() -> float:
        n = next(counter)
        start = time.perf_counter()
        client.call_many([("bench_sleep", {"seconds": n * 1e-9})] * 3)
        return (time.perf_counter() - start) * 1000

    def guarded() -> float:
        message = _message(next(counter))
        start = time.perf_counter()
        client.run_tool_calls(message, run_id=run_id, budget=OPEN)
        return (time.perf_counter() - start) * 1000

    for _ in range(5):  # warm up: catalog, connections, imports
        bare()
        guarded()
    samples = interleave(rounds, {"bare": bare, "guarded": guarded})
    b, g = median(samples["bare"]), median(samples["guarded"])
    return [
        Row(
            "a turn of 3 calls",
            "p50 ms",
            f"{b:.2f}",
            f"{g:.2f}",
            g / b,
            f"<= bare + {GUARD_EXTRA_MS:g} ms",
            g - b <= GUARD_EXTRA_MS,
        ),
        Row(
            "a turn of 3 calls",
            "p99 ms",
            f"{percentile(samples['bare'], 99):.2f}",
            f"{percentile(samples['guarded'], 99):.2f}",
            percentile(samples["guarded"], 99) / percentile(samples["bare"], 99),
            "-",
            None,
        ),
    ]


def _commands(rdb: redis.Redis) -> int:
    stats: dict[str, Any] = rdb.info("stats")  # type: ignore[assignment]
    return int(stats["total_commands_processed"])


def guard_alone(redis_url: str, rounds: int) -> list[str]:
    rdb = redis_client(redis_url)
    keys = Keys(f"bench-{uuid.uuid4().hex[:8]}")
    guard = RunGuard("bench-run", OPEN, redis=rdb, keys=keys)
    times, sizes = [], {}
    before = _commands(rdb)
    for n in range(1, rounds + 1):
        calls = [("bench_sleep", {"seconds": n * 1e-9 + i}) for i in range(3)]
        start = time.perf_counter()
        plan = guard.begin_round(calls, alternatives=["a", "b", "c"])
        results = [
            ToolResult(status="ok", tool=t, call_id=str(i), data=a)
            for i, (t, a) in enumerate(calls)
        ]
        guard.end_round(plan, results)
        times.append((time.perf_counter() - start) * 1000)
        if n in (25, rounds):
            sizes[n] = rdb.strlen(keys.run("bench-run"))
    per_round = (_commands(rdb) - before) / rounds
    rdb.delete(keys.run("bench-run"))
    rdb.close()
    notes = [
        f"guard alone (no worker), a 3-call round, {rounds} rounds: p50 {median(times):.2f} ms, "
        f"p99 {percentile(times, 99):.2f} ms, {per_round:.1f} Redis commands a round "
        "(GET + compare-and-set to begin, compare-and-set to end: 3 round trips)",
        *(f"stored state after {n} rounds: {size / 1024:.1f} KiB" for n, size in sizes.items()),
    ]
    return notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--redis-url", help="use this server instead of an embedded Valkey")
    parser.add_argument("--rounds", type=int, default=200, help="rounds of each scenario")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    rounds = 40 if args.quick else args.rounds
    with redis_server(args.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
        settings = run_settings(server.url, Path(tmp), task_events=False)
        log = Path(tmp) / "worker.log"
        with (
            worker(settings, "bench_tools", concurrency=8, pool="threads", log_path=log),
            ToolClient(settings) as client,
        ):
            rows = turn_overhead(client, rounds)
        notes = guard_alone(server.url, rounds)
        print_report(
            "Run guard overhead",
            rows,
            machine_info(server.url),
            ["baseline = call_many of three calls; toolexec = run_tool_calls of the same", *notes],
        )
    missed = [row for row in rows if row.passed is False]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
