"""toolexec's state on a real Redis Cluster: cross-slot refusal and a master's failover.

Run by ``make test-cluster`` (``TOOLEXEC_TEST_CLUSTER=1``), which also runs the core,
breaker, idempotency, payload and guard modules against a cluster: a script of
theirs whose keys spanned slots would be refused there. The failover test starts
a cluster of its own with a replica per master, because it kills one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from cluster_support import broker_url, cluster_run
from rigs.localcluster import ClusterUnavailable, LocalCluster

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.skipif(
    not cluster_run(),
    reason="a Redis Cluster run only: make test-cluster (TOOLEXEC_TEST_CLUSTER=1)",
)

TIMEOUT_S = 4.0
#: How long past its deadline a call may take to come back: the client's reply
#: grace plus scheduling slack on a loaded 2-core machine.
LATE_S = 1.0 + 1.5
#: By then every client must see the new master: the election (about twice the
#: node timeout, 2.1-2.7 s measured) and redis-py's refresh of its slot table, with
#: margin for a loaded machine (docs/scaling.md, failover).
RECOVERY_S = 10.0
#: What a call may end with while the election runs: refused before it was
#: published (the client's own command met the dead master), or no answer by its
#: deadline (the worker's reply write met it). Anything else is not a typed
#: outcome of the failover.
ELECTION_ERRORS = {"RedisUnavailableError", "deadline_exceeded"}
#: docs/scaling.md, section 5: 8-16 failed in five runs before the writes rode
#: through blips, 0 in the five since; 20 holds the worse figure with margin.
ELECTION_FAILURES = 20


def test_the_cluster_refuses_a_script_whose_keys_span_slots(redis_url: str) -> None:
    """What makes the suite's run on a cluster a check of every script's keys."""
    cluster = redis_client(redis_url)
    try:
        first = "{a}x"
        other = next(f"{{b{i}}}y" for i in range(1000) if _same_node(cluster, first, f"{{b{i}}}y"))
        node = cluster.get_node_from_key(first)  # type: ignore[attr-defined]
        direct = redis.Redis(host=node.host, port=node.port)
        with pytest.raises(redis.ResponseError, match="same slot"):
            direct.eval("return redis.call('MGET', KEYS[1], KEYS[2])", 2, first, other)
        direct.close()
    finally:
        cluster.close()


def test_scripts_in_a_cluster_pipeline_cost_no_command_getkeys(redis_url: str) -> None:
    """A pipeline's EVALSHA goes to its slot's node without asking a node for its keys first.

    redis-py's cluster pipeline sends ``COMMAND GETKEYS`` per script unless the
    client gives it a policy for ``EVALSHA`` (toolexec.connection.ScriptPolicies).
    """
    cluster = redis_client(redis_url)
    script = cluster.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    keys = [f"getkeys-{uuid.uuid4().hex}-{i}" for i in range(12)]
    nodes = {cluster.get_node_from_key(k).name for k in keys}  # type: ignore[attr-defined]
    try:
        for key in keys:
            script(keys=[key], args=[0])  # loads it on every node the keys live on
        masters = [redis.Redis(host=n.host, port=n.port) for n in _masters(cluster)]
        before = sum(_getkeys(m) for m in masters)
        pipe = cluster.pipeline(transaction=False)
        for i, key in enumerate(keys):
            pipe.execute_command("EVALSHA", script.sha, 1, key, i + 1)
        assert pipe.execute() == [i + 1 for i in range(len(keys))]
        assert sum(_getkeys(m) for m in masters) == before
        assert len(nodes) > 1  # the pipeline did route by slot
    finally:
        for key in keys:
            cluster.delete(key)
        cluster.close()


def _masters(cluster: redis.Redis) -> list[object]:
    return list(cluster.get_primaries())  # type: ignore[attr-defined]


def _getkeys(node: redis.Redis) -> int:
    stats = node.info("commandstats")
    return int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))


def _same_node(cluster: redis.Redis, a: str, b: str) -> bool:
    node_of = cluster.get_node_from_key  # type: ignore[attr-defined]
    return bool(
        cluster.keyslot(a) != cluster.keyslot(b)  # type: ignore[attr-defined]
        and node_of(a).name == node_of(b).name
    )


@dataclass(frozen=True)
class Outcome:
    started: float
    took: float
    error: str | None


@pytest.fixture(scope="module")
def ha_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    try:
        cluster = LocalCluster(tmp_path_factory.mktemp("ha-cluster"), replicas=1).start()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    yield cluster
    cluster.stop()


def test_calls_go_on_when_a_master_dies_and_none_outlives_its_deadline(
    ha_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Kill one master under steady load: its replica is elected and calls carry on.

    Calls whose keys sat on the dead master may fail while the election runs
    (about the cluster's node timeout), and only with a typed outcome: refused
    before publishing (``RedisUnavailableError``) or ``deadline_exceeded`` when the
    worker could not write the reply on the dead master. So every failure is of
    those two kinds, started within the election window (the kill to
    ``RECOVERY_S`` after it), and they are at most ``ELECTION_FAILURES``. None
    may hang, and every call started after the window succeeds.
    """
    settings = Settings(
        redis_url=ha_cluster.url,
        broker_url=broker_url(),
        data_dir=tmp_path / "data",
        key_prefix=f"t-{uuid.uuid4().hex[:8]}",
        reply_grace=1.0,
    )
    env = {
        "TOOLEXEC_REDIS_URL": ha_cluster.url,
        "TOOLEXEC_BROKER_URL": settings.broker_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    worker = WorkerProcess("tooldefs", env, concurrency=8, log_path=tmp_path / "worker.log")
    worker.start(ha_cluster.url, settings.key_prefix)
    outcomes: list[Outcome] = []
    stop = threading.Event()
    try:
        with ToolClient(settings) as client:
            threads = [
                threading.Thread(target=_load, args=(client, outcomes, stop)) for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            _wait_for(lambda: len(outcomes) >= 20, 30, "20 calls before the kill")
            victim = ha_cluster.master_ports()[0]
            (heir,) = ha_cluster.replica_of(victim)
            killed_at = time.time()
            ha_cluster.kill(victim)
            _wait_for(lambda: ha_cluster.role(heir) == "master", 30, "the replica's election")
            elected_at = time.time()
            ha_cluster.wait_ok(30)
            settled = killed_at + RECOVERY_S
            _wait_for(
                lambda: sum(o.started > settled for o in outcomes) >= 40,
                60,
                f"40 calls {RECOVERY_S:g} s after the kill",
            )
            stop.set()
            for thread in threads:
                thread.join(TIMEOUT_S + LATE_S + 5)
    finally:
        stop.set()
        worker.stop()
    _report(outcomes, killed_at, elected_at)
    assert max(o.took for o in outcomes) <= TIMEOUT_S + LATE_S
    failed = [o for o in outcomes if o.error is not None]
    assert {o.error for o in failed} <= ELECTION_ERRORS, failed
    # a call started up to a deadline before the kill may still be waiting on the dead master
    assert all(killed_at - TIMEOUT_S <= o.started <= settled for o in failed), failed
    assert len(failed) <= ELECTION_FAILURES, failed
    after = [o for o in outcomes if o.started > settled]
    assert [o.error for o in after if o.error is not None] == []


def _load(client: ToolClient, outcomes: list[Outcome], stop: threading.Event) -> None:
    while not stop.is_set():
        started = time.time()
        error: str | None
        try:
            result = client.call("pause", {"seconds": 0.01}, timeout=TIMEOUT_S)
            error = None if result.ok else (result.error.type if result.error else "failed")
        except Exception as exc:
            error = type(exc).__name__
        outcomes.append(Outcome(started, time.time() - started, error))
        if error is not None:
            time.sleep(0.05)


def _wait_for(condition: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(redis.RedisError):
            if callable(condition) and condition():
                return
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")


def _report(outcomes: list[Outcome], killed_at: float, elected_at: float) -> None:
    during = [o for o in outcomes if killed_at - TIMEOUT_S <= o.started <= killed_at + RECOVERY_S]
    failed = [o for o in during if o.error is not None]
    last = max((o.started - killed_at for o in failed), default=0.0)
    kinds = sorted({o.error or "" for o in failed})
    print(
        f"\nfailover: {len(outcomes)} calls, election took {elected_at - killed_at:.1f} s; "
        f"{len(failed)} of {len(during)} calls around it failed ({', '.join(kinds) or 'none'}), "
        f"the last one started {last:.1f} s after the kill; "
        f"slowest call {max(o.took for o in outcomes):.2f} s"
    )
