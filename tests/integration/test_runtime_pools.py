"""A worker process holds one Redis pool for toolexec state, the payload store's included.

Each store used to open its own client, so a worker had about six pools and
as many idle connections per process. The runtime (``toolexec.tasks.runtime``)
now builds every store on its one client; this test asks a real worker which
pools its runtime reaches after a result went through the payload store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_tools import QUEUE

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

LINES = 20_000  # 1 MB of text: above the default payload threshold, so it is offloaded


@pytest.fixture(scope="module")
def pools_worker(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    log: Path = tmp_path_factory.mktemp("pools-logs") / "worker.log"
    proc = WorkerProcess("runtime_tools", worker_env, queues=QUEUE, log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(settings: Settings, pools_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


def test_a_worker_process_has_one_redis_pool_for_every_store(client: ToolClient) -> None:
    big = client.call("pool_text", {"lines": LINES}, timeout=60)
    assert big.ok, big.error
    assert big.payload is not None and big.payload.store == "redis"
    assert len(client.fetch_payload(big.payload)) > 1_000_000  # the worker's store wrote it

    report = client.call("redis_pools", {}, timeout=30)

    assert report.ok, report.error
    assert isinstance(report.data, dict)
    assert "PayloadLayer" in report.data["layers"]
    assert report.data["runtime_pool"] is True
    assert report.data["pools"] == 1
