"""The lane script orders what a worker's consumer takes: priority first, then fairness keys.

kombu against the suite's real Redis as a broker, consuming through toolexec's
worker transport (no worker process): messages are published with the lane
header a client would add, and the order in which one consumer takes them is
the order the worker would start them. ``test_fairness.py`` runs the same with
a real worker and real calls.
"""

from __future__ import annotations

import queue as queue_module
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_support import cluster_run
from kombu import Connection

from toolexec.errors import UsageError
from toolexec.fairness import LANE_HEADER
from toolexec.keys import BrokerKeys
from toolexec.stores.fairness_store import FairnessStore
from toolexec.transport import orphans

WORKER_TRANSPORT = "toolexec.transport:Transport"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(cluster_run(), reason="a Redis Cluster cannot be a kombu broker"),
]


@pytest.fixture
def broker(redis_url: str) -> Iterator[Connection]:
    # one list per queue, as a worker has it (toolexec.worker.app): the inbox and lanes need it
    conn = Connection(
        redis_url, transport=WORKER_TRANSPORT, transport_options={"priority_steps": [0]}
    )
    yield conn
    orphans.deactivate()
    conn.release()


@pytest.fixture
def keys(broker: Connection) -> Iterator[BrokerKeys]:
    """Keys of this test's own: the suite's workers use the default ones."""
    made = BrokerKeys(prefix=f"t-lanes-{uuid.uuid4().hex[:8]}")
    orphans.activate(made)
    yield made
    client = broker.default_channel.client
    leftovers = list(client.scan_iter(f"{made.prefix}:*"))
    if leftovers:
        client.delete(*leftovers)


@pytest.fixture
def queue(broker: Connection) -> Iterator[str]:
    name = f"t-lanes-{uuid.uuid4().hex[:8]}"
    yield name
    broker.default_channel.client.delete(name)


def _put(broker: Connection, queue: str, label: str, lane: str | None = None) -> None:
    headers = {} if lane is None else {LANE_HEADER: lane}
    broker.SimpleQueue(queue).put({"label": label}, headers=headers)


def _taken(broker: Connection, queue: str, n: int) -> list[Any]:
    """``n`` messages as one consumer takes them, left unacknowledged (as while they run)."""
    simple = broker.SimpleQueue(queue, no_ack=False)
    return [simple.get(timeout=5) for _ in range(n)]


