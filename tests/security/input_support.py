"""What the hostile-input security tests share: a worker of their own, isolated.

It has its own key prefix and queue, so a setting it runs with (a low
Retry-After cap, a small result limit) cannot change what the suite's shared
worker does, and no call of the shared client lands on it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``check()`` once it is truthy, or its last value after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not (found := check()) and time.monotonic() < end:
        time.sleep(0.05)
    return found


@contextmanager
def isolated_worker(
    settings: Settings,
    worker_env: dict[str, str],
    log_dir: Path,
    tools: str = "hostile_input_tools",
    **extra_env: str,
) -> Iterator[tuple[WorkerProcess, ToolClient]]:
    """A worker with ``extra_env`` (``TOOLEXEC_*`` names) and a client that reaches only it."""
    prefix = f"sec-{uuid.uuid4().hex[:8]}"
    queue = f"q-{prefix}"
    env = {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": prefix,
        "TOOLEXEC_DEFAULT_QUEUE": queue,
        **extra_env,
    }
    proc = WorkerProcess(tools, env, queues=queue, concurrency=8, log_path=log_dir / "worker.log")
    proc.start(settings.redis_url or "", prefix)
    own = settings.model_copy(update={"key_prefix": prefix, "default_queue": queue})
    try:
        with ToolClient(own) as client:
            yield proc, client
    finally:
        proc.stop()
