"""``toolexec mcp`` driven by clients no one here wrote: the official MCP SDK and the Inspector.

Every test talks to a real ``toolexec mcp`` process (stdio, or streamable HTTP on
loopback) in front of real workers; the FlakyServer scripts what the tools meet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_support import free_port, mcp_http_process, stdio_params, with_client

from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

FAST = {"TOOLEXEC_MCP_CATALOG_POLL_S": "0.3", "TOOLEXEC_MCP_PROGRESS_S": "0.2"}


@pytest.fixture(scope="module")
def front_worker(
    settings: Settings,
    worker_env: dict[str, str],
    worker: WorkerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """The worker for the MCP-only tools; tests read its log to see a call end."""
    log = tmp_path_factory.mktemp("mcp-front") / "worker.log"
    proc = WorkerProcess("mcp_front_tools", worker_env, queues="mcp_front", log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def front_env(worker_env: dict[str, str], front_worker: WorkerProcess) -> dict[str, str]:
    """The environment of a ``toolexec mcp`` process, with a worker for the MCP-only tools."""
    return {**worker_env, **FAST}


def _log_of(proc: WorkerProcess) -> str:
    assert proc.log_path is not None
    return proc.log_path.read_text(errors="replace")


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


def _wait_for(
    check: Callable[[], bool], timeout: float, what: str, log: Path | None = None
) -> None:
    end = time.monotonic() + timeout
    while not check():
        tail = _text(log)[-3000:] if log is not None else ""
        assert time.monotonic() < end, f"{what}: not within {timeout} s\n{tail}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def http_url(front_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("mcp-http") / "mcp.log"
    with mcp_http_process(front_env, log) as url:
        yield url


@pytest.fixture(params=["http", "stdio"])
def server(request: pytest.FixtureRequest, front_env: dict[str, str]) -> Any:
    """Each transport in turn: the URL of the HTTP front, or the command of a stdio one."""
    if request.param == "http":
        return request.getfixturevalue("http_url")
    return stdio_params(front_env)


def text_of(result: types.CallToolResult) -> dict[str, Any]:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    body: dict[str, Any] = json.loads(block.text)
    return body


# -- both transports ----------------------------------------------------------------


def test_tools_list_comes_from_the_catalog(server: Any) -> None:
    async def body(client: Client) -> types.ListToolsResult:
        return await client.list_tools()

    listed = {tool.name: tool for tool in with_client(server, body).tools}
    fetch = listed["fetch"]
    assert fetch.input_schema["required"] == ["url"]
    assert fetch.description and "GET a URL" in fetch.description
    assert fetch.annotations is not None and fetch.annotations.read_only_hint is True
    assert fetch.output_schema is not None and "status" in fetch.output_schema["properties"]
    assert "allOf" not in fetch.output_schema  # returns an httpx.Response: no data schema
    post_note = listed["post_note"].output_schema  # -> dict[str, str]
    assert post_note is not None
    assert post_note["allOf"][0]["then"]["properties"]["data"] == {
        "additionalProperties": {"type": "string"},
        "type": "object",
    }
    writer = listed["post_note"].annotations
    assert writer is not None
    assert (writer.read_only_hint, writer.destructive_hint, writer.idempotent_hint) == (
        False,
        True,
        True,
    )
    assert "read_payload" in listed


def test_a_call_succeeds_with_the_openai_rendering_as_text(server: Any, flaky: FlakyServer) -> None:
    url = flaky.script(flaky.unique_path("mcp-ok"), Reply(200, {"temp": 21}))

    async def body(client: Client) -> types.CallToolResult:
        return await client.call_tool("fetch", {"url": url})

    result = with_client(server, body)
    assert result.is_error is False
    assert text_of(result) == {"status": "ok", "data": {"temp": 21}}
    # what the model reads, not the call record; that is in _meta
    assert result.structured_content == {"status": "ok", "data": {"temp": 21}}
    assert result.meta is not None
    assert result.meta["toolexec/result"]["tool"] == "fetch"
    assert result.meta["toolexec/result"]["attempts"] == 1


def test_a_404_is_an_error_result(server: Any, flaky: FlakyServer) -> None:
    url = flaky.script(flaky.unique_path("mcp-404"), Reply(404, {"detail": "no such city"}))

    async def body(client: Client) -> types.CallToolResult:
        return await client.call_tool("fetch", {"url": url})

    result = with_client(server, body)
    assert result.is_error is True
    assert text_of(result)["error"]["type"] == "not_found"
    assert result.structured_content is not None
    assert result.structured_content["error"]["type"] == "not_found"


def test_503_503_200_ends_ok_through_toolexec_retries(server: Any, flaky: FlakyServer) -> None:
    path = flaky.unique_path("mcp-flaky")
    url = flaky.script(path, Reply(503), Reply(503), Reply(200, {"ok": "third time"}))

    async def body(client: Client) -> types.CallToolResult:
        return await client.call_tool("fetch", {"url": url})

    result = with_client(server, body)
    assert result.is_error is False
    assert text_of(result)["data"] == {"ok": "third time"}
    assert result.meta is not None and result.meta["toolexec/result"]["attempts"] == 3
    assert len(flaky.hits(path)) == 3


def test_invalid_arguments_name_the_field(server: Any, flaky: FlakyServer) -> None:
    path = flaky.unique_path("mcp-invalid")
    url = flaky.script(path, Reply(200))

    async def body(client: Client) -> types.CallToolResult:
        return await client.call_tool("record", {"url": url, "count": "three"})

    result = with_client(server, body)
    assert result.is_error is True
    error = text_of(result)["error"]
    assert error["type"] == "invalid_arguments"
    assert "count" in error["message"]
    assert flaky.hits(path) == []


# -- HTTP: what only a long-lived front shows ---------------------------------------------


def test_an_offloaded_result_says_so_and_read_payload_pages_through_it(http_url: str) -> None:
    async def body(client: Client) -> tuple[types.CallToolResult, types.CallToolResult]:
        big = await client.call_tool("numbered_lines", {"lines": 5000})
        meta = big.meta or {}
        key = meta["toolexec/payload"]["key"]
        page = await client.call_tool("read_payload", {"key": key, "offset": 10, "limit": 3})
        return big, page

    big, page = with_client(http_url, body)
    assert big.is_error is False
    assert big.structured_content is not None and big.structured_content["payload"]["key"]
    assert big.meta is not None and big.meta["toolexec/payload"]["read_with"] == "read_payload"
    assert page.is_error is False
    assert page.structured_content is not None
    assert page.structured_content["lines"] == [
        f"line {i:05d} of a long report" for i in (10, 11, 12)
    ]


def test_a_stored_payload_is_a_resource_read_page_by_page(http_url: str) -> None:
    """The same page as read_payload's, through resources/read (toolexec://payload/KEY)."""

    async def body(client: Client) -> tuple[Any, Any, list[str]]:
        big = await client.call_tool("numbered_lines", {"lines": 5000})
        key = (big.meta or {})["toolexec/payload"]["key"]
        page = await client.read_resource(f"toolexec://payload/{key}?offset=10&limit=3")
        templates = await client.list_resource_templates()
        try:
            await client.read_resource("toolexec://payload/no-such-key")
            missing = None
        except MCPError as exc:
            missing = exc.code
        return page, missing, [t.uri_template for t in templates.resource_templates]

    page, missing, templates = with_client(http_url, body)
    body_read = json.loads(page.contents[0].text)
    assert body_read["lines"] == [f"line {i:05d} of a long report" for i in (10, 11, 12)]
    assert missing == -32002
    assert "toolexec://payload/{key}{?offset,limit}" in templates


