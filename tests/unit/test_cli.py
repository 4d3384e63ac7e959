"""The ``toolexec`` command's conventions: version, help, one way to say Redis is unreachable,
and how ``--tools`` finds a module, run as a user runs it (a subprocess)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def _toolexec(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    return subprocess.run(
        [sys.executable, "-m", "toolexec", *args],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version_and_short_help() -> None:
    assert _toolexec("--version").stdout.strip() == f"toolexec {version('toolexec')}"
    helped = _toolexec("-h")
    assert helped.returncode == 0 and "Commands:" in helped.stdout
    worker_help = _toolexec("worker", "-h").stdout
    assert "-l, --loglevel" in worker_help and "Log level of the worker" in worker_help


def test_top_level_help_says_what_faults_and_breakers_change() -> None:
    listing = _toolexec("--help").stdout
    faults = next(line for line in listing.splitlines() if line.strip().startswith("faults"))
    breakers = next(line for line in listing.splitlines() if line.strip().startswith("breakers"))
    assert "Inject failures" in faults
    assert "Trip, reset" in breakers and "fail a tool's calls fast" in breakers


@pytest.mark.parametrize(
    "args",
    [["call", "get_weather", "{}"], ["tools"], ["status"], ["breakers"], ["faults"]],
    ids=lambda args: args[0],
)
def test_every_subcommand_says_redis_is_unreachable_the_same_way(args: list[str]) -> None:
    """Given a Redis URL nobody listens on, each command prints one toolexec line and exits 3."""
    url = _closed_url()
    done = _toolexec(*args, TOOLEXEC_REDIS_URL=url)

    assert done.returncode == 3, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("toolexec: ") and "cannot reach Redis" in lines[0], lines[0]
    assert "Traceback" not in done.stderr and not done.stderr.startswith("Error:")


def test_a_worker_on_a_closed_port_names_the_setting_and_exits_3_after_its_wait() -> None:
    """Given a closed TOOLEXEC_REDIS_URL, the worker says so (no fake ``:**@``) and exits 3."""
    url = _closed_url()
    done = _toolexec("worker", "--connect-wait", "1", TOOLEXEC_REDIS_URL=url)

    assert done.returncode == 3, done
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"toolexec worker: cannot reach Redis at {url} (TOOLEXEC_REDIS_URL)")
    assert "up to 1 s" in first and "exiting with code 3" in first
    assert "gave up" in done.stderr
    assert ":**@" not in done.stderr + done.stdout
    assert "Cannot connect" not in done.stderr  # Celery never got to try


def test_a_missing_tool_module_says_where_it_was_looked_for(tmp_path: Path, redis_url: str) -> None:
    done = _toolexec("worker", "--tools", "nosuchtools", cwd=tmp_path, TOOLEXEC_REDIS_URL=redis_url)

    assert done.returncode == 1, done
    assert f"cannot find tool module 'nosuchtools' in the current directory ({tmp_path})" in (
        done.stderr
    )
    assert "--tools ./mytools.py" in done.stderr


def test_a_tool_module_whose_own_import_fails_says_so(tmp_path: Path, redis_url: str) -> None:
    """Given mytools.py that imports a package that is not installed, the error names that."""
    (tmp_path / "mytools.py").write_text("import not_installed_anywhere\n")

    for spec in ("mytools", "./mytools.py"):
        done = _toolexec("worker", "--tools", spec, cwd=tmp_path, TOOLEXEC_REDIS_URL=redis_url)

        assert done.returncode == 1, done
        assert "tool module 'mytools' was found, but importing it failed" in done.stderr
        assert f"{tmp_path / 'mytools.py'}, line 1" in done.stderr
        assert "No module named 'not_installed_anywhere'" in done.stderr
        assert "Traceback" not in done.stderr and "cannot find" not in done.stderr


def test_a_tools_path_that_does_not_exist_is_named(tmp_path: Path, redis_url: str) -> None:
    done = _toolexec(
        "worker", "--tools", "./nothere.py", cwd=tmp_path, TOOLEXEC_REDIS_URL=redis_url
    )

    assert done.returncode == 1, done
    assert "--tools ./nothere.py: no such Python file or package" in done.stderr
