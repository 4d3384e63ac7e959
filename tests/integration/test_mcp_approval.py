"""Human approval across the queue: ``@tool(approval=...)`` through ``toolexec mcp``.

An MCP client's user approves or denies by elicitation (worker → Redis → front →
client → back); an operator with ``toolexec approvals``. A call waiting for a
decision is parked in the queue, so a worker SIGKILLed meanwhile loses nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp_support import mcp_http_process

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ran_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("approval") / "ran.log"
    path.touch()
    return path


@pytest.fixture(scope="module")
def approval_env(worker_env: dict[str, str], ran_log: Path) -> dict[str, str]:
    return {**worker_env, "TOOLEXEC_TEST_APPROVAL_LOG": str(ran_log)}


def _worker(settings: Settings, env: dict[str, str], log: Path) -> WorkerProcess:
    proc = WorkerProcess("mcp_approval_tools", env, queues="mcp_approval", log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


@pytest.fixture(scope="module")
def approval_worker(
    settings: Settings, approval_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    """The worker (a list: the crash test replaces it)."""
    logs = tmp_path_factory.mktemp("approval-worker")
    procs = [_worker(settings, approval_env, logs / "worker-0.log")]
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="module")
def url(
    approval_env: dict[str, str],
    approval_worker: list[WorkerProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("approval-front") / "front.log"
    with mcp_http_process(approval_env, log) as found:
        yield found


def _call(url: str, tool: str, arguments: dict[str, Any], **options: Any) -> types.CallToolResult:
    async def main() -> types.CallToolResult:
        async with Client(url, mode="legacy", **options) as client:
            return await client.call_tool(tool, arguments)

    return anyio.run(main)


def _ran(path: Path) -> list[str]:
    return path.read_text().split()


def _answering(action: str, approve: bool | None = None) -> tuple[list[str], Callable[..., Any]]:
    asked: list[str] = []

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        content = None if approve is None else {"approve": approve, "reason": "test"}
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return asked, on_elicit


def test_the_clients_user_approves_and_the_call_runs_once(url: str, ran_log: Path) -> None:
    asked, on_elicit = _answering("accept", approve=True)
    result = _call(
        url, "transfer", {"amount": 5, "note": "approved-1"}, elicitation_callback=on_elicit
    )
    assert not result.is_error, result.structured_content
    assert result.structured_content["data"] == "sent 5"
    assert asked == ["Send the transfer?"]
    assert _ran(ran_log).count("approved-1") == 1


def test_a_denial_is_a_typed_outcome_and_nothing_runs(url: str, ran_log: Path) -> None:
    _, on_elicit = _answering("decline")
    result = _call(
        url, "transfer", {"amount": 6, "note": "denied-1"}, elicitation_callback=on_elicit
    )
    assert result.is_error
    assert result.structured_content["error"]["type"] == "approval_denied"
    assert "denied-1" not in _ran(ran_log)


def test_no_decision_in_time_is_approval_timeout(url: str, ran_log: Path) -> None:
    started = time.monotonic()
    result = _call(url, "quick_transfer", {"note": "timeout-1"})  # no one can answer
    assert result.structured_content["error"]["type"] == "approval_timeout"
    assert time.monotonic() - started < 15
    assert "timeout-1" not in _ran(ran_log)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolexec", "approvals", *args],
        env={**__import__("os").environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _waiting(env: dict[str, str], tool: str) -> list[dict[str, Any]]:
    listed = _cli(env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    lines = [json.loads(line) for line in listed.stdout.splitlines() if line.startswith("{")]
    return [entry for entry in lines if entry["tool"] == tool]


def test_an_operator_approves_after_the_worker_was_killed(
    url: str,
    ran_log: Path,
    settings: Settings,
    approval_env: dict[str, str],
    approval_worker: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    answer: list[types.CallToolResult] = []
    caller = threading.Thread(
        target=lambda: answer.append(_call(url, "transfer", {"amount": 7, "note": "crash-1"}))
    )
    caller.start()
    end = time.monotonic() + 30
    while not (found := _waiting(approval_env, "transfer")):
        assert time.monotonic() < end, "the call never showed up as waiting for approval"
        time.sleep(0.2)
    approval_worker[0].kill()  # SIGKILL while the call is parked
    approval_worker.append(_worker(settings, approval_env, tmp_path / "worker-1.log"))
    approved = _cli(approval_env, "approve", found[0]["call_id"], "--reason", "ok")
    assert approved.returncode == 0, approved.stderr
    again = _cli(approval_env, "deny", found[0]["call_id"])
    assert again.returncode != 0 and "no call" in again.stderr  # decided: no longer waiting
    caller.join(60)
    assert answer and not answer[0].is_error, answer and answer[0].structured_content
    assert _ran(ran_log).count("crash-1") == 1
