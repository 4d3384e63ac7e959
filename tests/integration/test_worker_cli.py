"""``toolexec worker`` as a new user starts it: tools from a path, or none at all."""

from __future__ import annotations

import json
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


_PROBE_TOOLS = '''
import json, os, sys
from celery.signals import worker_ready

from toolexec import tool


@tool(queue="probe-a")
def probe() -> str:
    """Says it ran."""
    return "ran"


@worker_ready.connect
def _report(sender, **_):
    loaded = [name for name in ("celery.bin.celery", "click_repl", "prompt_toolkit", "flower")
              if name in sys.modules]
    facts = {
        "loaded": loaded,
        "hostname": sender.hostname,
        "queues": sorted(sender.app.amqp.queues.consume_from),
        "slots": sender.pool.limit,
        "pool": type(sender.pool).__module__,
    }
    with open(os.environ["PROBE_REPORT"], "w") as out:
        json.dump(facts, out)
'''


def test_a_worker_is_built_as_chosen_without_celerys_command_line(
    tmp_path: Path, settings: Settings, worker_env: dict[str, str]
) -> None:
    """toolexec's options reach Celery's Worker directly: no click-repl, prompt_toolkit or
    Flower (a ``celery.commands`` plugin) in a worker process, and the pool, slots, name
    and queues are the ones asked for. Before: ``app.worker_main`` loaded all of them."""
    (tmp_path / "probetools.py").write_text(_PROBE_TOOLS)
    report = tmp_path / "report.json"
    proc = WorkerProcess(
        "probetools",
        {**worker_env, "PROBE_REPORT": str(report)},
        queues=f"probe-a,{settings.default_queue}",
        concurrency=3,
        log_path=tmp_path / "w.log",
        cwd=tmp_path,
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    try:
        with ToolClient(settings) as client:
            result = client.call("probe", {}, timeout=10)
    finally:
        proc.stop()

    facts = json.loads(report.read_text())
    assert result.status == "ok" and result.data == "ran", result
    assert facts["loaded"] == [], facts
    assert facts["hostname"] == proc.hostname
    assert facts["queues"] == sorted(["probe-a", settings.default_queue])
    assert facts["slots"] == 3
    assert facts["pool"] == "celery.concurrency.thread"
