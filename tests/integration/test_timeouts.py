"""Time limits end to end: a tool past its limit yields ``timeout``, on time, on the threads pool.

Celery's threads pool enforces no time limit (docs/background.md, Celery), so these prove the
executor's own: the result must arrive within timeout x attempts plus a small
slack even though the tool itself would run for 10 s.
"""

from __future__ import annotations

import pytest
from integration_support import timed

from toolexec.client import ToolClient
from toolexec.errors import ErrorType

pytestmark = pytest.mark.integration

#: Queueing, retry publication and reply delivery on a loaded 2-core machine.
SLACK_S = 1.5


def test_sync_tool_that_ignores_cancellation_times_out_on_time(client: ToolClient) -> None:
    """Given ``stubborn`` (limit 0.5 s, 2 attempts) asked to sleep 10 s, timeout comes in ~1 s."""
    result, took = timed(client.call, "stubborn", {"seconds": 10}, timeout=20)

    assert result.error is not None
    assert result.error.type == ErrorType.TIMEOUT
    assert result.error.details == {"limit_s": 0.5}
    assert result.attempts == 2
    assert 0.5 * 2 <= took < 0.5 * 2 + SLACK_S, result


def test_async_tool_is_cancelled_at_its_limit(client: ToolClient) -> None:
    """Given ``async_sleep`` (limit 0.5 s, 1 attempt) asked to sleep 10 s, timeout in ~0.5 s."""
    result, took = timed(client.call, "async_sleep", {"seconds": 10}, timeout=20)

    assert result.error is not None
    assert result.error.type == ErrorType.TIMEOUT
    assert result.attempts == 1
    assert 0.5 <= took < 0.5 + SLACK_S, result


def test_tool_within_its_limit_is_not_cut_short(client: ToolClient) -> None:
    """Given the same tools asked for less than their limit, both finish normally."""
    sync = client.call("stubborn", {"seconds": 0.1}, timeout=20)
    coro = client.call("async_sleep", {"seconds": 0.1}, timeout=20)

    assert (sync.status, sync.data) == ("ok", "woke up")
    assert (coro.status, coro.data) == ("ok", "slept")
