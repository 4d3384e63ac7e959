"""The client's sending and reply parsing, before and after pipelining, in one run.

``call_many`` used to send each call with its own ``send_task`` round trips
(the queue push and the task-sent event, two per call); it now sends them
through kombu's publish batch. This sends the same prepared calls both ways to
a Valkey of its own (no worker: the messages are counted and deleted), rounds
interleaved, and reports wall time, this process's CPU and the round trips per
call; then parses the same replies the old way (``json.loads`` +
``model_validate``) and the new (``model_validate_json``).

Usage: ``python bench/publish.py [--calls N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import bench_tools  # noqa: F401  (registers bench_noop)
import redis
from _common import command_line, interleave, machine_info, markdown_table, median, run_settings
from overhead import command_counts, load_average, own_server

from toolexec.client import ToolClient
from toolexec.client.publish import publish
from toolexec.redaction import shown_kwargs
from toolexec.registry import default_registry
from toolexec.results import ToolResult
from toolexec.stores import liveness
from toolexec.stores.catalog import publish as publish_catalog


def one_by_one(client: ToolClient, batch: Sequence) -> None:  # type: ignore[type-arg]
    """The sending loop as it was: one ``send_task`` after another, no batch."""
    with client.app.producer_or_acquire() as producer:
        for p in batch:
            kwargs = {"arguments": p.arguments, "context": p.ctx.to_json()}
            client.app.send_task(
                f"tools.{p.ctx.tool}",
                kwargs=kwargs,
                kwargsrepr=shown_kwargs(kwargs, p.secrets),
                task_id=p.ctx.call_id,
                queue=p.queue,
                producer=producer,
                ignore_result=True,
            )


def measured(
    send: Callable[[], None], server: redis.Redis, queue: str, calls: int
) -> tuple[float, float, float]:
    """(wall s, CPU s, commands per call) of one send; the queue is emptied afterwards."""
    before = command_counts(server)
    wall, cpu = time.perf_counter(), time.process_time()
    send()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = command_counts(server)
    sent = server.llen(queue)
    server.delete(queue)
    assert sent == calls, f"{sent} messages in the queue, expected {calls}"
    commands = sum(after.values()) - sum(before.values()) - 1  # less the INFO
    return wall, cpu, commands / calls


def parse_rows(calls: int, rounds: int) -> list[list[str]]:
    raw = ToolResult(
        status="ok", tool="t", call_id="c", data={"city": "Paris", "temp_c": 21.5}, attempts=1
    ).model_dump_json()

    def old() -> float:
        start = time.process_time()
        for _ in range(calls):
            ToolResult.model_validate(json.loads(raw))
        return time.process_time() - start

    def new() -> float:
        start = time.process_time()
        for _ in range(calls):
            ToolResult.model_validate_json(raw)
        return time.process_time() - start

    runs = interleave(rounds, {"before": old, "after": new})
    us = {k: 1e6 * median(v) / calls for k, v in runs.items()}
    return [
        [
            "parse one reply (CPU µs per call)",
            f"{us['before']:.1f}",
            f"{us['after']:.1f}",
            f"{us['after'] / us['before']:.2f}x",
        ]
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per send (2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, interleaved (5)")
    args = parser.parse_args(argv)
    loads = [load_average()]
    with own_server() as server, tempfile.TemporaryDirectory() as tmp:
        settings = run_settings(server.url, Path(tmp))
        info_client = redis.Redis.from_url(server.url)
        with ToolClient(settings) as client:
            # a catalog entry without a worker: the preparer needs the tool's schema
            spec = default_registry.get("bench_noop")
            assert spec is not None, "bench_tools registers bench_noop"
            specs = [spec]
            publish_catalog(
                client.redis, client.keys, specs, settings.default_queue, "bench", time.time()
            )
            # a heartbeat for the queue, or the client answers no_worker without sending
            liveness.beat(client.redis, client.keys, "bench", [settings.default_queue], time.time())
            batch = client.preparer.prepare_many([("bench_noop", {})] * args.calls, None, 60)
            queue = batch[0].queue or settings.default_queue
            runs = interleave(
                args.rounds,
                {
                    "before": lambda: measured(
                        lambda: one_by_one(client, batch), info_client, queue, args.calls
                    ),
                    "after": lambda: measured(
                        lambda: publish(client.app, batch), info_client, queue, args.calls
                    ),
                },
            )
        info = machine_info(server.url)
        info_client.close()
    loads.append(load_average())
    n = args.calls
    rows = []
    for label, index, scale, digits in (
        (f"send {n} calls, wall ms", 0, 1000, 1),
        ("send, client CPU µs per call", 1, 1e6 / n, 0),
        ("Redis commands per call", 2, 1, 1),
    ):
        b = median([r[index] for r in runs["before"]]) * scale
        a = median([r[index] for r in runs["after"]]) * scale
        rows.append([label, f"{b:.{digits}f}", f"{a:.{digits}f}", f"{a / b:.2f}x"])
    rows += parse_rows(n, args.rounds)
    print("\n## The client's sending and reply parsing, before and after\n")
    print(markdown_table(["figure", "before (one by one)", "after (batched)", "ratio"], rows))
    print(
        f"\n- {args.rounds} rounds, interleaved, medians; load average "
        + ", ".join(f"{x:.2f}" for x in loads)
        + f" on {os.cpu_count()} core(s)"
    )
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
