"""What one RabbitMQ queue carries here: publish with confirms and consume, as Celery does.

A queue lives on one node and is one Erlang process, so it is the broker's unit
of throughput: docs/scaling.md sizes the number of queues at 10 000 and 100 000
calls/s from this figure. Each row runs publisher processes (persistent
messages of a task message's size on a durable queue, each publish waiting for
its confirm, as Celery's ``confirm_publish``) and consumer processes
(prefetch 64, one acknowledgement per message) on one queue of the run's own,
deleted at the end, for ``--seconds``. RabbitMQ's CPU is its Erlang VM's
(``/proc``); other sessions' traffic on the same broker counts in it too.

    .venv/bin/python bench/rabbit_queue.py [--broker amqp://guest:guest@127.0.0.1:5672//]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import time
import uuid
from collections.abc import Sequence
from multiprocessing.queues import Queue
from urllib.parse import unquote, urlsplit

import amqp
from _common import command_line, cpu_seconds, markdown_table, progress
from scaling import rabbit_pid

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
#: About a toolexec task message (headers, arguments, call context).
BODY = b"x" * 1200
PREFETCH = 64


def _connect(url: str, *, confirm: bool) -> amqp.Connection:
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    conn = amqp.Connection(
        host=f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
        userid=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        virtual_host=vhost,
        confirm_publish=confirm,
    )
    conn.connect()
    return conn


def publisher(url: str, queue: str, until: float, out: Queue[tuple[str, int]]) -> None:
    sent = 0
    with contextlib.closing(_connect(url, confirm=True)) as conn:
        channel = conn.channel()
        while time.time() < until:
            message = amqp.Message(BODY, delivery_mode=2, content_type="application/json")
            channel.basic_publish(message, exchange="", routing_key=queue)  # waits for the confirm
            sent += 1
    out.put(("sent", sent))


def consumer(url: str, queue: str, until: float, out: Queue[tuple[str, int]]) -> None:
    got = [0]
    with contextlib.closing(_connect(url, confirm=False)) as conn:
        channel = conn.channel()
        channel.basic_qos(0, PREFETCH, False)

        def on_message(message: amqp.Message) -> None:
            channel.basic_ack(message.delivery_tag)
            got[0] += 1

        channel.basic_consume(queue, callback=on_message)
        while time.time() < until:
            with contextlib.suppress(TimeoutError, OSError):
                conn.drain_events(timeout=0.2)
    out.put(("got", got[0]))


def one_row(url: str, publishers: int, consumers: int, seconds: float) -> list[str]:
    queue = f"toolexec-bench-{uuid.uuid4().hex[:10]}"
    with contextlib.closing(_connect(url, confirm=False)) as conn:
        conn.channel().queue_declare(queue, durable=True, auto_delete=False)
    rabbit = rabbit_pid()
    out: Queue[tuple[str, int]] = multiprocessing.Queue()
    start = time.time() + 1.0  # every process connected before the clock starts
    until = start + seconds
    procs = [
        multiprocessing.Process(target=publisher, args=(url, queue, until, out))
        for _ in range(publishers)
    ] + [
        multiprocessing.Process(target=consumer, args=(url, queue, until + 0.5, out))
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start - time.time()))
    cpu0 = cpu_seconds(rabbit) if rabbit else None
    load0 = _machine_busy()
    for p in procs:
        p.join(seconds + 30)
    cpu1 = cpu_seconds(rabbit) if rabbit else None
    busy = (_machine_busy() - load0) / seconds
    totals = {"sent": 0, "got": 0}
    while not out.empty():
        kind, n = out.get()
        totals[kind] += n
    with contextlib.closing(_connect(url, confirm=False)) as conn:
        conn.channel().queue_delete(queue)
    beam = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else float("nan")
    rate = totals["got"] / seconds
    row = [
        str(publishers),
        str(consumers),
        f"{totals['sent'] / seconds:.0f}",
        f"{rate:.0f}",
        f"{1000 * beam / max(1, totals['got']):.3f}",
        f"{beam / seconds:.2f}",
        f"{busy:.2f}",
    ]
    progress(f"{publishers} publisher(s), {consumers} consumer(s): {row}")
    return row


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine so far (``/proc/stat``): is it saturated?"""
    with open("/proc/stat") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--broker", default=BROKER)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--shapes", default="1x1,2x1,2x2,4x2", help="publishers x consumers")
    args = parser.parse_args(argv)
    rows = []
    for shape in args.shapes.split(","):
        publishers, consumers = (int(x) for x in shape.split("x"))
        rows.append(one_row(args.broker, publishers, consumers, args.seconds))
    print("\n## One queue: publish with confirms + consume with acks (persistent, 1.2 kB)\n")
    print(
        markdown_table(
            [
                "publishers",
                "consumers",
                "published/s",
                "consumed/s",
                "RabbitMQ CPU ms/msg",
                "RabbitMQ cores",
                "machine cores busy (of 2)",
            ],
            rows,
        )
    )
    print(f"\ncommand: `{command_line()}`")


if __name__ == "__main__":
    main()
