"""Fixtures: a real Redis per test session, a misbehaving HTTP service, real workers.

Redis: with ``TOOLEXEC_TEST_CLUSTER=1``, the session starts a 3-master Redis
Cluster of its own (:class:`rigs.localcluster.LocalCluster`, skipped with the
reason where redis-server is missing) and the broker must be apart from it
(``TOOLEXEC_TEST_BROKER_URL``, RabbitMQ on loopback by default). With
``TOOLEXEC_TEST_REDIS_URL`` set, the suite claims a database on
that server that is empty and that no other run holds, and leaves it empty
again; a database with anyone's data in it is skipped, never touched, never
flushed. Otherwise it starts its own embedded Valkey in a temporary
directory. Either way no two runs share state, every toolexec key a run writes
carries its own prefix, and no test uses a mock Redis.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_support import broker_url, cluster_run
from database_support import claim_database, release_database
from rigs.localcluster import ClusterUnavailable, LocalCluster

from toolexec.client import ToolClient
from toolexec.embedded import ensure_embedded, stop_embedded
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, WorkerProcess

TESTS = Path(__file__).parent


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if cluster_run():
        yield from _cluster_url(tmp_path_factory)
        return
    shared = os.environ.get("TOOLEXEC_TEST_REDIS_URL")
    if shared:
        run = uuid.uuid4().hex
        url = claim_database(shared, run)
        yield url
        release_database(url, run)
        return
    data_dir = tmp_path_factory.mktemp("embedded")
    server = ensure_embedded(data_dir, notify=None)
    yield server.url
    stop_embedded(data_dir)


def _cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    except ClusterUnavailable as exc:
        pytest.skip(f"TOOLEXEC_TEST_CLUSTER=1 but {exc}")
    yield cluster.url
    cluster.stop()


@pytest.fixture(scope="session")
def settings(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        redis_url=redis_url,
        broker_url=broker_url(),
        data_dir=tmp_path_factory.mktemp("data"),
        key_prefix=f"t-{uuid.uuid4().hex[:8]}",
        default_timeout=30.0,
        reply_grace=1.0,
    )


@pytest.fixture(scope="session")
def worker_env(settings: Settings) -> dict[str, str]:
    env = {
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
        # FlakyServer listens on loopback, which http_request refuses unless allowed.
        "TOOLEXEC_HTTP_ALLOW": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    if settings.broker_url:
        env["TOOLEXEC_BROKER_URL"] = settings.broker_url
    return env


@pytest.fixture(scope="session")
def flaky() -> Iterator[FlakyServer]:
    with FlakyServer() as server:
        yield server


@pytest.fixture(scope="session")
def worker(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One worker process with the test tools, shared by the integration tests."""
    log = tmp_path_factory.mktemp("logs") / "worker.log"
    proc = WorkerProcess("tooldefs", worker_env, concurrency=32, log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def client(settings: Settings, worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


#: Modules that took longest in a timed run (``--durations`` and ``--junitxml``, tests/README.md,
#: "Where the time goes"), longest first, of the runs pytest-xdist spreads (the first step
#: of ``make test``, and ``make test-bench``). They are handed out first, so that none of
#: them starts last and leaves one process running alone at the end.
SLOW_FIRST = (
    "test_mcp_conformance.py",
    "test_storm_bench_smoke.py",
    "test_fairness_integrations.py",
    "test_bench_overhead_smoke.py",
    "test_bench_observability_smoke.py",
    "test_flower_auth.py",
    "test_unknown_tasks.py",
    "test_mcp_server.py",
    "test_model_input.py",
    "test_mcp_approval.py",
    "test_agent_frameworks.py",
    "test_cli.py",
    "test_celery_native.py",
    "test_unbounded_sizes.py",
    "test_idempotency_bench.py",
    "test_security.py",
    "test_infrastructure.py",
    "test_secret_canary.py",
    "test_idempotency.py",
    "test_breaker_abuse.py",
    "test_bench_breaker_smoke.py",
    "test_procfile.py",
    "test_packaging.py",
    "test_poison_messages.py",
)
#: After those: the rest by tier, the waiting ones before the computing ones.
TIER_ORDER = ("integration", "e2e", "security", "unit", "chaos")


def _start_order(item: pytest.Item) -> tuple[int, int]:
    path = item.path
    if path.name in SLOW_FIRST:
        return (0, SLOW_FIRST.index(path.name))
    tier = path.parent.name
    return (1, TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (make test), the slowest modules are handed out first.

    ``--dist loadfile`` keeps a module's tests in one process, so its module-scoped
    workers and servers start once, as in a plain run, and ``--no-loadscope-reorder``
    hands modules out in this order. A plain run is left in its own order.
    (``--dist loadgroup`` would be finer, but pytest-xdist 3.8 marks a group by
    rewriting ``Item._nodeid``, which pytest 9 no longer reads: every test would be
    spread alone and each module's workers started in every process.)
    """
    if hasattr(config, "workerinput"):
        items.sort(key=_start_order)  # stable: a module's tests stay together and in order
