"""A fairness key's ``max_in_flight`` on RabbitMQ, fleet-wide (``toolexec.worker.amqp_caps``).

Two workers of 4 slots on the real RabbitMQ, a queue name of their own: a key capped
at 2 never has more than 2 calls running across both, while another key's calls
use the other slots; the excess of the capped key waits in its queue and every call
finishes ok (those delivered at the cap go back to the queue, none lost).
"""

from __future__ import annotations

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
    store: FairnessStore
    keys: Keys
    workers: list[WorkerProcess]
    env: dict[str, str]
    log_dir: Path
    queue: str

    def replace_workers(self) -> None:
        """SIGKILL every worker (as an OOM killer would) and start as many in their place."""
        alive, self.workers[:] = list(self.workers), []
        for worker in alive:
            worker.kill()
        for n in range(len(alive)):
            log = self.log_dir / f"worker-r{n}-{uuid.uuid4().hex[:4]}.log"
            worker = WorkerProcess(
                "fairness_tools", self.env, queues=self.queue, concurrency=4, log_path=log
            )
            worker.start(self.client.settings.redis_url or "", self.client.settings.key_prefix)
            self.workers.append(worker)


class _Wall:
    def now(self) -> float:
        return time.time()


@pytest.fixture(scope="module")
def fleet(settings: Settings, worker_env: dict[str, str], tmp_path_factory: Any) -> Iterator[Fleet]:
    made = amqp_run(settings, worker_env, "cap", "rabbitmq_fairness")
    queue, own, env = made.queue, made.settings, made.env
    logs = tmp_path_factory.mktemp("cap-amqp")
    workers = [
        WorkerProcess(
            "fairness_tools", env, queues=queue, concurrency=4, log_path=logs / f"worker-{n}.log"
        )
        for n in range(2)
    ]
    for worker in workers:
        worker.start(own.redis_url or "", own.key_prefix)
    state = redis_client(own.redis_url or "")
    lanes = AmqpLanes(state, Keys(own.key_prefix), clock=_Wall())
    store = FairnessStore(state, BrokerKeys(own.key_prefix))
    try:
        with ToolClient(own) as client:
            yield Fleet(client, store, Keys(own.key_prefix), workers, env, logs, queue)
    finally:
        for each in workers:
            each.stop()
        with Connection(RABBITMQ_URL) as conn:
            for name in [queue, *lanes.names(queue)]:
                Queue(name).bind(conn.default_channel).delete()
        names = [Keys(own.key_prefix).amqp_lanes(queue), BrokerKeys(own.key_prefix).fair_caps()]
        state.delete(*names, *state.keys(f"{own.key_prefix}:fair:amqp-inflight:*"))
        state.close()


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def _send(client: ToolClient, n: int, key: str, into: list[ToolResult]) -> threading.Thread:
    calls = [("span", {"ms": 500})] * n
    thread = threading.Thread(
        target=lambda: into.extend(client.call_many(calls, fairness_key=key, timeout=120)),
        daemon=True,
    )
    thread.start()
    return thread


def test_a_capped_key_never_runs_more_than_its_cap_across_the_fleet_and_others_run_beside(
    fleet: Fleet,
) -> None:
    capped, other = f"cap-{uuid.uuid4().hex[:6]}", f"free-{uuid.uuid4().hex[:6]}"
    fleet.store.set(capped, max_in_flight=2)
    mine: list[ToolResult] = []
    theirs: list[ToolResult] = []
    start = time.monotonic()
    senders = [_send(fleet.client, 10, capped, mine), _send(fleet.client, 24, other, theirs)]
    for thread in senders:
        thread.join(timeout=120)
    took = time.monotonic() - start

    assert [r.status for r in mine] == ["ok"] * 10, [r.error for r in mine if not r.ok]
    assert [r.status for r in theirs] == ["ok"] * 24, [r.error for r in theirs if not r.ok]
    spans = [(float(r.data[0]), float(r.data[1])) for r in mine]
    free = [(float(r.data[0]), float(r.data[1])) for r in theirs]
    most, most_free = _most_at_once(spans), _most_at_once(free)
    window = (min(s for s, _ in spans), max(e for _, e in spans))
    beside = sum(1 for s, e in free if s < window[1] and e > window[0])
    print(
        f"\ncapped key: at most {most} of 10 at once over {window[1] - window[0]:.2f} s; "
        f"the other key: at most {most_free} at once, {beside} of 24 beside it; {took:.2f} s"
    )
    assert most <= 2, f"{most} calls of a key capped at 2 ran at once"
    assert most == 2, "the cap was never used: the test proved nothing"
    # the other key is not held behind the capped one: it takes the other slots meanwhile
    assert most_free >= 3 and beside >= 6, (most_free, beside)
    # each call freed its place when it ended (none left to lapse)
    places = fleet.keys.amqp_inflight(capped)
    assert wait_until(lambda: fleet.store.client.zcard(places) == 0, 10)


def test_the_cap_lifts_when_cleared(fleet: Fleet) -> None:
    key = f"lift-{uuid.uuid4().hex[:6]}"
    fleet.store.set(key, max_in_flight=1)
    first: list[ToolResult] = []
    _send(fleet.client, 4, key, first).join(timeout=60)
    assert [r.status for r in first] == ["ok"] * 4
    assert _most_at_once([(float(r.data[0]), float(r.data[1])) for r in first]) == 1
    fleet.store.clear(key)
    deadline = time.monotonic() + 30
    while True:  # the workers read the caps every poll: wait for them, not a fixed time
        after: list[ToolResult] = []
        _send(fleet.client, 8, key, after).join(timeout=60)
        assert [r.status for r in after] == ["ok"] * 8
        most = _most_at_once([(float(r.data[0]), float(r.data[1])) for r in after])
        if most > 1 or time.monotonic() > deadline:
            break
    assert most >= 3, f"with its cap cleared the key still ran {most} at once"


def test_a_killed_workers_places_are_taken_again_by_their_redelivered_calls(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Two calls of a key capped at 2 hold their slots and four wait; every worker is
    SIGKILLed. RabbitMQ redelivers the two to the new workers, which take the same two
    places again (same task id and attempt): the two run again at once, not held back
    by their dead copies' places, and no third starts while they hold; then all six end."""
    key = f"kill-{uuid.uuid4().hex[:6]}"
    fleet.store.set(key, max_in_flight=2)
    gate = tmp_path / "open"
    results: list[ToolResult] = []
    calls = [("gated_hold", {"flag": str(gate)})] * 6
    sender = threading.Thread(
        target=lambda: results.extend(fleet.client.call_many(calls, fairness_key=key, timeout=150)),
        daemon=True,
    )
    sender.start()
    started = lambda: len(list(tmp_path.glob("open.held.*")))  # noqa: E731
    assert wait_until(lambda: started() == 2, 30), f"{started()} of 2 started"
    places = fleet.keys.amqp_inflight(key)
    assert fleet.store.client.zcard(places) == 2

    fleet.replace_workers()
    assert wait_until(lambda: started() >= 4, 60), "the redelivered calls did not start again"
    assert fleet.store.client.zcard(places) == 2, "a redelivered call took a second place"
    assert not wait_until(lambda: started() > 4, 2), "a third call ran beside the cap's two"
    gate.touch()
    sender.join(timeout=150)
    assert [r.status for r in results] == ["ok"] * 6, [r.error for r in results if not r.ok]
