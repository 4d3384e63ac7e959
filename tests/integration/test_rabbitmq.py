"""RabbitMQ as the broker: the core cases on a real RabbitMQ, with toolexec's state in Redis.

``make test-rabbitmq`` runs the whole core integration suite with
``TOOLEXEC_TEST_BROKER_URL=amqp://...``; this module runs a cross-section of
it in every run where a RabbitMQ answers (``TOOLEXEC_TEST_RABBITMQ_URL``,
default guest on 127.0.0.1:5672), and is skipped with the reason elsewhere.
Its calls go to a queue of their own, so concurrent runs on one vhost never
take each other's messages.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_support import gaps
from kombu import Connection, Queue
from rabbitmq_support import require_rabbitmq

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

RABBITMQ_URL = require_rabbitmq()


@pytest.fixture(scope="module")
def amqp_settings(settings: Settings) -> Settings:
    run = uuid.uuid4().hex[:8]
    return settings.model_copy(
        update={
            "broker_url": RABBITMQ_URL,
            "key_prefix": f"{settings.key_prefix}-amqp",
            "default_queue": f"toolexec-test-{run}",
        }
    )


@pytest.fixture(scope="module")
def amqp_client(
    amqp_settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolClient]:
    env = {
        **worker_env,
        "TOOLEXEC_BROKER_URL": RABBITMQ_URL,
        "TOOLEXEC_KEY_PREFIX": amqp_settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": amqp_settings.default_queue,
    }
    log: Path = tmp_path_factory.mktemp("amqp") / "worker.log"
    worker = WorkerProcess("tooldefs", env, queues=amqp_settings.default_queue, log_path=log)
    worker.start(amqp_settings.redis_url or "", amqp_settings.key_prefix)
    try:
        with ToolClient(amqp_settings) as client:
            yield client
    finally:
        worker.stop()
        with Connection(RABBITMQ_URL) as conn:
            Queue(amqp_settings.default_queue).bind(conn.default_channel).delete()


def test_calls_really_travel_through_rabbitmq(amqp_client: ToolClient) -> None:
    with amqp_client.app.connection_for_write() as conn:
        assert conn.transport.driver_type == "amqp"


def test_503_twice_then_200_ends_ok_after_three_attempts(
    amqp_client: ToolClient, flaky: FlakyServer
) -> None:
    path = flaky.unique_path("amqp-flaky")
    url = flaky.script(path, Reply(503), Reply(503), Reply(200, {"temp": 21}))
    result = amqp_client.call("fetch", {"url": url}, timeout=20)
    assert (result.status, result.data, result.attempts) == ("ok", {"temp": 21}, 3), result
    assert len(flaky.hits(path)) == 3


def test_retry_after_countdowns_are_honoured(amqp_client: ToolClient, flaky: FlakyServer) -> None:
    """A countdown on RabbitMQ is held by the worker, unacknowledged, until it is due."""
    path = flaky.unique_path("amqp-429")
    url = flaky.script(path, Reply(429, headers={"Retry-After": "1"}), Reply(200))
    result = amqp_client.call("fetch", {"url": url}, timeout=20)
    assert result.ok and result.attempts == 2, result
    assert gaps(flaky.hits(path))[0] >= 1.0


def test_permanent_failure_is_not_retried(amqp_client: ToolClient, flaky: FlakyServer) -> None:
    path = flaky.unique_path("amqp-404")
    result = amqp_client.call("fetch", {"url": flaky.script(path, Reply(404))}, timeout=20)
    assert result.error is not None and result.error.type == ErrorType.NOT_FOUND
    assert result.attempts == 1 and len(flaky.hits(path)) == 1


def test_invalid_arguments_never_reach_the_tool(
    amqp_client: ToolClient, flaky: FlakyServer
) -> None:
    path = flaky.unique_path("amqp-invalid")
    result = amqp_client.call("record", {"url": flaky.url + path, "count": "many"})
    assert result.error is not None and result.error.type == ErrorType.INVALID_ARGUMENTS
    assert flaky.hits(path) == []


def test_the_deadline_stops_retries(amqp_client: ToolClient, flaky: FlakyServer) -> None:
    url = flaky.script(flaky.unique_path("amqp-down"), Reply(503))
    result = amqp_client.call("fetch_patiently", {"url": url}, timeout=1.5)
    assert result.error is not None and result.error.type == ErrorType.DEADLINE_EXCEEDED


def test_fan_out_returns_every_result_in_order(amqp_client: ToolClient, flaky: FlakyServer) -> None:
    calls = [("fetch", {"url": f"{flaky.url}/amqp-fan/{i}"}) for i in range(10)]
    results = amqp_client.call_many(calls, timeout=20)
    assert [r.data for r in results] == [{"path": f"/amqp-fan/{i}"} for i in range(10)]
