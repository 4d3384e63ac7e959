"""Redis killed while a worker records a failed call: the records are made once it is back.

The tool (``chaos_fail`` in bench/chaos_tools.py) fails its first attempt, and
its last waits in the ledger for the test's go: the test kills toolexec's
Redis first, so the worker finds it gone when it answers and records. Redis
comes back within the call's deadline; the answer arrives, and the breaker,
the retry budget and the stats each show the call exactly once.

A write can also reach Redis and its reply be lost with the connection: a
proxy that cuts replies shows that such a write, sent again, still counts once.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry
from rigs.chaos import RedisServer, Rig, wait_until

from toolexec.breaker import CircuitBreaker
from toolexec.clock import SystemClock
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.keys import WRITE_ID_MARGIN_S, Keys
from toolexec.layers.batch import Batch
from toolexec.layers.retry_budget import RetryBudget
from toolexec.ops.metrics import Metrics
from toolexec.policies import BreakerPolicy, RetryBudgetPolicy
from toolexec.settings import Settings
from toolexec.stores.stats import CallStats
from toolexec.tasks.runtime import WorkerRuntime
from toolexec.worker.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(120)]


def _logged(built: Rig, text: str) -> bool:
    path = built.workers[0].log_path
    return path is not None and text in path.read_text(errors="replace")


def test_records_of_a_failed_call_survive_a_redis_restart_once(make_rig: object) -> None:
    key = uuid.uuid4().hex
    with make_rig() as built:  # type: ignore[operator]
        assert built.ledger is not None
        ledger = redis.Redis.from_url(built.ledger.url, decode_responses=True)
        handle = built.tool_client.submit("chaos_fail", {"key": key}, timeout=30)
        assert wait_until(lambda: ledger.exists(f"chaos:last:{key}") == 1, 20)

        built.servers[0].kill()  # the last attempt runs; Redis goes before its records
        ledger.rpush(f"chaos:go:{key}", "go")
        assert wait_until(lambda: _logged(built, f"call {handle.call_id}: Redis unreachable"), 20)
        built.servers[0].start()  # well within the call's 30 s

        result = handle.result()
        assert result.error is not None and result.error.type == "unavailable", result
        assert result.attempts == 2, result
        assert wait_until(lambda: _logged(built, f"call {handle.call_id}: wrote "), 20)

        state = redis.Redis.from_url(built.redis_url, decode_responses=True)
        keys = Keys()
        view = CircuitBreaker(state, keys).snapshot("chaos_fail")
        assert (view.calls, view.failures, view.consecutive) == (1, 1, 1), view
        # 10 tokens; the first attempt's failure took one before its retry, the last one
        # (the held write) one more: 8, not 7 (counted twice) nor 9 (lost)
        assert float(state.hget(keys.budget("chaos_fail"), "tokens") or 0) == 8.0
        stats = CallStats(state, keys).window(5)["chaos_fail"]
        assert (stats.calls, dict(stats.failed)) == (1, {"unavailable": 1}), stats
        assert (stats.attempts, stats.retries, stats.in_flight) == (2, 1, 0), stats
        assert not _logged(built, "gave up writing")


class CuttingProxy:
    """A TCP proxy to a Redis that, when armed, passes a request on and cuts its reply.

    The server applied the request; the client sees a broken connection and
    cannot tell: the one case where a write sent again may count twice.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pipe, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if replies and self.armed.is_set():
                    self.armed.clear()
                    self.cuts += 1
                    break
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def _records(client: redis.Redis, keys: Keys, call: str, deadline: float) -> Batch:
    """A failed call's settlement writes, as a worker queues them: held, with the call's id."""
    write = (f"{call}:1", deadline + WRITE_ID_MARGIN_S)
    breakers = CircuitBreaker(client, keys)
    policy = BreakerPolicy(consecutive_failures=5)
    batch = Batch()
    admission = breakers.acquire("cut", policy)
    breakers.record_into(
        batch, "cut", policy, admission, success=False, duration_s=0.1, write=write
    )
    budget = RetryBudget(client, keys)
    tokens = RetryBudgetPolicy(kind="tokens", max_tokens=10)
    budget.record_into(batch, "cut", tokens, first_attempt=True, failed=True, write=write)
    CallStats(client, keys).finished("cut", call, 1, "unavailable", batch, None, write[1])
    return batch


def _counted(state: redis.Redis, keys: Keys) -> tuple[int, float, int]:
    view = CircuitBreaker(state, keys).snapshot("cut")
    tokens = float(state.hget(keys.budget("cut"), "tokens") or 10)
    stats = CallStats(state, keys).window(1).get("cut")
    return view.failures, tokens, 0 if stats is None else stats.calls


