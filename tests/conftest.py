"""Fixtures: a real Redis per test session, a misbehaving HTTP service, real workers.

Redis: with ``TOOLEXEC_TEST_CLUSTER=1``, the session starts a 3-master Redis
Cluster of its own (:class:`toolexec.localcluster.LocalCluster`, skipped with the
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

from toolexec.client import ToolClient
from toolexec.embedded import ensure_embedded, stop_embedded
from toolexec.localcluster import ClusterUnavailable, LocalCluster
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
