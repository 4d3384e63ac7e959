"""What a call's fairness key and priority may be, and the header that carries them."""

from __future__ import annotations

import pytest

from toolexec.errors import UsageError
from toolexec.fairness import (
    LANE_HEADER,
    NO_LANE,
    Lane,
    amqp_lane_queue,
    amqp_priority,
    amqp_shares,
    checked_cap,
    checked_fairness_key,
    checked_priority,
    checked_weight,
    lane_headers,
    lane_in,
    lane_of,
    with_lane,
)
from toolexec.transport.lanes import PROBE_S, LaneState, use_script, wait_s
from toolexec.worker.amqp_lanes import to_consume


@pytest.mark.parametrize("key", ["tenant-a", "user:42", "a.b_c@d", "x" * 64])
def test_a_short_id_is_a_fairness_key(key: str) -> None:
    assert checked_fairness_key(key) == key


@pytest.mark.parametrize("key", ["", "x" * 65, 'a"b', "a|b", "a b", "é", 42, b"k"])
def test_anything_else_is_refused_with_the_rule(key: object) -> None:
    with pytest.raises(UsageError, match="1 to 64 characters"):
        checked_fairness_key(key)


@pytest.mark.parametrize("bad", [0, 6, -1, 2.0, True, "1"])
def test_a_priority_is_a_whole_number_from_1_to_5(bad: object) -> None:
    assert [checked_priority(p) for p in (1, 3, 5, None)] == [1, 3, 5, None]
    with pytest.raises(UsageError, match="from 1 \\(most urgent\\) to 5"):
        checked_priority(bad)


def test_weights_and_caps_are_bounded() -> None:
    assert checked_weight("2") == 2.0
    assert checked_cap(None) is None and checked_cap(3) == 3
    for bad in (0, -1, 1001, "nan", float("inf"), True):
        with pytest.raises(UsageError):
            checked_weight(bad)
    for bad in (0, 100_001, 1.5, True):
        with pytest.raises(UsageError):
            checked_cap(bad)


def test_the_default_lane_sends_no_header() -> None:
    assert lane_headers(None, None) is None
    assert lane_headers(None, 3) is None
    assert with_lane({"traceparent": "t"}, None, None) == {"traceparent": "t"}
    assert lane_headers("t1", None) == {LANE_HEADER: "3|t1"}
    assert with_lane({"traceparent": "t"}, None, 1) == {"traceparent": "t", LANE_HEADER: "1|"}


def test_a_header_reads_back_as_its_lane_and_garbage_as_the_default() -> None:
    assert lane_of({LANE_HEADER: "1|tenant-a"}) == (1, "tenant-a")
    assert lane_of({LANE_HEADER: "5|"}) == (5, "")
    for bad in ({LANE_HEADER: "9|a"}, {LANE_HEADER: '3|a"b'}, {LANE_HEADER: 3}, None, {}):
        assert lane_of(bad) == (3, "")


def test_a_sent_on_message_keeps_its_lane_only_when_valid() -> None:
    good = {"context": {"fairness_key": "t", "priority": 2}}
    assert lane_in(good) == Lane("t", 2)
    assert lane_in({"context": {"fairness_key": "a b"}}) == NO_LANE
    assert lane_in({"context": "x"}) == NO_LANE
    assert lane_in(None) == NO_LANE


def test_rabbitmq_priorities_put_urgent_highest() -> None:
    assert [amqp_priority(p) for p in (1, 2, None, 4, 5)] == [5, 4, 3, 2, 1]


def test_a_consumer_takes_through_the_script_while_lanes_hold_calls_or_a_probe_is_due() -> None:
    plain = LaneState(probed_at=100.0)
    assert not use_script(plain, 100.0 + PROBE_S / 2)
    assert use_script(plain, 100.0 + PROBE_S)
    assert use_script(LaneState(fair=True, probed_at=100.0), 100.0)
    parked = LaneState(fair=True, parked_until=100.1, probed_at=100.0)
    assert not use_script(parked, 100.05)  # nothing to take yet: wait on the queue
    assert use_script(parked, 100.1)
    assert wait_s(parked, 1.0) < 1.0
    assert wait_s(plain, 1.0) == 1.0


