"""The fairness modules' own worker: it imports ``fairness_tools`` and serves its queue only."""

from __future__ import annotations

import os
from pathlib import Path

from fairness_tools import QUEUE

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess


def fairness_worker(
    worker_env: dict[str, str], settings: Settings, log_dir: Path, concurrency: int
) -> WorkerProcess:
    """Started, with ``concurrency`` slots; the caller stops it."""
    here = str(Path(__file__).parent)
    env = {**worker_env, "PYTHONPATH": os.pathsep.join([here, worker_env["PYTHONPATH"]])}
    proc = WorkerProcess(
        "fairness_tools",
        env,
        queues=QUEUE,
        concurrency=concurrency,
        log_path=log_dir / "worker.log",
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc
