"""Priorities on RabbitMQ: queues declared with x-max-priority (``rabbitmq_priorities``).

RabbitMQ has no lanes: it orders a priority queue by message priority, which the
client always sets there. One worker of 8 slots; a priority-1 call sent behind
a backlog of priority-5 calls (800 sent, at least 400 waiting) must finish within
1 s, as on Redis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Queue
from rabbitmq_support import amqp_run, require_rabbitmq

from toolexec.client import ToolClient
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

RABBITMQ_URL = require_rabbitmq()


@pytest.fixture(scope="module")
def prio_client(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: Any
) -> Iterator[ToolClient]:
    made = amqp_run(settings, worker_env, "prio", "rabbitmq_priorities")
    queue, own, env = made.queue, made.settings, made.env
    log = tmp_path_factory.mktemp("prio") / "worker.log"
    worker = WorkerProcess("fairness_tools", env, queues=queue, concurrency=8, log_path=log)
    worker.start(own.redis_url or "", own.key_prefix)
    try:
        with ToolClient(own) as client:
            yield client
    finally:
        worker.stop()
        with Connection(RABBITMQ_URL) as conn:
            Queue(queue).bind(conn.default_channel).delete()


def test_an_urgent_call_jumps_a_batch_backlog_on_rabbitmq(prio_client: ToolClient) -> None:
    bulk: list[ToolResult] = []
    # 200 ms each: publishing with confirms is slower than 8 slots take 50 ms calls here
    calls = [("nap", {"ms": 200, "tag": f"bulk{i}"}) for i in range(800)]
    sender = threading.Thread(
        target=lambda: bulk.extend(prio_client.call_many(calls, priority=5, timeout=120))
    )
    sender.start()
    time.sleep(0.1)  # let the batch start going out
    while len(bulk) == 0 and sender.is_alive():  # until most of the batch is queued
        if _ready(prio_client) >= 400:
            break
        time.sleep(0.05)

    start = time.monotonic()
    urgent = prio_client.call("nap", {"ms": 50, "tag": "urgent"}, priority=1, timeout=30)
    took = time.monotonic() - start

    assert urgent.status == "ok"
    assert took < 1.0, f"the priority-1 call took {took:.2f} s behind the backlog"
    assert _ready(prio_client) > 100, "the backlog had drained: the test proved nothing"
    sender.join(timeout=120)
    assert [r.status for r in bulk] == ["ok"] * 800


def _ready(client: ToolClient) -> int:
    queue = client.catalog()["nap"]["policy"]["queue"]
    with Connection(RABBITMQ_URL) as conn, conn.channel() as channel:
        _, count, _ = channel.queue_declare(queue=queue, passive=True)
    return int(count)
