"""Fairness keys and weights on RabbitMQ: per-key queues (``rabbitmq_fairness``).

A call with a fairness key goes to one of its key's queues, which the worker
consumes beside its own; RabbitMQ hands each freed slot to the backlogged queues
in turn, and a key's weight is its number of queues. One worker of 8 slots on the
real RabbitMQ, a queue name of its own per module run: a tenant's backlog does not
hold up another tenant's few calls, and three keys of weights 1, 2 and 4 start
calls in those proportions while all three have a backlog.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Queue
from rabbitmq_support import amqp_run, require_rabbitmq
from rigs.chaos import wait_until

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.fairness import amqp_lane_queue
from toolexec.keys import BrokerKeys, Keys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.fairness_store import AmqpLanes, FairnessStore
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

RABBITMQ_URL = require_rabbitmq()


@dataclass
class Fleet:
    client: ToolClient
    queue: str
    store: FairnessStore
    lanes: AmqpLanes
    workers: list[WorkerProcess]
    env: dict[str, str]
    log_dir: Path

    def replace_worker(self) -> None:
        """SIGKILL the worker (as an OOM killer would) and start another in its place."""
        self.workers[-1].kill()
        n = len(self.workers)
        log = self.log_dir / f"worker-{n}.log"
        worker = WorkerProcess(
            "fairness_tools", self.env, queues=self.queue, concurrency=8, log_path=log
        )
        worker.start(self.client.settings.redis_url or "", self.client.settings.key_prefix)
        self.workers.append(worker)


@pytest.fixture(scope="module")
def fleet(settings: Settings, worker_env: dict[str, str], tmp_path_factory: Any) -> Iterator[Fleet]:
    made = amqp_run(settings, worker_env, "fair", "rabbitmq_fairness")
    queue, own, env = made.queue, made.settings, made.env
    logs = tmp_path_factory.mktemp("fair-amqp")
    worker = WorkerProcess(
        "fairness_tools", env, queues=queue, concurrency=8, log_path=logs / "worker.log"
    )
    worker.start(own.redis_url or "", own.key_prefix)
    workers = [worker]
    state = redis_client(own.redis_url or "")
    lanes = AmqpLanes(state, Keys(own.key_prefix), clock=_Wall())
    store = FairnessStore(state, BrokerKeys(own.key_prefix))
    try:
        with ToolClient(own) as client:
            yield Fleet(client, queue, store, lanes, workers, env, logs)
    finally:
        for each in workers:
            each.stop()
        with Connection(RABBITMQ_URL) as conn:
            for name in [queue, *lanes.names(queue)]:
                Queue(name).bind(conn.default_channel).delete()
        state.delete(Keys(own.key_prefix).amqp_lanes(queue))
        state.close()


class _Wall:
    def now(self) -> float:
        return time.time()


def _ready(queues: list[str]) -> int:
    """Calls waiting (not delivered) in these queues; a queue not declared yet holds none."""
    total = 0
    with Connection(RABBITMQ_URL) as conn:
        for name in queues:
            try:
                with conn.channel() as channel:
                    total += int(channel.queue_declare(queue=name, passive=True)[1])
            except Exception:  # not declared yet (passive declare closes the channel)
                continue
    return total


def _send(
    client: ToolClient, calls: list[Any], into: list[ToolResult], **lane: Any
) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: into.extend(client.call_many(calls, timeout=120, **lane)), daemon=True
    )
    thread.start()
    return thread


def test_a_quiet_tenant_is_not_held_up_by_a_noisy_ones_backlog_on_rabbitmq(fleet: Fleet) -> None:
    noisy, quiet = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    bulk: list[ToolResult] = []
    calls = [("nap", {"ms": 200, "tag": f"bulk{i}"}) for i in range(600)]
    sender = _send(fleet.client, calls, bulk, fairness_key=noisy)
    noisy_queue = [amqp_lane_queue(fleet.queue, noisy, 0)]
    assert wait_until(lambda: _ready(noisy_queue) >= 300, 60), "A's backlog never queued"

    start = time.monotonic()
    few = fleet.client.call_many(
        [("nap", {"ms": 200, "tag": f"b{i}"}) for i in range(10)], fairness_key=quiet, timeout=60
    )
    took = time.monotonic() - start
    left = _ready(noisy_queue)
    print(f"\ntenant B: 10 calls in {took:.2f} s with {left} of A's calls still waiting")

    assert [r.status for r in few] == ["ok"] * 10
    # first in, first out, B's calls would wait for A's 300: 300 x 0.2 s / 8 slots = 7.5 s
    assert took < 2.5, f"tenant B's 10 calls took {took:.2f} s behind A's backlog"
    assert left > 100, "A's backlog had drained: the test proved nothing"
    sender.join(timeout=120)
    assert [r.status for r in bulk] == ["ok"] * 600


def test_weights_give_shares_on_rabbitmq(fleet: Fleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    weights = {f"w1-{run}": 1, f"w2-{run}": 2, f"w4-{run}": 4}
    for key, weight in weights.items():
        fleet.store.set(key, weight)
    # hold all 8 slots while the three backlogs queue, so all three start backlogged
    per_unit = int(os.environ.get("TOOLEXEC_TEST_FAIR_UNIT", "80"))  # calls per unit of weight
    held: list[ToolResult] = []
    gate = tmp_path / "open"
    holder = _send(fleet.client, [("gated_hold", {"flag": str(gate)})] * 8, held)
    started = lambda: len(list(tmp_path.glob("open.held.*")))  # noqa: E731
    assert wait_until(lambda: started() == 8, 30), f"{started()} of 8 slots held"
    sent_at = time.monotonic()
    results: dict[str, list[ToolResult]] = {key: [] for key in weights}
    senders = [
        _send(
            fleet.client, [("stamp", {"ms": 100})] * (per_unit * w), results[key], fairness_key=key
        )
        for key, w in weights.items()
    ]
    names = [amqp_lane_queue(fleet.queue, k, i) for k, w in weights.items() for i in range(w)]
    total = per_unit * sum(weights.values())
    queued = wait_until(lambda: _ready(names) >= total, 50)
    print(f"\n{total} calls queued in {time.monotonic() - sent_at:.2f} s")
    gate.touch()
    for thread in [holder, *senders]:
        thread.join(timeout=120)
    assert queued, "the backlogs were not all queued while the slots were held"
    assert [r.status for r in held] == ["ok"] * 8
    starts = {key: sorted(float(r.data) for r in rs) for key, rs in results.items()}
    assert all(len(s) == per_unit * weights[k] for k, s in starts.items())

    # while every key still had calls to start: until the first key started its last
    until = min(s[-1] for s in starts.values())
    counts = {key: sum(1 for t in s if t < until) for key, s in starts.items()}
    shares = {key: counts[key] / sum(counts.values()) for key in weights}
    span = until - min(s[0] for s in starts.values())
    print(f"key  weight  started  share  expected  (over {span:.1f} s)")
    for key, weight in weights.items():
        print(f"{key:10} {weight:>3} {counts[key]:>7} {shares[key]:6.3f} {weight / 7:8.3f}")
    for key, weight in weights.items():
        expected = weight / sum(weights.values())
        assert abs(shares[key] - expected) <= 0.3 * expected, (shares, counts)


def test_a_killed_workers_keyed_calls_come_back_and_a_new_worker_consumes_their_queues(
    fleet: Fleet, tmp_path: Path
) -> None:
    """8 calls of a key running when the worker is SIGKILLed, 8 more waiting in its queue:
    RabbitMQ requeues the 8 unacknowledged, and the worker started in its place finds the
    key's queue in Redis and consumes it; every call ends, none lost."""
    key = f"k-{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "open"
    results: list[ToolResult] = []
    calls = [("gated_hold", {"flag": str(gate)})] * 16
    sender = _send(fleet.client, calls, results, fairness_key=key)
    started = lambda: len(list(tmp_path.glob("open.held.*")))  # noqa: E731
    assert wait_until(lambda: started() >= 8, 30), f"{started()} of 8 slots held"
    assert wait_until(lambda: _ready([amqp_lane_queue(fleet.queue, key, 0)]) == 8, 10)

    fleet.replace_worker()
    assert wait_until(lambda: started() >= 16, 30), "the new worker did not take the key's calls"
    gate.touch()
    sender.join(timeout=90)
    assert len(results) == 16
    assert [r.status for r in results] == ["ok"] * 16, [r.error for r in results if not r.ok]