def _scripts_run(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def _labels(messages: list[Any]) -> list[str]:
    return [m.payload["label"] for m in messages]


def test_higher_priority_is_taken_first_and_plain_calls_are_priority_3(
    broker: Connection, keys: BrokerKeys, queue: str
) -> None:
    for label in ("batch1", "batch2", "batch3"):
        _put(broker, queue, label, "5|")
    _put(broker, queue, "plain")
    _put(broker, queue, "urgent", "1|")

    got = _taken(broker, queue, 5)

    assert _labels(got) == ["urgent", "plain", "batch1", "batch2", "batch3"]
    client = broker.default_channel.client
    assert client.llen(queue) == 0
    assert not any(client.exists(keys.ready(queue, p)) for p in range(1, 6))


def test_keys_take_turns_whatever_came_first(
    broker: Connection, keys: BrokerKeys, queue: str
) -> None:
    for i in range(6):
        _put(broker, queue, f"a{i}", "3|tenant-a")
    for i in range(2):
        _put(broker, queue, f"b{i}", "3|tenant-b")

    got = _labels(_taken(broker, queue, 8))

    assert got == ["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5"]


def test_weights_set_the_shares(broker: Connection, keys: BrokerKeys, queue: str) -> None:
    broker.default_channel.client.hset(keys.fair_weights(), "heavy", 3)
    for i in range(12):
        _put(broker, queue, f"h{i}", "3|heavy")
        _put(broker, queue, f"l{i}", "3|light")

    got = _labels(_taken(broker, queue, 12))

    assert sum(label.startswith("h") for label in got) == 9  # 3:1 of the first twelve


def test_a_key_at_its_cap_waits_in_its_own_lane(
    broker: Connection, keys: BrokerKeys, queue: str
) -> None:
    client = broker.default_channel.client
    client.hset(keys.fair_caps(), "capped", 1)
    for i in range(3):
        _put(broker, queue, f"c{i}", "3|capped")
    for i in range(3):
        _put(broker, queue, f"o{i}", "3|other")

    first = _taken(broker, queue, 4)
    assert _labels(first) == ["c0", "o0", "o1", "o2"]  # c1 waits: c0 is still in flight
    assert client.zcard(keys.fair_inflight_prefix() + "capped") == 1

    # only parked calls wait: the consumer waits on its queue, it does not spin on the script
    before = _scripts_run(client)
    with pytest.raises(queue_module.Empty):
        broker.SimpleQueue(queue, no_ack=False).get(timeout=0.5)
    assert _scripts_run(client) - before <= 20

    first[0].ack()  # c0 ends: its key has a slot again
    assert client.zcard(keys.fair_inflight_prefix() + "capped") == 0
    assert _labels(_taken(broker, queue, 1)) == ["c1"]


def test_a_message_is_never_outside_queue_lanes_inbox_and_unacked_record(
    broker: Connection, keys: BrokerKeys, queue: str
) -> None:
    for i in range(40):
        _put(broker, queue, f"m{i}", f"{1 + i % 5}|k{i % 7}")
    client = broker.default_channel.client

    got = _taken(broker, queue, 10)

    channel = broker.default_channel
    lanes = [k for k in client.scan_iter(f"{keys.lane_prefix(queue)}*")]
    waiting = client.llen(queue) + sum(client.llen(k) for k in lanes)
    inboxes = [k for k in client.scan_iter(f"{keys.prefix}:consumer:*:inbox:{queue}")]
    assert sum(client.llen(k) for k in inboxes) == 0
    assert client.hlen(channel.unacked_key) >= len(got)
    assert waiting == 40 - len(got)


def test_the_lanes_view_counts_by_priority_and_ranks_keys(
    broker: Connection, keys: BrokerKeys, queue: str
) -> None:
    for i in range(6):
        _put(broker, queue, f"a{i}", "3|tenant-a")
    for i in range(2):
        _put(broker, queue, f"u{i}", "1|tenant-b")
    _put(broker, queue, "plain")
    _taken(broker, queue, 1)  # the first take sorts the queue into lanes

    client = broker.default_channel.client
    view = FairnessStore(client, keys).lanes(queue, now=time.time(), top=2)

    assert view.in_lanes == 8  # 9 sent, 1 taken (u0), none left unsorted in the queue
    assert {p: n for p, (n, _) in view.priorities.items()} == {1: 1, 3: 7}
    assert [(b.key, b.waiting) for b, _ in view.top] == [("tenant-a", 6), ("tenant-b", 1)]
    assert view.to_json()["priorities"]["3"]["waiting"] == 7


def test_weights_and_caps_are_set_checked_and_cleared(broker: Connection, keys: BrokerKeys) -> None:
    store = FairnessStore(broker.default_channel.client, keys)
    store.set("tenant-a", weight=2, max_in_flight=4)
    store.set("tenant-b", weight=0.5)

    assert store.config() == {
        "tenant-a": {"weight": 2.0, "max_in_flight": 4},
        "tenant-b": {"weight": 0.5},
    }
    with pytest.raises(UsageError):
        store.set("tenant a", weight=1)
    with pytest.raises(UsageError):
        store.set("tenant-a", weight=0)
    store.clear("tenant-a")
    assert list(store.config()) == ["tenant-b"]


def test_a_tool_at_its_cap_waits_in_its_own_lane_while_other_calls_go_by(
    broker: Connection, keys: BrokerKeys, queue: str
) -> None:
    """``@tool(max_in_flight=1)``: the client names the tool and its cap in the header."""
    client = broker.default_channel.client
    for i in range(3):
        _put(broker, queue, f"t{i}", "3||slow_api#1")
    for i in range(2):
        _put(broker, queue, f"p{i}")

    first = _taken(broker, queue, 3)
    assert sorted(_labels(first)) == ["p0", "p1", "t0"]  # t1 waits for t0; the plain go by
    assert client.zcard(keys.fair_inflight_prefix() + "tool:slow_api") == 1

    next(m for m in first if m.payload["label"] == "t0").ack()
    assert client.zcard(keys.fair_inflight_prefix() + "tool:slow_api") == 0
    assert _labels(_taken(broker, queue, 1)) == ["t1"]
