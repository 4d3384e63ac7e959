"""Flower's start-up list of registered tasks names the tools the workers published."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from integration_support import closed_port

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration


def test_flower_lists_the_published_tool_tasks_at_start(
    settings: Settings, worker: WorkerProcess, tmp_path: Path
) -> None:
    """Given a worker that published tooldefs' tools, Flower's banner lists tools.<name>."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")},
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
    }
    if settings.broker_url:
        env["TOOLEXEC_BROKER_URL"] = settings.broker_url
    log = tmp_path / "flower.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "flower", "--port", str(closed_port())],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        end = time.monotonic() + 30
        while "Registered tasks" not in log.read_text() and time.monotonic() < end:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        time.sleep(0.2)  # the list follows its heading in the same log record
        text = log.read_text()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)

    listed = text.split("Registered tasks", 1)[1]
    names = set(re.findall(r"'([\w.]+)'", listed))
    assert {"tools.pause", "tools.record", "tools.http_request", "toolexec.fallback"} <= names, text
