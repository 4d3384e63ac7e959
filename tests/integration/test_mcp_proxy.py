"""Remote MCP servers' tools run by workers behind toolexec's defences.

A real MCP server made with the official SDK (``mcp_remote_server.py``) runs on
loopback and fails on command; a real worker proxies it (``mcp_proxy_tools``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp_support import free_port, mcp_http_process, wait_for_port, with_client

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent


class Remote:
    """The remote MCP server process and its control endpoint."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.control = f"http://127.0.0.1:{port}/control"

    def fail(self, *statuses: int, retry_after: str | None = None) -> None:
        order: dict[str, Any] = {"fail": list(statuses), "clear": True}
        if retry_after is not None:
            order["retry_after"] = retry_after
        httpx.post(self.control, json=order, timeout=5).raise_for_status()

    def seen(self) -> dict[str, Any]:
        seen: dict[str, Any] = httpx.get(self.control, timeout=5).json()
        return seen

    def calls(self, tool: str) -> int:
        return int(self.seen()["calls"].get(tool, 0))

    def writes(self, key: str) -> int:
        return int(self.seen()["writes"].get(key, 0))


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextmanager
def remote_process(port: int, log: Path, *extra: str) -> Iterator[Remote]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "mcp_remote_server.py"), str(port), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_port(port, proc, log)
        yield Remote(port)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    log = tmp_path_factory.mktemp("mcp-remote") / "remote.log"
    with remote_process(free_port(), log) as server:
        yield server


@pytest.fixture(scope="module")
def proxy_env(worker_env: dict[str, str], remote: Remote) -> dict[str, str]:
    return {**worker_env, "TOOLEXEC_TEST_MCP_URL": remote.url}