def test_an_mcp_call_names_its_lane_in_meta_and_a_bad_one_is_refused() -> None:
    from toolexec.mcp.mapping import FAIRNESS_KEY_META, PRIORITY_META, lane_for

    assert lane_for(None) == NO_LANE
    assert lane_for({FAIRNESS_KEY_META: "tenant-a", PRIORITY_META: 1}) == Lane("tenant-a", 1)
    refused = lane_for({PRIORITY_META: 9})
    assert isinstance(refused, str) and PRIORITY_META in refused
    assert isinstance(lane_for({FAIRNESS_KEY_META: "x" * 65}), str)


def test_a_capped_tools_calls_name_the_tool_and_its_cap() -> None:
    assert lane_headers(None, None, ("slow_api", 4)) == {LANE_HEADER: "3||slow_api#4"}
    assert lane_headers("t", 1, ("slow_api", 4)) == {LANE_HEADER: "1|t|slow_api#4"}


def test_a_tool_declares_a_priority_and_a_cap_that_are_checked() -> None:
    from toolexec.errors import ConfigurationError
    from toolexec.policies import ToolPolicy

    policy = ToolPolicy(priority=2, max_in_flight=4).to_json()
    assert (policy["priority"], policy["max_in_flight"]) == (2, 4)
    assert "priority" not in ToolPolicy().to_json()  # unchanged catalog for the rest
    for bad in ({"priority": 0}, {"priority": True}, {"max_in_flight": 0}):
        with pytest.raises(ConfigurationError):
            ToolPolicy(**bad)  # type: ignore[arg-type]


def test_a_lanes_view_sums_priorities_and_keeps_the_top_keys_only() -> None:
    import base64
    import json

    from toolexec.stores.fairness_store import KeyBacklog, submitted_at, summarise

    rows = [
        KeyBacklog(3, "a", 5, 90.0),
        KeyBacklog(3, "b", 2, 95.0),
        KeyBacklog(1, "c", 1, None),
        KeyBacklog(5, "d", 0, 10.0),  # an empty lane shows nowhere
    ]
    view = summarise(rows, now=100.0, top=2)

    assert view.priorities == {1: (1, None), 3: (7, 10.0)}
    assert [(b.key, age) for b, age in view.top] == [("a", 10.0), ("b", 5.0)]
    assert view.waiting == 8

    body = base64.b64encode(json.dumps([[], {"context": {"submitted_at": 42.5}}, {}]).encode())
    raw = json.dumps({"body": body.decode(), "properties": {"body_encoding": "base64"}})
    assert submitted_at(raw.encode()) == 42.5
    assert submitted_at(b"not json") is None and submitted_at(None) is None


def test_on_rabbitmq_a_weight_is_a_whole_number_of_queues_from_1_to_16() -> None:
    assert [amqp_shares(w) for w in (0.001, 0.6, 1, 2.4, 4, 16, 1000)] == [1, 1, 1, 2, 4, 16, 16]
    with pytest.raises(UsageError):
        amqp_shares(float("nan"))
    assert amqp_lane_queue("tools", "tenant-42", 3) == "tools.fair.tenant-42.3"


def test_a_worker_asks_for_registered_queues_it_does_not_consume_and_not_twice_at_once() -> None:
    registered = {"q.fair.a.0", "q.fair.a.1", "q.fair.b.0"}
    asked: dict[str, float] = {}
    assert to_consume(registered, {"q", "q.fair.b.0"}, asked, now=100.0) == [
        "q.fair.a.0",
        "q.fair.a.1",
    ]
    asked.update({"q.fair.a.0": 100.0, "q.fair.a.1": 100.0})
    assert to_consume(registered, {"q"}, asked, now=101.0) == ["q.fair.b.0"]
    assert to_consume(registered, {"q"}, asked, now=102.5) == [
        "q.fair.a.0",
        "q.fair.a.1",
        "q.fair.b.0",
    ]


