"""What the idempotency integration tests share: order arguments, workers, records."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from toolexec.keys import Keys
from toolexec.settings import Settings
from toolexec.testing import Ledger, WorkerProcess

#: Leases and sweeps of the workers these tests start: short, so takeovers are quick.
LEASE_S = 2.0
SWEEP_S = 0.25


def order_arguments(
    ledger: Ledger, order_id: str, amount: float = 10.0, **extra: Any
) -> dict[str, Any]:
    """Arguments of the order tools in ``idempotency_tools``, writing to ``ledger``."""
    return {"order_id": order_id, "amount": amount, "ledger": ledger.url, **extra}


def idem_env(worker_env: dict[str, str]) -> dict[str, str]:
    return {
        **worker_env,
        "TOOLEXEC_IDEMPOTENCY_LEASE_S": str(LEASE_S),
        "TOOLEXEC_IDEMPOTENCY_SWEEP_S": str(SWEEP_S),
    }


def start_worker(
    env: dict[str, str], settings: Settings, log: Path, *, queues: str, concurrency: int
) -> WorkerProcess:
    proc = WorkerProcess(
        "idempotency_tools", env, queues=queues, concurrency=concurrency, log_path=log
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


def signal_worker(proc: WorkerProcess, sig: signal.Signals) -> None:
    """Send ``sig`` to the worker's whole process group (SIGSTOP pauses, SIGCONT resumes)."""
    assert proc.process is not None
    os.killpg(proc.process.pid, sig)


def record_of(client: redis.Redis, keys: Keys, call_id: str) -> dict[str, str]:
    """The idempotency record some call of ``call_id`` owns (or last owned)."""
    for key in client.scan_iter(match=f"{keys.prefix}:idem:*"):
        if client.type(key) != "hash":
            continue  # the lease index, the token counter, waiters
        record: dict[str, str] = client.hgetall(key)
        if record.get("call") == call_id:
            return record
    return {}


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"