def test_progress_is_reported_while_a_call_waits_on_retries(
    http_url: str, flaky: FlakyServer
) -> None:
    """Three slow 503s, then 200: the ticks (every 0.2 s) see attempts run and wait between."""
    path = flaky.unique_path("mcp-progress")
    slow_503 = Reply(503, delay=0.4)
    url = flaky.script(path, slow_503, slow_503, slow_503, Reply(200, {"done": True}))
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def body(client: Client) -> types.CallToolResult:
        return await client.call_tool("fetch_patiently", {"url": url}, progress_callback=progress)

    result = with_client(http_url, body)
    assert result.is_error is False
    assert seen, "no progress notification arrived during ~2 s of attempts and backoff"
    assert all(total is not None and 0 < done <= total for done, total, _ in seen)
    messages = [message or "" for _, _, message in seen]
    assert all(m.startswith("fetch_patiently: ") for m in messages)
    assert any(" running (" in m for m in messages), messages
    assert any("failed, waiting to try again" in m for m in messages), messages


def test_cancelling_a_call_stops_its_retries(
    http_url: str, flaky: FlakyServer, worker: WorkerProcess
) -> None:
    """The client gives up after 1 s; without the cancellation 10 attempts would follow.

    The cancellation revokes the call's id: the worker discards the retry that comes after
    the attempt in flight (Celery logs it). Once it has, no message of the call is left, so
    the hits counted then are all there will be."""
    path = flaky.unique_path("mcp-cancel")
    url = flaky.script(path, Reply(503))
    discarded = "Discarding revoked task: tools.fetch_patiently["
    before = _log_of(worker).count(discarded)

    async def body(client: Client) -> None:
        with pytest.raises(MCPError):
            await client.call_tool("fetch_patiently", {"url": url}, read_timeout_seconds=1.0)

    with_client(http_url, body)
    at_cancel = len(flaky.hits(path))
    _wait_for(
        lambda: _log_of(worker).count(discarded) > before,
        15,
        "the revoked retry dropped",
        worker.log_path,
    )
    after = len(flaky.hits(path))
    assert after <= at_cancel + 1, (at_cancel, after)  # at most the attempt in flight
    assert after < 10


