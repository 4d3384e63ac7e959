"""examples/agent_loop.py runs end to end with its scripted model and passes its own checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolexec.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_loop.py"


def test_the_agent_loop_example_shows_retries_a_fallback_chain_a_nudge_a_disable_and_an_abort(
    settings: Settings, tmp_path: Path
) -> None:
    """Given no API key, when the example runs, its scripted run shows every layer and exits 0."""
    env = {
        **os.environ,
        "TOOLEXEC_REDIS_URL": settings.redis_url or "",
        "TOOLEXEC_DATA_DIR": str(tmp_path),
        "PYTHONIOENCODING": "utf-8",
    }
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        env.pop(key, None)

    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )

    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "scripted model (no network)" in out
    for check in ("✓ retries", "✓ fallback", "✓ nudge", "✓ disable", "✓ abort", "✓ the model"):
        assert check in out
    assert "answered by the fallback weather_mirror" in out
    assert "-> tool_disabled: query_order is disabled" in out
    assert "-> run_aborted: the run was stopped because it is stuck" in out
