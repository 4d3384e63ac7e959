"""An agent's process loads no worker pipeline (issue 23, item 2), checked in fresh processes.

``make lint`` checks the import graph statically (pyproject.toml's import-linter
contracts); this checks what really lands in ``sys.modules``, which also sees
what a library imports on toolexec's behalf (Celery's Django fix-up imports
``celery.worker`` whenever an app is built) and imports made inside functions.
The worker pipeline is the list in pyproject.toml's "agent" contract, read from
there so the two checks cannot drift apart; docs/architecture.md, Boundaries,
says why each is in it.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import toolexec
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]


def _contract(contract_id: str) -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (found,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == contract_id]
    return dict(found)


#: What only a worker runs: toolexec's worker side and attempt pipeline, and the ops extra.
WORKER_PIPELINE = tuple(str(m) for m in _contract("agent")["forbidden_modules"])

#: Celery's own worker: an agent's process sends with Celery, it never runs a worker.
CELERY_WORKER = ("celery.worker", "celery.apps", "celery.bootsteps", "celery.concurrency")

#: What ``import toolexec`` must not load at all: declaring tools and reading results
#: needs no broker.
BROKER = ("celery", "kombu", "toolexec.worker.app")

_LOADED = """
import json, sys
{body}
print(json.dumps(sorted(sys.modules)))
"""

_CALL = """
from toolexec import ToolClient, Settings
with ToolClient(Settings.model_validate_json(sys.argv[1])) as client:
    result = client.call("pause", {"seconds": 0}, timeout=20)
assert result.ok, result
"""


def _loaded(body: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED.format(body=body), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _under(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == r or m.startswith(r + ".") for r in roots))


def test_the_worker_pipeline_list_names_real_modules() -> None:
    """A misspelt entry would forbid nothing: each toolexec entry must exist."""
    own = [m for m in WORKER_PIPELINE if m.startswith("toolexec.")]
    modules = _loaded(f"import importlib\nfor m in {own!r}: importlib.import_module(m)")

    assert set(own) <= set(modules)
    assert (
        "toolexec.pipeline.execution" in WORKER_PIPELINE and "toolexec.transport" in WORKER_PIPELINE
    )


def test_import_toolexec_loads_no_broker_and_no_worker_pipeline() -> None:
    """Given a fresh process, when it imports toolexec, then neither Celery nor kombu nor
    anything only a worker runs is loaded."""
    modules = _loaded("import toolexec")

    assert "toolexec.client.sdk" in modules  # the probe saw the import
    assert _under(modules, WORKER_PIPELINE + CELERY_WORKER + BROKER) == []


def test_a_client_call_loads_celerys_sending_side_only(
    settings: Settings, worker: WorkerProcess
) -> None:
    """Given a worker, when a fresh process builds a ToolClient and makes one real call,
    then it has loaded Celery's app and kombu's transport to send, and nothing of the
    worker pipeline, toolexec's transport subclass or Celery's worker."""
    modules = _loaded(_CALL, settings.model_dump_json())

    assert {"toolexec.worker.app", "celery.app.base", "kombu.transport.redis"} <= set(modules)
    assert _under(modules, WORKER_PIPELINE + CELERY_WORKER) == []


def test_a_worker_does_load_the_pipeline_the_client_must_not() -> None:
    """The check can fail: the worker's side imports what the list forbids the client."""
    modules = _loaded("import toolexec.tasks")

    assert {
        "toolexec.tasks.runtime",
        "toolexec.pipeline.execution",
        "toolexec.pipeline.observe",
    } <= set(modules)
    assert "prometheus_client" not in modules  # metrics come with toolexec worker (ops)


def test_every_module_is_on_a_side_of_the_core_contract() -> None:
    """A new module must be placed: in the core, or among what the core may not import."""
    core = _contract("core")
    sides = (*core["source_modules"], *core["forbidden_modules"])
    modules = [info.name for info in pkgutil.walk_packages(toolexec.__path__, prefix="toolexec.")]

    assert len(modules) > 100
    assert _under(modules, tuple(sides)) == sorted(modules)
