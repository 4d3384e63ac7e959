"""``toolexec worker`` as a new user starts it: tools from a path, or none at all."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration


def test_tools_given_as_a_path_are_served(
    tmp_path: Path, settings: Settings, worker_env: dict[str, str]
) -> None:
    """Given --tools ./elsewhere/mytools.py, the worker imports it and serves its tool."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "pathtools.py").write_text(
        textwrap.dedent(
            '''
            from toolexec import tool

            @tool(queue="pathtools")
            def shout(text: str) -> str:
                """Upper-cases the text."""
                return text.upper()
            '''
        )
    )
    proc = WorkerProcess(
        "./elsewhere/pathtools.py", worker_env, log_path=tmp_path / "w.log", cwd=tmp_path
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    try:
        with ToolClient(settings) as client:
            result = client.call("shout", {"text": "hi"}, timeout=10)
    finally:
        proc.stop()

    assert result.status == "ok" and result.data == "HI", result


def test_a_worker_without_tools_says_it_serves_only_the_built_in_ones(
    tmp_path: Path, settings: Settings, worker_env: dict[str, str]
) -> None:
    log = tmp_path / "bare.log"
    proc = WorkerProcess("", worker_env, queues="bare-worker", log_path=log, cwd=tmp_path)
    proc.start(settings.redis_url or "", settings.key_prefix)
    proc.stop()

    assert "serving only the built-in tools (http_request)" in log.read_text()