def test_list_changed_is_sent_when_a_worker_adds_tools(
    http_url: str,
    settings: Settings,
    worker_env: dict[str, str],
    tmp_path: Path,
) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    late = WorkerProcess(
        "mcp_late_tools", worker_env, queues="mcp_late", log_path=tmp_path / "l.log"
    )

    async def body(client: Client) -> list[str]:
        await client.list_tools()
        await anyio.to_thread.run_sync(late.start, settings.redis_url or "", settings.key_prefix)
        with anyio.fail_after(15):
            await changed.wait()
        return [tool.name for tool in (await client.list_tools()).tools]

    try:
        names = with_client(http_url, body, message_handler=on_message, mode="legacy")
    finally:
        late.stop()
    assert "mcp_late_probe" in names


# -- HTTP security ------------------------------------------------------------------


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def test_a_foreign_origin_is_refused(http_url: str) -> None:
    refused = httpx.post(
        http_url, json=INITIALIZE, headers={**HEADERS, "origin": "http://evil.example"}
    )
    assert refused.status_code == 403
    allowed = httpx.post(
        http_url, json=INITIALIZE, headers={**HEADERS, "origin": "http://127.0.0.1:3000"}
    )
    assert allowed.status_code == 200


def test_an_oversized_request_is_refused_with_413(http_url: str) -> None:
    body = {**INITIALIZE, "params": {**INITIALIZE["params"], "padding": "x" * 2_000_000}}  # type: ignore[dict-item]
    response = httpx.post(http_url, json=body, headers=HEADERS)
    assert response.status_code == 413
    assert "too large" in response.text


def test_a_bearer_token_is_required_when_set(front_env: dict[str, str], tmp_path: Path) -> None:
    env = {**front_env, "TOOLEXEC_MCP_TOKEN": "s3cret-token"}
    with mcp_http_process(env, tmp_path / "mcp.log") as url:
        assert httpx.post(url, json=INITIALIZE, headers=HEADERS).status_code == 401
        wrong = {**HEADERS, "authorization": "Bearer nope"}
        assert httpx.post(url, json=INITIALIZE, headers=wrong).status_code == 401

        async def body() -> list[str]:
            http = httpx2.AsyncClient(headers={"authorization": "Bearer s3cret-token"})
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                return [tool.name for tool in (await client.list_tools()).tools]

        assert "fetch" in anyio.run(body)
    assert "s3cret-token" not in (tmp_path / "mcp.log").read_text()


