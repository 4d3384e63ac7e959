"""Helpers of the hostile-worker security tests: own workers per broker, raw messages.

Each module starts its own worker under its own key prefix and queue, so an
attack that (before the fix) stopped a worker never takes down the shared one,
and messages on a shared RabbitMQ never reach another test's worker.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Exchange, Producer, Queue

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

HERE = Path(__file__).parent

RABBITMQ_URL = os.environ.get("TOOLEXEC_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll ``check`` until it is truthy or ``timeout`` passes; its last value."""
    end = time.monotonic() + timeout
    while not (found := check()) and time.monotonic() < end:
        time.sleep(0.05)
    return found


def rabbitmq_url() -> str:
    """The RabbitMQ to test against, or skip the test with the reason."""
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1.0):
            pass
    except OSError as exc:
        pytest.skip(f"no RabbitMQ on 127.0.0.1:5672 ({exc})")
    return RABBITMQ_URL


@dataclass
class Deployment:
    """One worker, its settings and a client, isolated by key prefix and queue."""

    settings: Settings
    worker: WorkerProcess
    client: ToolClient
    broker: str
    env: dict[str, str]

    def another_worker(self, tools: str, log_path: Path) -> WorkerProcess:
        """A second worker on the same prefix and queue, with other tools; started."""
        proc = WorkerProcess(tools, self.env, queues=self.queue, concurrency=4, log_path=log_path)
        proc.start(self.settings.redis_url or "", self.settings.key_prefix)
        return proc

    @property
    def queue(self) -> str:
        return self.settings.default_queue

    def log(self) -> str:
        assert self.worker.log_path is not None
        return self.worker.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.worker.process is not None and self.worker.process.poll() is None

    def publish_raw(self, task: str, body: bytes, **headers: Any) -> str:
        """Publish ``body`` as is, as protocol-2 task ``task``; returns its id."""
        task_id = str(headers.pop("id", uuid.uuid4()))
        exchange = Exchange(self.queue, type="direct")
        queue = Queue(self.queue, exchange, routing_key=self.queue)
        with Connection(self.broker) as conn:
            Producer(conn).publish(
                body,
                exchange=exchange,
                routing_key=self.queue,
                declare=[queue],
                headers={"lang": "py", "task": task, "id": task_id, **headers},
                content_type="application/json",
                content_encoding="utf-8",
                retry=True,
            )
        return task_id


@contextmanager
def deployment(
    base: Settings,
    worker_env: dict[str, str],
    log_path: Path,
    *,
    broker: str | None = None,
    tools: str = "security_tools",
    extra_env: dict[str, str] | None = None,
    pool: str = "threads",
    extra_queue: str | None = None,
) -> Iterator[Deployment]:
    """A worker of ``tools`` on its own prefix and queue (and broker, when given)."""
    tag = uuid.uuid4().hex[:8]
    settings = base.model_copy(
        update={
            "key_prefix": f"hw-{tag}",
            "default_queue": f"hw-{tag}",
            "broker_url": broker or base.broker_url,
        }
    )
    env = {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "PYTHONPATH": os.pathsep.join([str(HERE), worker_env.get("PYTHONPATH", "")]),
        **(extra_env or {}),
    }
    if settings.broker_url:
        env["TOOLEXEC_BROKER_URL"] = settings.broker_url
    queue = settings.default_queue
    if (
        extra_queue is not None
    ):  # two queues: kombu waits with BRPOP, not toolexec.transport.inbox's move
        queue = f"{queue},{queue}-{extra_queue}"
    proc = WorkerProcess(tools, env, queues=queue, concurrency=4, log_path=log_path, pool=pool)
    proc.start(settings.redis_url or "", settings.key_prefix)
    try:
        with ToolClient(settings) as client:
            broker_url = settings.broker_url or settings.redis_url or ""
            yield Deployment(settings, proc, client, broker_url, env)
    finally:
        proc.stop()


#: The deployments a hostile message is tried on: Redis and RabbitMQ brokers, and prefork.
FLEETS = ["redis", "rabbitmq", "redis-prefork"]


@contextmanager
def fleet_of(
    kind: str, base: Settings, worker_env: dict[str, str], log_path: Path
) -> Iterator[Deployment]:
    """A :func:`deployment` of one of :data:`FLEETS`."""
    broker = rabbitmq_url() if kind == "rabbitmq" else None
    pool = kind.partition("-")[2] or "threads"
    with deployment(base, worker_env, log_path, broker=broker, pool=pool) as found:
        yield found


def dead_letters(client: Any, key: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


class EventLog:
    """Every Celery event on the broker, as Flower receives them, collected in a thread."""

    def __init__(self, client: ToolClient) -> None:
        self.events: list[dict[str, Any]] = []
        self._conn = client.app.connection_for_read()
        self._receiver = client.app.events.Receiver(self._conn, handlers={"*": self.events.append})
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        self._receiver.capture(limit=None, timeout=None, wakeup=True)

    def __enter__(self) -> EventLog:
        self._thread.start()
        # the wake-up makes workers send a heartbeat at once: once it is here, the
        # receiver is subscribed and no task event is missed
        assert eventually(lambda: self.events, 15), "no event from the worker"
        return self

    def __exit__(self, *_: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(5)
        self._conn.release()


def redis_values(client: Any) -> Iterator[tuple[str, str]]:
    """Every key of the database with its whole value as text, whatever its type."""
    for key in client.scan_iter(count=500):
        kind = client.type(key)
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = client.smembers(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = ""
        yield key, repr(value)
