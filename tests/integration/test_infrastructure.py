"""Broken infrastructure gives clear errors or results at the deadline, never a hang.

Redis or broker down: the client raises a typed error within seconds. No live
worker on a tool's queue: the caller gets ``no_worker`` at once. The worker
killed mid-call: the caller gets a ``deadline_exceeded`` result at its
deadline (+ reply_grace), saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from integration_support import closed_port

from toolexec.client import ToolClient
from toolexec.errors import BrokerUnavailableError, ErrorType, RedisUnavailableError
from toolexec.keys import Keys
from toolexec.registry import Registry, tool
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, WorkerProcess

pytestmark = pytest.mark.integration

#: The queue of ``lonely_tools.linger``; only workers this module starts consume it.
LONELY_QUEUE = "lonely"


def test_unreachable_redis_raises_redis_unavailable_quickly(settings: Settings) -> None:
    """Given a Redis URL nobody listens on, call and acall raise RedisUnavailableError in < 10 s."""
    port = closed_port()
    dead = f"redis://127.0.0.1:{port}/0"
    offline = settings.model_copy(update={"redis_url": dead, "broker_url": dead})

    start = time.monotonic()
    with ToolClient(offline) as tool_client:
        with pytest.raises(RedisUnavailableError, match=f"127.0.0.1:{port}"):
            tool_client.call("pause", {"seconds": 0})
        with pytest.raises(RedisUnavailableError):
            asyncio.run(tool_client.acall("pause", {"seconds": 0}))

    assert time.monotonic() - start < 10


def test_unreachable_broker_raises_broker_unavailable_and_runs_nothing(
    client_without_broker: ToolClient, flaky: FlakyServer
) -> None:
    """Given a broker URL nobody listens on, a valid call raises BrokerUnavailableError fast."""
    path = flaky.unique_path("never-sent")
    arguments = {"url": flaky.url + path, "count": 1}

    start = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="nothing was run"):
        client_without_broker.call("record", arguments, timeout=10)
    with pytest.raises(BrokerUnavailableError):
        client_without_broker.call_many([("record", arguments)], timeout=10)

    assert time.monotonic() - start < 15
    assert flaky.hits(path) == []


_unserved = Registry()


@tool(queue="nobody", timeout=5, registry=_unserved)
def unattended() -> str:
    """Never runs: no worker consumes its queue."""
    return "unreachable"


@pytest.fixture
def unserved_tool(client: ToolClient, keys: Keys, settings: Settings) -> Iterator[str]:
    """A catalog entry routed to a queue no worker consumes, as a stopped fleet would leave."""
    spec = _unserved.get("unattended")
    assert spec is not None
    entry = spec.catalog_entry(settings.default_queue)
    client.redis.hset(keys.catalog(), spec.name, json.dumps(entry, sort_keys=True))
    yield spec.name
    client.redis.hdel(keys.catalog(), spec.name)


def test_call_to_a_queue_no_worker_consumes_is_answered_at_once(
    client: ToolClient, unserved_tool: str
) -> None:
    """Given a tool whose queue no live worker serves, the caller gets no_worker at once."""
    start = time.monotonic()
    result = client.call(unserved_tool, {}, timeout=5)
    took = time.monotonic() - start

    assert result.error is not None
    assert result.error.type == ErrorType.NO_WORKER
    assert "queue 'nobody'" in result.error.message
    assert result.error.retryable is True
    assert result.attempts == 0
    assert took < 1.0


@pytest.fixture
def lonely_env(worker_env: dict[str, str]) -> dict[str, str]:
    """The shared worker's environment, with ``lonely_tools`` importable."""
    here = str(Path(__file__).parent)
    return {**worker_env, "PYTHONPATH": os.pathsep.join([here, worker_env["PYTHONPATH"]])}


def _lonely_worker(env: dict[str, str], settings: Settings, log: Path) -> WorkerProcess:
    proc = WorkerProcess("lonely_tools", env, queues=LONELY_QUEUE, concurrency=2, log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


def _await_hit(flaky: FlakyServer, path: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not flaky.hits(path):
        assert time.monotonic() < end, f"no call reached {path} within {timeout} s"
        time.sleep(0.02)


def test_worker_killed_mid_call_leaves_the_caller_a_deadline_result(
    client: ToolClient,
    flaky: FlakyServer,
    settings: Settings,
    lonely_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Given a worker SIGKILLed while it runs a call, the caller still gets an answer on time.

    The message stays unacknowledged in the broker and is only redelivered
    after the visibility timeout (max_timeout + 60 s, docs/background.md, Celery): recovering
    the call itself is issue 4's territory. Here a replacement worker is up
    before the deadline, and the call still ends as deadline_exceeded at its
    deadline + reply_grace instead of hanging; new calls are served again.
    """
    doomed = _lonely_worker(lonely_env, settings, tmp_path / "doomed.log")
    path = flaky.unique_path("linger")
    try:
        submitted = time.monotonic()
        handle = client.submit("linger", {"url": flaky.url + path, "seconds": 30}, timeout=4)
        _await_hit(flaky, path)
    finally:
        doomed.kill()

    def wait() -> tuple[ToolResult, float]:
        return handle.result(), time.monotonic() - submitted

    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(wait)
        replacement = _lonely_worker(lonely_env, settings, tmp_path / "replacement.log")
        try:
            result, took = waiting.result(timeout=30)
            fresh = client.call("linger", {"url": flaky.url + path, "seconds": 0}, timeout=10)
        finally:
            replacement.stop()

    assert result.error is not None
    assert result.error.type == ErrorType.DEADLINE_EXCEEDED
    if "could start" in result.error.message:
        # the killed worker's message, handed back, reached the replacement after the
        # deadline (a loaded machine): the worker ended it, on time, as the caller would have
        assert result.timings.queued_ms >= 4000.0
    else:
        assert f"queue {LONELY_QUEUE!r}" in result.error.message
    assert 4.0 <= took < 4.0 + settings.reply_grace + 1.0
    assert fresh.status == "ok", fresh
    assert len(flaky.hits(path)) == 2  # the killed call ran once and was not redelivered


def test_a_worker_stopped_cleanly_is_gone_at_once_and_calls_say_so(
    settings: Settings, lonely_env: dict[str, str], keys: Keys, tmp_path: Path
) -> None:
    """Given the only worker of a queue stopped with SIGTERM, it leaves the live sets at once.

    Nothing waits for its heartbeat to age: the next call is answered no_worker
    at once, and ``toolexec status`` no longer lists it.
    """
    from toolexec.ops.status import gather

    lonely = _lonely_worker(lonely_env, settings, tmp_path / "lonely.log")
    with ToolClient(settings) as before:
        assert before.redis.zscore(keys.queue_workers(LONELY_QUEUE), lonely.hostname) is not None
        assert lonely.hostname in [w["name"] for w in gather(settings)["workers"]]

    lonely.stop()

    with ToolClient(settings) as after:
        assert after.redis.zscore(keys.workers(), lonely.hostname) is None
        assert after.redis.zscore(keys.queue_workers(LONELY_QUEUE), lonely.hostname) is None
        start = time.monotonic()
        result = after.call("linger", {"url": "http://127.0.0.1:9/", "seconds": 0}, timeout=10)
        took = time.monotonic() - start
    assert result.error is not None and result.error.type == ErrorType.NO_WORKER, result
    assert took < 1.0
    assert lonely.hostname not in [w["name"] for w in gather(settings)["workers"]]
