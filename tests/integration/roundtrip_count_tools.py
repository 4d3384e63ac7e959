"""Worker side of test_roundtrips.py: tools, and a count of what a call sends to Redis.

Imported by a worker started with ``-c 1`` on the threads pool. When
``TOOLEXEC_COUNT_PORT`` names the port of toolexec's state server, every
redis-py connection of this process to that port counts its sends per thread:
one ``send_packed_command`` is one round trip (a pipeline sends all its
commands at once; a single command goes through it too). Only the Celery pool's
thread's count is a call's: that is where a call's admission, settlement and answer
run, while the heartbeat, the lease sweeper and the orphan watch have threads of
their own (named ``toolexec-*``) whose periodic sends would blur the count. The
broker is another server, so the consumer's own traffic is not counted either.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

import redis.connection

from toolexec import tool
from toolexec.policies import BreakerPolicy, Jitter, RetryBudgetPolicy, RetryPolicy

__all__ = ["POOL_THREAD", "counted_flaky", "counted_noop", "counted_round_trips"]

_PORT = int(os.environ.get("TOOLEXEC_COUNT_PORT", "0") or 0)
#: Celery's threads pool is a ThreadPoolExecutor: its threads carry this prefix.
POOL_THREAD = "ThreadPoolExecutor"
_trips: Counter[str] = Counter()
_lock = threading.Lock()
_failed_once: set[str] = set()


def _install() -> None:
    cls = redis.connection.AbstractConnection
    send_packed = cls.send_packed_command

    def send_packed_counted(self: Any, command: Any, check_health: bool = True) -> None:
        if getattr(self, "port", None) == _PORT:
            with _lock:
                _trips[threading.current_thread().name] += 1
        send_packed(self, command, check_health)

    cls.send_packed_command = send_packed_counted  # type: ignore[method-assign]


if _PORT:
    _install()


@tool(timeout=30, max_attempts=3)
def counted_noop() -> None:
    """Does nothing, so everything the call sends is toolexec's; it may retry, so the retry
    budget is one of its layers, as for any tool with the default policy."""


@tool(
    timeout=30,
    retry=RetryPolicy(max_attempts=2, base=0.001, jitter=Jitter.NONE),
    # every other attempt fails: a breaker that opens at 60 % keeps counting them, closed
    breaker=BreakerPolicy(consecutive_failures=None, failure_rate=0.6),
    # and a budget that allows every call its retry: it is asked, and always says yes
    retry_budget=RetryBudgetPolicy(ratio=1.0, min_retries=1000),
)
def counted_flaky(token: str) -> None:
    """Fails its first attempt for each token with a transient error, then succeeds."""
    with _lock:
        first = token not in _failed_once
        _failed_once.add(token)
    if first:
        raise ConnectionError("the first attempt fails, on purpose")


@tool(timeout=30, max_attempts=3)
def counted_round_trips() -> dict[str, int]:
    """Round trips sent to the state server so far, by the name of the thread that sent them.

    It has the no-op's layers, so its own settlement and the next one's admission
    cost what a no-op's do: the test subtracts a pair of reads with nothing between.
    """
    with _lock:
        return dict(_trips)