def test_fairness_set_on_rabbitmq_says_what_it_can_do_there(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    import uuid

    from click.testing import CliRunner

    from toolexec.connection import redis_client
    from toolexec.keys import BrokerKeys
    from toolexec.ops.fairness_cli import fairness
    from toolexec.stores.fairness_store import FairnessStore

    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TOOLEXEC_BROKER_URL", "amqp://guest:guest@127.0.0.1:1//")
    monkeypatch.setenv("TOOLEXEC_REDIS_URL", redis_url)
    monkeypatch.setenv("TOOLEXEC_KEY_PREFIX", prefix)
    monkeypatch.delenv("TOOLEXEC_RABBITMQ_FAIRNESS", raising=False)
    off = CliRunner().invoke(fairness, ["set", "tenant-1", "2"])
    assert off.exit_code != 0 and "TOOLEXEC_RABBITMQ_FAIRNESS=true" in off.output
    monkeypatch.setenv("TOOLEXEC_RABBITMQ_FAIRNESS", "true")
    capped = CliRunner().invoke(fairness, ["set", "tenant-1", "--max-in-flight", "3"])
    assert capped.exit_code == 0, capped.output
    # in toolexec's Redis, where the workers read it (toolexec.worker.amqp_caps)
    client = redis_client(redis_url)
    store = FairnessStore(client, BrokerKeys(prefix))
    try:
        assert store.config() == {"tenant-1": {"max_in_flight": 3}}
    finally:
        store.clear("tenant-1")
        client.close()


def test_a_per_key_queue_names_its_key_and_others_name_none() -> None:
    from toolexec.worker.amqp_caps import lane_key

    assert lane_key("tools.fair.tenant-1.0") == "tenant-1"
    assert lane_key("tools.fair.a.b.c.12") == "a.b.c"
    assert lane_key("my.fair.q.fair.k.3") == "k"
    for other in ("tools", "tools.fair.k", "tools.fair..0", "tools.fair.k.x", None, 3):
        assert lane_key(other) is None


def test_a_places_lease_is_the_time_limit_plus_its_eta_wait() -> None:
    from datetime import UTC, datetime

    from toolexec.worker.amqp_caps import lease_s, member_of, resumable

    now = 1_000_000.0
    eta = datetime.fromtimestamp(now + 20, tz=UTC).isoformat()
    assert lease_s(90, 3600.0, None, now) == 90.0
    assert lease_s(None, 3600.0, None, now) == 3600.0
    assert lease_s(90, 3600.0, eta, now) == pytest.approx(110.0)
    assert lease_s(90, 3600.0, "not a time", now) == 90.0
    assert member_of("id-1", 0) == "id-1:0" != member_of("id-1", 1)
    assert member_of(None, 0) is None and member_of("id-1", None) == "id-1:0"
    assert resumable(1, 2) and not resumable(2, 2) and resumable(5, None)


def test_the_cap_script_admits_up_to_the_cap_counts_a_redelivery_once_and_lapses(
    redis_url: str,
) -> None:
    import uuid

    from toolexec.connection import redis_client
    from toolexec.keys import BrokerKeys, Keys
    from toolexec.worker.amqp_caps import CapTaker

    prefix = f"cap-{uuid.uuid4().hex[:8]}"
    client = redis_client(redis_url)
    taker = CapTaker(client, Keys(prefix), BrokerKeys(prefix))
    try:
        now = 1_000.0
        assert taker.take("k", "a:0", 2, now, 60.0)
        assert taker.take("k", "b:0", 2, now, 60.0)
        assert not taker.take("k", "c:0", 2, now, 60.0)  # at the cap
        assert taker.take("k", "a:0", 2, now + 1, 60.0)  # redelivered: counted once
        assert taker.running("k", now + 1) == 2
        taker.free("k", "b:0")
        assert taker.running("k", now + 1) == 1
        assert taker.take("k", "c:0", 2, now + 1, 60.0)
        assert not taker.take("k", "d:0", 2, now + 2, 60.0)
        # a dead worker's places lapse after their lease
        assert taker.take("k", "d:0", 2, now + 62, 60.0)
        assert 0 < int(client.ttl(Keys(prefix).amqp_inflight("k"))) <= 61
    finally:
        client.delete(Keys(prefix).amqp_inflight("k"))
        client.close()


def test_a_workers_liveness_names_its_tools_queues_not_its_fairness_keys_queues() -> None:
    from types import SimpleNamespace

    from toolexec.tasks.catalog_publisher import _queues_of

    queues = [SimpleNamespace(name=n) for n in ("tools", "tools.fair.t-1.0", "http")]
    consumer = SimpleNamespace(task_consumer=SimpleNamespace(queues=queues))
    assert _queues_of(consumer) == ["http", "tools"]


def test_a_call_frees_a_place_only_for_a_capped_key_where_the_caps_are_known() -> None:
    from toolexec.worker.amqp_caps import freed, noted

    noted({"k": 2}, -1)  # the lanes step of "process -1" saw k capped
    assert freed("q.fair.k.0", -1) == "k"
    assert freed("q.fair.j.0", -1) is None  # never capped there: no round trip
    assert freed("q.fair.j.0", -2) == "j"  # a prefork child does not know: frees anyway
    assert freed("q", -2) is None
