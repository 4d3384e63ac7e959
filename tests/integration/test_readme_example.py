"""The README's example runs as written: its tools module on a real worker, its agent script
in a process of its own, and the output it shows is the output it prints.

The tutorial (docs/tutorial.md) repeats the same two files, so they are checked to be the
same text as the README's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", markdown, re.M | re.S)


def _file(markdown: str, first_line: str) -> str:
    found = [b for b in _blocks(markdown, "python") if b.startswith(first_line)]
    assert len(found) == 1, f"one python block starting {first_line!r}, found {len(found)}"
    return found[0]


def _output(markdown: str) -> str:
    """The text block the tools example prints (the README's agent prints another)."""
    found = [b for b in _blocks(markdown, "text") if b.startswith("tools: ")]
    assert len(found) == 1, f"one text block starting 'tools: ', found {len(found)}"
    return found[0]


README = (ROOT / "README.md").read_text(encoding="utf-8")
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
TOOLS = _file(README, "# mytools.py")
AGENT = _file(README, "# agent.py")


def test_the_tutorial_shows_the_readmes_example() -> None:
    assert _file(TUTORIAL, "# mytools.py") == TOOLS
    assert _file(TUTORIAL, "# agent.py") == AGENT
    assert _output(README) == _output(TUTORIAL)


def test_the_example_imports_only_public_modules() -> None:
    public = {"toolexec", "toolexec.fallback", "toolexec.testing"}
    imported = re.findall(r"^\s*(?:from|import) (toolexec[\w.]*)", TOOLS + AGENT, re.M)
    assert imported and set(imported) <= public, imported


def test_the_readme_example_runs_and_prints_what_the_readme_shows(
    settings: Settings, worker_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS, encoding="utf-8")
    (tmp_path / "agent.py").write_text(AGENT, encoding="utf-8")
    tag = uuid.uuid4().hex[:8]
    env = {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": f"readme-{tag}",
        "TOOLEXEC_DEFAULT_QUEUE": f"readme-{tag}",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # mytools comes from the cwd
    }
    proc = WorkerProcess(
        "mytools", env, queues=env["TOOLEXEC_DEFAULT_QUEUE"], log_path=tmp_path / "w.log",
        cwd=tmp_path,
    )
    proc.start(settings.redis_url or "", env["TOOLEXEC_KEY_PREFIX"])
    try:
        done = subprocess.run(
            [sys.executable, "agent.py"],
            env={**os.environ, **env, "PYTHONIOENCODING": "utf-8"},
            cwd=tmp_path,
            capture_output=True,
            encoding="utf-8",
            timeout=90,
            check=False,
        )
    finally:
        proc.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    assert printed == _output(README).splitlines(), done.stdout
    wrong = json.loads(printed[3])
    assert (wrong["status"], wrong["error"]["type"]) == ("error", "invalid_arguments")


def test_the_readmes_agent_is_the_tested_pydantic_ai_example() -> None:
    """The README's first example is examples/pydantic_ai.py, which
    tests/integration/test_agent_frameworks.py runs offline; only the lines that keep
    the example's own file name from shadowing the package differ."""
    readme = _file(README, "# weather_agent.py").split("\n", 1)[1]
    example = (ROOT / "examples" / "pydantic_ai.py").read_text(encoding="utf-8")
    kept = [
        line
        for line in example.split("\n")[1:]  # the docstring line: the README says it in prose
        if line != "import sys" and not line.startswith(("HERE = ", "sys.path[:]"))
    ]
    assert readme == "\n".join(kept)
