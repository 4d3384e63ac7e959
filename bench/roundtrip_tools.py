"""The worker side of bench/roundtrips.py: a no-op tool and Redis counters of this process.

Imported by the worker (``--tools roundtrip_tools``). When
``TOOLEXEC_BENCH_COUNT_PORT`` names the port of toolexec's state Redis, every
redis-py connection of this process to that port counts what it sends: one
``send_packed_command`` is one round trip (a pipeline sends all its commands
at once); ``send_command`` sends one command and ``pack_commands`` packs a
pipeline's. The broker's connections go to
another port and are not counted, so the figures are toolexec's own.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

import redis.connection

from toolexec import tool
from toolexec.policies import BreakerPolicy, Jitter, RetryBudgetPolicy, RetryPolicy

__all__ = ["bench_counters", "bench_flaky", "bench_noop"]

_PORT = int(os.environ.get("TOOLEXEC_BENCH_COUNT_PORT", "0") or 0)
_counts: Counter[str] = Counter()
_lock = threading.Lock()


def _counted(connection: Any) -> bool:
    return bool(_PORT) and getattr(connection, "port", None) == _PORT


def _count(connection: Any, name: Any) -> None:
    text = name.decode() if isinstance(name, bytes) else str(name)
    with _lock:
        _counts[text.split()[0].upper()] += 1


def _install() -> None:
    cls = redis.connection.AbstractConnection
    send_packed, send, pack_many = cls.send_packed_command, cls.send_command, cls.pack_commands

    def send_packed_counted(self: Any, command: Any, check_health: bool = True) -> None:
        if _counted(self):
            with _lock:
                _counts["round trips"] += 1
        send_packed(self, command, check_health)

    def send_counted(self: Any, *args: Any, **kwargs: Any) -> None:
        if _counted(self) and args:
            _count(self, args[0])
        send(self, *args, **kwargs)

    def pack_many_counted(self: Any, commands: Any) -> Any:
        commands = list(commands)
        if _counted(self):
            for command in commands:
                _count(self, command[0])
        return pack_many(self, commands)

    cls.send_packed_command = send_packed_counted  # type: ignore[method-assign]
    cls.send_command = send_counted  # type: ignore[method-assign]
    cls.pack_commands = pack_many_counted  # type: ignore[method-assign]


if _PORT:
    _install()


@tool(timeout=60, max_attempts=3)
def bench_noop() -> None:
    """Does nothing, so that everything a call costs is toolexec's; it may retry, so the
    retry budget is one of its layers."""


_failed_once: set[str] = set()


@tool(
    timeout=30,
    retry=RetryPolicy(max_attempts=2, base=0.001, jitter=Jitter.NONE),
    # every other attempt fails: a breaker that opens at 60% keeps counting them, closed
    breaker=BreakerPolicy(consecutive_failures=None, failure_rate=0.6),
    # and a budget that allows every call its retry: it is asked, and always says yes
    retry_budget=RetryBudgetPolicy(ratio=1.0, min_retries=1000),
)
def bench_flaky(token: str) -> None:
    """Fails its first attempt for each token with a transient error, then succeeds.

    The retry path: the budget asked, the lease parked, the message sent again.
    """
    with _lock:
        first = token not in _failed_once
        _failed_once.add(token)
    if first:
        raise ConnectionError("the first attempt fails, on purpose")


@tool(timeout=60, max_attempts=1)
def bench_counters() -> dict[str, int]:
    """What this worker process has sent to the state Redis so far."""
    with _lock:
        return dict(_counts)
