"""examples/trace_one_call.py prints the trace of a call retried twice (docs/ops/monitoring.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolexec.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trace_one_call.py"


def test_the_trace_example_prints_three_attempts_and_two_backoffs(
    settings: Settings, tmp_path: Path
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_DATA_DIR": str(tmp_path),
        "PYTHONIOENCODING": "utf-8",
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].endswith("ok after 3 attempts")
    attempts = [x for x in lines if "execute_tool http_request [consumer, worker]" in x]
    assert [f"toolexec.attempt={n}" in x for n, x in enumerate(attempts, 1)] == [True] * 3
    assert sum("backoff delay_s=" in x for x in lines) == 2
    assert sum("GET [client, worker]" in x for x in lines) == 3
    assert any(x.startswith("└─ toolexec.call http_request [client, agent]") for x in lines)