def test_binding_beyond_loopback_without_a_token_is_refused(front_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolexec", "mcp", "--http", f"0.0.0.0:{free_port()}"],
        env={**os.environ, **front_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "TOOLEXEC_MCP_TOKEN" in done.stderr


# -- the MCP Inspector -------------------------------------------------------------


INSPECTOR_CACHE = Path(
    os.environ.get("TOOLEXEC_TEST_NPM_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolexec-tests"
)


def _inspector() -> Path:
    """The Inspector CLI, installed once from the npm registry into a reusable cache.

    npm installs into a folder of its own that is renamed into place only once the
    install finished, so an interrupted or concurrent install never leaves a half-filled
    cache that later runs would take for a whole one.
    """
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the MCP Inspector CLI cannot run")
    prefix = INSPECTOR_CACHE / "inspector-v2"
    cli = prefix / "node_modules" / ".bin" / "mcp-inspector"
    if not (prefix / "installed").exists():
        INSPECTOR_CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="inspector-", dir=INSPECTOR_CACHE))
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "@modelcontextprotocol/inspector"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0 or not (staging / "node_modules" / ".bin").exists():
            shutil.rmtree(staging, ignore_errors=True)
            pytest.skip(f"could not install @modelcontextprotocol/inspector: {done.stderr[-500:]}")
        (staging / "installed").touch()
        try:
            staging.rename(prefix)
        except OSError:  # another run put a whole install in place first
            shutil.rmtree(staging, ignore_errors=True)
    return cli


def test_the_mcp_inspector_lists_and_calls_tools(http_url: str, flaky: FlakyServer) -> None:
    cli = _inspector()
    listed = subprocess.run(
        [str(cli), "--cli", http_url, "--transport", "http", "--method", "tools/list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"fetch", "read_payload"} <= names

    path = flaky.unique_path("mcp-inspector")
    url = flaky.script(path, Reply(503), Reply(200, {"via": "inspector"}))
    called = subprocess.run(
        [
            str(cli),
            "--cli",
            http_url,
            "--transport",
            "http",
            "--method",
            "tools/call",
            "--tool-name",
            "fetch",
            "--tool-arg",
            f"url={url}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert called.returncode == 0, called.stderr[-2000:]
    result = json.loads(called.stdout)
    assert result.get("isError") is not True
    assert json.loads(result["content"][0]["text"])["data"] == {"via": "inspector"}
    assert len(flaky.hits(path)) == 2


def test_a_cancelled_write_ends_unknown(
    front_env: dict[str, str], flaky: FlakyServer, tmp_path: Path, front_worker: WorkerProcess
) -> None:
    """Cancelled while its write is in flight: the outcome recorded is ``unknown``, as at a
    deadline, and the write is not made again."""
    path = flaky.unique_path("mcp-cancel-write")
    url = flaky.script(path, Reply(200, {"ok": True}, delay=2.0))
    log = tmp_path / "mcp.log"

    async def body(client: Client) -> None:
        with pytest.raises(MCPError):
            await client.call_tool(
                "post_note", {"url": url, "note": "hello"}, read_timeout_seconds=0.7
            )

    with mcp_http_process(front_env, log) as front:
        with_client(front, body)
        end = time.monotonic() + 10
        while "cancelled by the MCP client" not in log.read_text() and time.monotonic() < end:
            time.sleep(0.05)
    pattern = r"call (\S+) of post_note cancelled by the MCP client: unknown"
    cancelled = re.search(pattern, _text(log))
    assert cancelled is not None, _text(log)[-3000:]
    # the attempt in flight completes (the worker logs the call's outcome); a write that
    # succeeded is not tried again, so no attempt can follow it
    ended = f"call {cancelled.group(1)} tool=post_note "
    _wait_for(
        lambda: ended in _log_of(front_worker),
        15,
        "the attempt in flight to end",
        front_worker.log_path,
    )
    assert len(flaky.hits(path)) == 1
