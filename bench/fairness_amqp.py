"""Fairness keys on RabbitMQ (``TOOLEXEC_RABBITMQ_FAIRNESS``): what many keys cost a worker.

One threads worker of 8 slots on RabbitMQ, a queue of the run's own. For each
row, the worker's slots are held (a gate tool), ``--calls`` no-op calls are sent
spread over ``keys`` fairness keys (each key one queue, ``<queue>.fair.<key>.0``;
0 keys: the plain queue), then the slots are let go and the time the worker
takes to run them all is the drain rate. Also reported: how long after the
first call the worker consumed every key's queue (its discovery through Redis and
Celery's ``add_consumer``), and how many queues it consumes. Queues are deleted
at the end.

    .venv/bin/python bench/fairness_amqp.py [--calls 2000] [--keys 0,1,100,1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import command_line, markdown_table, progress, run_settings, worker
from kombu import Connection, Queue
from overhead import load_average, own_server

from toolexec.client import ToolClient
from toolexec.keys import Keys
from toolexec.settings import Settings
from toolexec.worker.consumer import read_beats

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
SLOTS = 8


def _consumed(settings: Settings) -> int:
    beats = read_beats(settings.data_dir)
    return max((len(b.queues) for b in beats), default=0)


def _row(broker: str, redis_url: str, tmp: Path, calls: int, keys: int) -> list[str]:
    data = tmp / f"k{keys}"
    data.mkdir()
    settings = run_settings(redis_url, data, broker_url=broker, rabbitmq_fairness=True)
    env = {"TOOLEXEC_RABBITMQ_FAIRNESS": "true", "TOOLEXEC_BROKER_URL": broker}
    gate = data / "open"
    with (
        worker(
            settings,
            "fairness_tools",
            concurrency=SLOTS,
            pool="threads",
            log_path=data / "w.log",
            env=env,
            queues=settings.default_queue,
        ),
        ToolClient(settings) as client,
    ):
        held = [client.submit("fair_gate", {"flag": str(gate)}) for _ in range(SLOTS)]
        end = time.monotonic() + 60
        while len(list(data.glob("open.held.*"))) < SLOTS and time.monotonic() < end:
            time.sleep(0.05)
        progress(f"{keys} keys: slots held; sending {calls} calls")
        first = time.monotonic()
        handles = [
            client.submit(
                "fair_count",
                {"key": "k", "ms": 0},
                fairness_key=f"t{i % keys}" if keys else None,
                timeout=600,
            )
            for i in range(calls)
        ]
        sent = time.monotonic() - first
        while _consumed(settings) < 1 + keys and time.monotonic() < first + 120:
            time.sleep(0.1)
        found = time.monotonic() - first
        queues = _consumed(settings)
        start = time.monotonic()
        gate.touch()
        results = [h.result() for h in handles]
        took = time.monotonic() - start
        bad = [r.status for r in results if r.status != "ok"]
        assert not bad and all(h.result().ok for h in held), bad[:3]
        names = [settings.default_queue]
        names += sorted(client.redis.smembers(Keys(settings.key_prefix).amqp_lanes(names[0])))
    with Connection(broker) as conn:
        for name in names:
            Queue(name if isinstance(name, str) else name.decode()).bind(
                conn.default_channel
            ).delete()
    return [
        str(keys),
        str(queues),
        f"{sent:.2f} s",
        f"{found:.2f} s",
        f"{calls / took:.0f}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=BROKER)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--keys", default="0,1,100,1000")
    args = parser.parse_args(argv)
    loads = [load_average()]
    rows = []
    with own_server() as server, tempfile.TemporaryDirectory() as tmp_name:
        for keys in (int(k) for k in args.keys.split(",")):
            rows.append(_row(args.broker, server.url, Path(tmp_name), args.calls, keys))
    loads.append(load_average())
    headers = [
        "fairness keys",
        "queues consumed",
        "sending",
        "all consumed after",
        "drain, calls/s",
    ]
    print(markdown_table(headers, rows))
    print()
    print(f"- load average (1 min), before/after: {loads[0]} / {loads[1]}")
    print(f"- command: `{command_line()}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