@pytest.fixture(scope="module")
def proxy(
    settings: Settings,
    proxy_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ToolClient]:
    log = tmp_path_factory.mktemp("mcp-proxy") / "worker.log"
    proc = WorkerProcess("mcp_proxy_tools", proxy_env, queues="mcp_proxy", log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    with ToolClient(settings) as client:
        yield client
    proc.stop()


def test_remote_tools_are_registered_with_policy_from_annotations(proxy: ToolClient) -> None:
    catalog = proxy.catalog(refresh=True)
    assert {"remote.echo", "remote.write", "remote.refuse"} <= set(catalog)
    assert catalog["remote.echo"]["task"] == "tools.remote.echo"
    assert catalog["remote.echo"]["policy"]["side_effects"] is False  # readOnlyHint
    assert catalog["remote.write"]["policy"]["side_effects"] is True  # destructiveHint
    assert catalog["remote.echo"]["policy"]["queue"] == "mcp_proxy"
    assert catalog["remote.echo"]["policy"]["breaker_key"] == "@mcp:remote"
    assert catalog["remote.echo"]["parameters"]["required"] == ["text"]


def test_a_call_succeeds_and_bad_arguments_name_the_field(
    proxy: ToolClient, remote: Remote
) -> None:
    result = proxy.call("remote.echo", {"text": "ab", "times": 2})
    assert result.ok, result
    assert result.data == {"echo": "abab"}

    before = remote.calls("echo")
    bad = proxy.call("remote.echo", {"text": "ab", "times": "two"})
    assert bad.error is not None and bad.error.type == ErrorType.INVALID_ARGUMENTS
    assert "times" in bad.error.message
    assert remote.calls("echo") == before  # refused before it reached the server


def test_503_503_200_ends_ok_through_retries(proxy: ToolClient, remote: Remote) -> None:
    before = remote.calls("echo")
    remote.fail(503, 503)
    result = proxy.call("remote.echo", {"text": "again"})
    assert result.ok, result
    assert result.attempts == 3
    assert remote.calls("echo") == before + 1  # the two 503s never reached the tool


def test_429_is_retried_after_its_retry_after(proxy: ToolClient, remote: Remote) -> None:
    remote.fail(429, retry_after="1")
    start = time.monotonic()
    result = proxy.call("remote.echo", {"text": "slowly"})
    assert result.ok, result
    assert result.attempts == 2
    assert time.monotonic() - start >= 1.0


def test_is_error_is_a_tool_error_and_not_retried(proxy: ToolClient, remote: Remote) -> None:
    before = remote.calls("refuse")
    result = proxy.call("remote.refuse", {"reason": "policy"})
    assert result.error is not None and result.error.type == ErrorType.TOOL_ERROR
    assert result.attempts == 1
    assert remote.calls("refuse") == before + 1


def test_a_failing_server_answers_from_the_last_good_result_marked_degraded(
    proxy: ToolClient, remote: Remote
) -> None:
    fresh = proxy.call("remote.echo", {"text": "cached"})
    assert fresh.ok and not fresh.degraded
    remote.fail(503, 503, 503)
    result = proxy.call("remote.echo", {"text": "cached"})
    assert result.ok, result
    assert result.degraded and result.source == "cache"
    assert result.data == {"echo": "cached"}
    assert result.fallback is not None
    assert result.fallback.primary_error.type == ErrorType.UNAVAILABLE
    remote.fail()  # nothing left queued for the next test


def test_the_breaker_opens_for_the_whole_server(proxy: ToolClient, remote: Remote) -> None:
    remote.fail(503, 503)
    for _ in range(2):
        failed = proxy.call("shaky.echo", {"text": "x"})
        assert failed.error is not None and failed.error.type == ErrorType.UNAVAILABLE
    before = remote.seen()["calls"]
    refused = proxy.call("shaky.refuse", {"reason": "another tool of the same server"})
    assert refused.error is not None and refused.error.type == ErrorType.CIRCUIT_OPEN
    assert refused.attempts == 0
    assert remote.seen()["calls"] == before
    assert proxy.call("remote.echo", {"text": "other server"}).ok  # its own breaker


def test_the_tool_list_is_refreshed_when_the_server_says_it_changed(
    proxy: ToolClient, remote: Remote
) -> None:
    name = f"late_{uuid.uuid4().hex[:6]}"
    httpx.post(remote.control, json={"add_tool": name}, timeout=5).raise_for_status()
    wait_until(lambda: f"remote.{name}" in proxy.catalog(refresh=True), 20, "the new remote tool")
    result = proxy.call(f"remote.{name}", {})
    assert result.ok, result
    assert result.data == name


def test_a_remote_write_is_not_run_twice_when_its_worker_is_killed(
    settings: Settings,
    proxy_env: dict[str, str],
    remote: Remote,
    tmp_path: Path,
) -> None:
    """The write reached the server, then its worker died: the taker must not write again."""
    prefix = f"kill-{uuid.uuid4().hex[:8]}"
    env = {
        **proxy_env,
        "TOOLEXEC_KEY_PREFIX": prefix,
        "TOOLEXEC_IDEMPOTENCY_LEASE_S": "2",
        "TOOLEXEC_IDEMPOTENCY_SWEEP_S": "0.25",
        # a queue of their own, set the way an operator would (TOOLEXEC_MCP_SERVERS)
        "TOOLEXEC_MCP_SERVERS": json.dumps({"remote": {"queue": "mcp_kill"}}),
    }
    doomed = WorkerProcess("mcp_proxy_tools", env, queues="mcp_kill", log_path=tmp_path / "a.log")
    taker = WorkerProcess("mcp_proxy_tools", env, queues="mcp_kill", log_path=tmp_path / "b.log")
    own = settings.model_copy(update={"key_prefix": prefix})
    key = uuid.uuid4().hex
    try:
        doomed.start(settings.redis_url or "", prefix)
        with ToolClient(own) as client:
            handle = client.submit(
                "remote.write", {"key": key, "delay": 3.0}, run_id="r-kill", timeout=30
            )
            wait_until(lambda: remote.writes(key) == 1, 15, "the write to reach the server")
            doomed.kill()
            taker.start(settings.redis_url or "", prefix)
            result = handle.result()
        assert result.status == "unknown", result.model_dump_json()
        assert result.error is not None and result.error.type == ErrorType.WORKER_LOST
        # A later write on the same queue, answered: the taker has taken what came before it.
        # Stopping the taker then lets any attempt it still runs finish (a warm shutdown),
        # so a late second write of ``key`` would be counted by now.
        with ToolClient(own) as client:
            marker = client.call("remote.write", {"key": f"{key}-after"}, timeout=30)
        assert marker.ok, marker.model_dump_json()
        taker.stop()
        assert remote.writes(key) == 1
    finally:
        doomed.kill()
        taker.stop()


def test_a_server_given_on_the_command_line_over_stdio(
    settings: Settings, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """``--mcp-server NAME=stdio:COMMAND``: the worker starts the server as its child."""
    command = f"{sys.executable} {HERE / 'mcp_remote_server.py'} --stdio"
    env = {**worker_env, "TOOLEXEC_MCP_SERVERS": json.dumps({"local": {"queue": "mcp_stdio"}})}
    proc = WorkerProcess("tooldefs", env, queues="mcp_stdio", log_path=tmp_path / "w.log")
    proc.args += ["--mcp-server", f"local=stdio:{command}"]
    try:
        proc.start(settings.redis_url or "", settings.key_prefix)
        with ToolClient(settings) as client:
            entry = client.catalog(refresh=True)["local.echo"]
            assert entry["policy"]["queue"] == "mcp_stdio"
            ok = client.call("local.echo", {"text": "over stdio"})
            assert ok.ok and ok.data == {"echo": "over stdio"}, ok
            refused = client.call("local.refuse", {"reason": "x"})
            assert refused.error is not None and refused.error.type == ErrorType.TOOL_ERROR
    finally:
        proc.stop()


def test_the_session_is_opened_again_after_the_server_restarts(
    settings: Settings, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """A restarted server no longer knows the worker's session: the retry opens a new one."""
    port = free_port()
    log = tmp_path / "remote.log"
    url = f"http://127.0.0.1:{port}/mcp"
    env = {
        **worker_env,
        "TOOLEXEC_MCP_SERVERS": json.dumps(
            {"again": {"queue": "mcp_again", "max_attempts": 4, "backoff_base": 0.2}}
        ),
    }
    proc = WorkerProcess("tooldefs", env, queues="mcp_again", log_path=tmp_path / "w.log")
    proc.args += ["--mcp-server", f"again={url}"]
    try:
        with remote_process(port, log):
            proc.start(settings.redis_url or "", settings.key_prefix)
            with ToolClient(settings) as client:
                assert client.call("again.echo", {"text": "first"}).ok
        with remote_process(port, log) as restarted, ToolClient(settings) as client:
            result = client.call("again.echo", {"text": "second"})
            assert result.ok, result.model_dump_json()
            assert result.attempts >= 2  # the first met the dead session
            assert restarted.calls("echo") == 1
    finally:
        proc.stop()


def test_a_server_down_when_the_worker_starts_is_registered_once_it_is_up(
    settings: Settings, worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    env = {**worker_env, "TOOLEXEC_MCP_SERVERS": json.dumps({"later": {"queue": "mcp_later"}})}
    proc = WorkerProcess("tooldefs", env, log_path=tmp_path / "w.log")
    proc.args += ["--mcp-server", f"later=http://127.0.0.1:{port}/mcp"]  # -Q: every queue
    try:
        proc.start(settings.redis_url or "", settings.key_prefix)
        with ToolClient(settings) as client:
            assert "later.echo" not in client.catalog(refresh=True)
            with remote_process(port, tmp_path / "remote.log"):
                wait_until(
                    lambda: "later.echo" in client.catalog(refresh=True), 20, "the late tools"
                )
                result = client.call("later.echo", {"text": "finally"})
                assert result.ok, result.model_dump_json()
    finally:
        proc.stop()


def test_an_mcp_client_reaches_a_remote_tool_through_toolexec(
    proxy: ToolClient, proxy_env: dict[str, str], remote: Remote, tmp_path: Path
) -> None:
    """Both directions at once: MCP client -> toolexec mcp -> worker -> remote MCP server."""

    async def body(client: Client) -> tuple[types.ListToolsResult, types.CallToolResult]:
        return await client.list_tools(), await client.call_tool("remote.echo", {"text": "gw"})

    remote.fail(503)
    with mcp_http_process(proxy_env, tmp_path / "front.log") as url:
        listed, result = with_client(url, body)
    echo = {tool.name: tool for tool in listed.tools}["remote.echo"]
    assert echo.annotations is not None and echo.annotations.read_only_hint is True
    assert echo.output_schema is not None and "allOf" in echo.output_schema  # remote's own
    assert result.is_error is False
    assert result.structured_content is not None
    assert result.structured_content["data"] == {"echo": "gw"}
    assert result.meta is not None
    assert result.meta["toolexec/result"]["attempts"] == 2  # the 503 was retried by toolexec


def test_headers_from_the_settings_reach_the_server_and_a_401_is_not_retried(
    settings: Settings, worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"

    def worker_with(token: str, queue: str) -> WorkerProcess:
        policy = {"locked": {"queue": queue, "headers": {"Authorization": f"Bearer {token}"}}}
        env = {**worker_env, "TOOLEXEC_MCP_SERVERS": json.dumps(policy)}
        proc = WorkerProcess("tooldefs", env, queues=queue, log_path=tmp_path / f"{queue}.log")
        proc.args += ["--mcp-server", f"locked={url}"]
        return proc

    good = worker_with("right-token", "mcp_locked")
    try:
        with remote_process(port, tmp_path / "remote.log", "--token", "right-token") as locked:
            good.start(settings.redis_url or "", settings.key_prefix)
            with ToolClient(settings) as client:
                result = client.call("locked.echo", {"text": "with a token"})
                assert result.ok, result.model_dump_json()
                locked.fail(401)
                refused = client.call("locked.echo", {"text": "rejected"})
                assert refused.error is not None
                assert refused.error.type == ErrorType.UNAUTHORIZED
                assert refused.attempts == 1
    finally:
        good.stop()
    assert "right-token" not in (tmp_path / "mcp_locked.log").read_text()


def test_a_remote_servers_question_reaches_toolexecs_own_mcp_client(
    proxy: ToolClient, proxy_env: dict[str, str], tmp_path: Path
) -> None:
    """remote server --elicitation--> worker's session --> Redis --> front --> MCP client,
    and the client's answer back the same way, within the call's deadline."""
    asked: list[str] = []

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "ada"})

    async def body(client: Client) -> types.CallToolResult:
        return await client.call_tool("remote.greet", {})

    with mcp_http_process(proxy_env, tmp_path / "front.log") as url:
        result = with_client(url, body, elicitation_callback=on_elicit, mode="legacy")
    assert asked == ["What is your name?"]
    assert result.structured_content is not None
    assert result.structured_content["data"] == {"result": "hello ada"}


def test_a_remote_servers_question_to_an_sdk_caller_is_refused_in_words(
    proxy: ToolClient,
) -> None:
    """An SDK caller has no one to ask: the remote server hears a cancel at once (no
    wait, and no failure that toolexec would retry, asking again)."""
    started = time.monotonic()
    result = proxy.call("remote.greet", {})
    assert time.monotonic() - started < 4.0  # the tool's timeout is 5 s: no wait
    assert result.ok, result
    assert result.data == {"result": "no name: cancel"}
    assert result.attempts == 1