@pytest.mark.parametrize("client_retries", [0, 1], ids=["held-resend", "redis-py-retry"])
def test_a_write_applied_before_its_connection_broke_counts_once(
    tmp_path: Path, client_retries: int
) -> None:
    """Sent again by the worker (held) or by redis-py's own retry: one failure, one token."""
    server = RedisServer(tmp_path / "redis", aof=False)
    server.start()
    proxy = CuttingProxy(server.port)
    try:
        state = redis.Redis(port=server.port, decode_responses=True)
        keys = Keys(f"held-{uuid.uuid4().hex[:8]}")
        through = redis_client(
            f"redis://127.0.0.1:{proxy.port}/0", retry=Retry(NoBackoff(), client_retries)
        )
        # a first call loads the scripts (a NOSCRIPT would keep the cut write from applying)
        _records(through, keys, uuid.uuid4().hex, time.time() + 30).execute(hold=True)
        assert _counted(state, keys) == (1, 9.0, 1)

        batch = _records(through, keys, uuid.uuid4().hex, time.time() + 30)
        proxy.armed.set()
        batch.execute(hold=True)

        assert proxy.cuts == 1
        # applied though the client saw the connection break: this is what a resend meets
        assert _counted(state, keys) == (2, 8.0, 2)
        if client_retries == 0:
            assert sorted(batch.held) == ["breaker record", "retry budget record", "stats", "stats"]
            assert batch.resend_held()
        assert not batch.held
        assert _counted(state, keys) == (2, 8.0, 2)
    finally:
        proxy.close()
        server.kill()


def test_held_writes_redis_never_takes_back_are_given_up_counted_and_stepped_around(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stays away past the call's deadline: the worker gives its held writes up.

    What tasks/runtime.py promises then (README, Reliability): one warning line naming
    the call and every write given up, each write counted in ``toolexec_writes_dropped``
    under its name, and the owners step aside: the breaker and the retry budget heard
    of the error, so the next call's admission does not ask the dead Redis at all.
    """
    server = RedisServer(tmp_path / "redis", aof=False)
    server.start()
    keys = Keys(f"held-{uuid.uuid4().hex[:8]}")
    client = redis_client(server.url, retry=Retry(NoBackoff(), 0))
    settings = Settings(redis_url=server.url, data_dir=tmp_path / "data", key_prefix=keys.prefix)
    metrics = Metrics(CollectorRegistry())  # the reporter toolexec worker registers
    runtime = WorkerRuntime(
        create_app(settings), settings, client=client, clock=SystemClock(), report_to=[metrics]
    )
    call = uuid.uuid4().hex
    deadline = time.time() + 1.0
    breakers, budget = CircuitBreaker(client, keys), RetryBudget(client, keys)
    policy, tokens = BreakerPolicy(consecutive_failures=5), RetryBudgetPolicy(kind="tokens")
    write = (f"{call}:1", deadline + WRITE_ID_MARGIN_S)
    batch = Batch()
    admission = breakers.acquire("cut", policy)
    breakers.record_into(
        batch, "cut", policy, admission, success=False, duration_s=0.1, write=write
    )
    budget.record_into(batch, "cut", tokens, first_attempt=True, failed=True, write=write)
    registry = metrics.registry

    def dropped(write: str) -> float:
        value = registry.get_sample_value("toolexec_writes_dropped_total", {"write": write})
        return value or 0.0

    before = {w: dropped(w) for w in ("breaker record", "retry budget record")}
    server.kill()
    batch.execute(hold=True)
    assert sorted(batch.held) == ["breaker record", "retry budget record"]
    ctx = CallContext(
        call_id=call, tool="cut", deadline=deadline, submitted_at=time.time(), reply_to="r"
    )

    with caplog.at_level(logging.INFO, logger="toolexec.worker"):
        runtime.settle_held(ctx, batch)

    given_up = [r.getMessage() for r in caplog.records if "gave up writing" in r.getMessage()]
    assert len(given_up) == 1, caplog.text
    assert given_up[0].startswith(f"call {call}: gave up writing breaker record, retry budget"), (
        given_up
    )
    assert "counted in toolexec_writes_dropped" in given_up[0]
    assert not batch.held
    after = {w: dropped(w) for w in before}
    assert {w: after[w] - before[w] for w in before} == {
        "breaker record": 1,
        "retry budget record": 1,
    }
    # stepped aside: with Redis still dead, admissions answer at once instead of raising
    assert breakers.fail_open.down() and budget.fail_open.down()
    started = time.monotonic()
    assert breakers.acquire("cut", policy).allowed
    assert time.monotonic() - started < 0.5
