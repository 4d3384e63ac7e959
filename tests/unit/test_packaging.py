"""The one ``toolexec`` namespace: every source folder is packaged under it, and the
thin client does not drag the operator tools in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"executor": "toolexec", "tasks": "toolexec.tasks", "fallback": "toolexec.fallback"}


def _packaged() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(config["tool"]["setuptools"]["packages"])


def _source_packages() -> set[str]:
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_folder_with_an_init_is_packaged() -> None:
    """A new subpackage missing from pyproject.toml would vanish from a wheel."""
    assert _source_packages() == _packaged()


def test_the_folders_map_onto_the_one_namespace() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["package-dir"] == {v: k for k, v in FOLDERS.items()}


def test_a_users_tasks_py_does_not_shadow_toolexec(tmp_path: Path) -> None:
    """Celery projects name their own module tasks.py; ours is toolexec.tasks."""
    for name in ("tasks", "fallback", "executor"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('user module imported')\n")
    code = "import toolexec.tasks, toolexec.fallback, toolexec.worker.app; print('ok')"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


#: What the ``ops`` extra carries: an agent process that only calls tools imports none.
OPERATOR_MODULES = ("flower", "rich", "click", "prometheus_client")

_REPORT = "import json, sys; print(json.dumps([m for m in {mods!r} if m in sys.modules]))"


def _operator_modules_after(code: str, env: dict[str, str] | None = None) -> list[str]:
    script = code + "\n" + _REPORT.format(mods=OPERATOR_MODULES)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_importing_toolexec_leaves_the_operator_tools_out() -> None:
    code = "import toolexec\nfrom toolexec import ToolClient, ToolResult, tool"
    assert _operator_modules_after(code) == []


def test_a_tool_client_call_leaves_the_operator_tools_out(worker_env: dict[str, str]) -> None:
    """A real call (answered by the client itself: no worker publishes this tool, or no
    worker published anything yet when this test runs alone).

    Celery is imported to publish, and Celery itself imports click
    (``celery.exceptions``), so click is the one module of the list a call may
    bring; flower, rich and prometheus_client must not come with it.
    """
    code = (
        "from toolexec import ToolClient\n"
        "with ToolClient.from_env() as client:\n"
        "    result = client.call('no_such_tool_for_thin_client', {'q': 1}, timeout=5)\n"
        "    kind = result.error.type if result.error is not None else None\n"
        "    assert kind in ('unknown_tool', 'no_worker'), result\n"
        "    client.call_many([('no_such_tool_for_thin_client', {})], timeout=5)\n"
    )
    env = {**os.environ, **worker_env}
    assert set(_operator_modules_after(code, env)) <= {"click"}


def test_the_console_script_says_how_to_get_the_ops_extra() -> None:
    """Without the extra the command explains itself instead of raising a traceback."""
    code = (
        "import sys\n"
        "sys.modules['flower'] = None  # as if the ops extra were not installed\n"
        "sys.argv = ['toolexec', '--help']\n"
        "from toolexec.__main__ import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 1
    assert "pip install 'toolexec[ops]'" in done.stderr and "flower" in done.stderr
    assert "Traceback" not in done.stderr
