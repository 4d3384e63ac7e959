"""``celery -A toolexec.worker.app ...`` works as operators expect, and events show every call.

Given real workers on a real broker, Celery's own commands (worker, inspect,
control, events) reach them; the events Flower is built from carry one task
name per tool, the client's ``task-sent``, the retries and the error type of
failures, and never a secret argument.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ops_support import FlowerProcess, celery, wait_until
from ops_tools import OPS_QUEUE

from toolexec.client import ToolClient
from toolexec.keys import Keys
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

SECRET = "tok-SECRET-4711"


@pytest.fixture(scope="module")
def ops_worker(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("ops") / "worker.log"
    proc = WorkerProcess("ops_tools", worker_env, queues=OPS_QUEUE, concurrency=8, log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def ops_client(settings: Settings, ops_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


def test_celery_inspect_ping_reaches_a_toolexec_worker(
    ops_worker: WorkerProcess, worker_env: dict[str, str]
) -> None:
    done = celery(worker_env, "inspect", "ping", "-d", ops_worker.hostname, "--timeout", "10")
    assert done.returncode == 0, done.stderr
    assert ops_worker.hostname in done.stdout and "pong" in done.stdout


def test_plain_celery_worker_with_toolexec_tools_serves_them_and_obeys_control(
    settings: Settings, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given `celery -A toolexec.worker.app worker` and TOOLEXEC_TOOLS, it registers every tool."""
    native = WorkerProcess("ops_tools", worker_env, log_path=tmp_path / "native.log")
    native.env["TOOLEXEC_TOOLS"] = "ops_tools"
    native.args = [
        sys.executable, "-m", "celery", "-A", "toolexec.worker.app", "worker",
        "-n", native.hostname, "-P", "threads", "-c", "2", "-Q", "native-only", "-l", "INFO",
    ]  # fmt: skip
    native.start(settings.redis_url or "", settings.key_prefix)
    try:
        # When an operator asks what it runs, then every tool is a tools.<name> task.
        registered = celery(worker_env, "inspect", "registered", "-d", native.hostname)
        assert registered.returncode == 0, registered.stderr
        for name in ("greet", "fetch_with_token", "lookup_order", "http_request"):
            assert f"tools.{name}" in registered.stdout
        # When told to consume another queue, then it does.
        added = celery(worker_env, "control", "add_consumer", OPS_QUEUE, "-d", native.hostname)
        assert added.returncode == 0 and "add consumer" in added.stdout, added.stdout
        queues = celery(worker_env, "inspect", "active_queues", "-d", native.hostname)
        assert f"'name': '{OPS_QUEUE}'" in queues.stdout
        # When told to shut down, then it exits by itself.
        celery(worker_env, "control", "shutdown", "-d", native.hostname)
        assert native.process is not None
        assert native.process.wait(timeout=20) == 0
    finally:
        native.stop()


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
        # The wake-up makes workers send a heartbeat at once: the first event proves
        # the receiver is subscribed, so no task event is missed.
        wait_until(lambda: self.events, 15, "the first event (a worker heartbeat)")
        return self

    def __exit__(self, *_: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(5)
        self._conn.release()

    def of(self, task_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            e for e in list(self.events)
            if e.get("uuid") == task_id and (kind is None or e["type"] == kind)
        ]  # fmt: skip


def test_events_show_sent_retried_and_failed_calls_with_error_types_and_no_secrets(
    ops_client: ToolClient, ops_worker: WorkerProcess, flaky: FlakyServer
) -> None:
    # Given a service that fails twice before answering, and a tool that always fails
    path = flaky.unique_path("events")
    url = flaky.script(path, Reply(503), Reply(503), Reply(200, {"ok": True}))
    headers = {"X-Api-Key": SECRET, "Accept": "application/json"}
    with EventLog(ops_client) as log:
        # When both are called
        retried = ops_client.submit(
            "fetch_with_token", {"url": url, "token": SECRET, "headers": headers}
        )
        failed = ops_client.submit("lookup_order", {"order_id": "A-1"})
        assert retried.result().ok and retried.result().attempts == 3
        assert failed.result().error is not None
        wait_until(
            lambda: (
                log.of(retried.call_id, "task-succeeded") and log.of(failed.call_id, "task-failed")
            ),
            10,
            "the final events",
        )
    # Then the client's publish and each retry's publish are task-sent events, named per tool
    sent = log.of(retried.call_id, "task-sent")
    assert len(sent) == 3 and {e["name"] for e in sent} == {"tools.fetch_with_token"}
    assert len(log.of(retried.call_id, "task-retried")) == 2
    assert len(log.of(retried.call_id, "task-received")) == 3
    # and the failure carries its error type
    (failure,) = log.of(failed.call_id, "task-failed")
    assert "ToolFailed" in failure["exception"] and "not_found" in failure["exception"]
    # and no event shows the secret token or the API key, though the rest is shown
    shown = [e for e in log.of(retried.call_id) if "kwargs" in e]
    assert len(shown) == 6  # three task-sent and three task-received
    for event in shown:
        assert SECRET not in event["kwargs"], event
        assert "'token': '***'" in event["kwargs"] and "'X-Api-Key': '***'" in event["kwargs"]
        assert "application/json" in event["kwargs"]
    assert SECRET not in str(log.events)


def test_the_worker_log_never_shows_a_secret_argument(
    ops_client: ToolClient, ops_worker: WorkerProcess, flaky: FlakyServer
) -> None:
    url = flaky.script(flaky.unique_path("log"), Reply(503), Reply(200))
    assert ops_client.call("fetch_with_token", {"url": url, "token": SECRET}).ok
    assert ops_worker.log_path is not None
    text = ops_worker.log_path.read_text()
    assert "tools.fetch_with_token" in text and SECRET not in text


def test_celery_events_dump_prints_toolexec_calls(
    ops_client: ToolClient, ops_worker: WorkerProcess, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """`celery -A toolexec.worker.app events --dump` shows each call under its tool's task name."""
    out = tmp_path / "events.txt"
    with out.open("wb") as sink:
        dump = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "toolexec.worker.app", "events", "--dump"],
            env={**ops_worker.env, **worker_env},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        # Once it prints a worker's heartbeat it is subscribed.
        wait_until(lambda: "heartbeat" in out.read_text(), 20, "celery events to listen")
        call_id = ops_client.submit("greet", {"name": "ops"}).call_id
        wait_until(
            lambda: "tools.greet(" in out.read_text() and call_id in out.read_text(),
            10,
            "the call in the dump",
        )
    finally:
        dump.terminate()
        dump.wait(10)


def test_a_worker_is_named_in_the_heartbeat_set_it_is_known_by(
    ops_worker: WorkerProcess, ops_client: ToolClient, settings: Settings
) -> None:
    """The name Celery's commands address is the one toolexec's catalog heartbeat records."""
    seen = ops_client.redis.zscore(Keys(settings.key_prefix).workers(), ops_worker.hostname)
    assert seen is not None


def test_celery_flower_for_the_app_sees_the_workers(
    ops_worker: WorkerProcess, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """`celery -A toolexec.worker.app flower` works too, for operators used to it."""
    flower = FlowerProcess(
        worker_env,
        "ops",
        "celery-flower-pw",
        tmp_path / "flower.log",
        command=(
            "-m",
            "celery",
            "-A",
            "toolexec.worker.app",
            "flower",
            "--basic-auth=ops:celery-flower-pw",
        ),
    )
    try:
        flower.start(ops_worker.hostname)
        assert flower.status_without_auth("/api/workers") == 401
    finally:
        flower.stop()
