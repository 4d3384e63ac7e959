"""The one ``toolexec`` namespace: every source folder is packaged under it, and the
thin client does not drag the operator tools in."""

from __future__ import annotations

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
    code = "import toolexec.tasks, toolexec.fallback, toolexec.app; print('ok')"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr
