"""Redis killed while a worker records a failed call: the records are made once it is back.

The tool (``chaos_fail`` in bench/chaos_tools.py) fails its first attempt, and
its last waits in the ledger for the test's go: the test kills toolexec's
Redis first, so the worker finds it gone when it answers and records. Redis
comes back within the call's deadline; the answer arrives, and the breaker,
the retry budget and the stats each show the call exactly once.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from toolexec.breaker import CircuitBreaker
from toolexec.chaos import Rig, wait_until
from toolexec.keys import Keys
from toolexec.stats import CallStats

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(120)]


def _logged(built: Rig, text: str) -> bool:
    path = built.workers[0].log_path
    return path is not None and text in path.read_text(errors="replace")


def test_records_of_a_failed_call_survive_a_redis_restart_once(make_rig: object) -> None:
    key = uuid.uuid4().hex
    with make_rig() as built:  # type: ignore[operator]
        assert built.ledger is not None
        ledger = redis.Redis.from_url(built.ledger.url, decode_responses=True)
        handle = built.tool_client.submit("chaos_fail", {"key": key}, timeout=30)
        assert wait_until(lambda: ledger.exists(f"chaos:last:{key}") == 1, 20)

        built.servers[0].kill()  # the last attempt runs; Redis goes before its records
        ledger.rpush(f"chaos:go:{key}", "go")
        assert wait_until(lambda: _logged(built, f"call {handle.call_id}: Redis unreachable"), 20)
        built.servers[0].start()  # well within the call's 30 s

        result = handle.result()
        assert result.error is not None and result.error.type == "unavailable", result
        assert result.attempts == 2, result
        assert wait_until(lambda: _logged(built, f"call {handle.call_id}: wrote "), 20)

        state = redis.Redis.from_url(built.redis_url, decode_responses=True)
        keys = Keys()
        view = CircuitBreaker(state, keys).snapshot("chaos_fail")
        assert (view.calls, view.failures, view.consecutive) == (1, 1, 1), view
        # 10 tokens; the first attempt's failure took one before its retry, the last one
        # (the held write) one more: 8, not 7 (counted twice) nor 9 (lost)
        assert float(state.hget(keys.budget("chaos_fail"), "tokens") or 0) == 8.0
        stats = CallStats(state, keys).window(5)["chaos_fail"]
        assert (stats.calls, dict(stats.failed)) == (1, {"unavailable": 1}), stats
        assert (stats.attempts, stats.retries, stats.in_flight) == (2, 1, 0), stats
        assert not _logged(built, "gave up writing")
