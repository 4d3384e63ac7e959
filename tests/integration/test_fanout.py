"""Many calls at once: call_many, submit and the asyncio forms run calls in parallel.

The shared worker has 32 thread slots, so N calls of ``pause(0.3)`` take about
0.3 s, not N x 0.3 s. Bounds are at most half the serial time, generous for a
loaded 2-core machine but far from what serial execution could meet.
"""

from __future__ import annotations

import asyncio

import pytest
from integration_support import timed

from toolexec.client import ToolClient
from toolexec.errors import ErrorType

pytestmark = pytest.mark.integration


def test_call_many_runs_calls_in_parallel_and_keeps_their_order(client: ToolClient) -> None:
    """Given 20 pauses of ~0.3 s, the earliest call the slowest, results come back in call order."""
    durations = [round(0.3 + 0.01 * (19 - i), 2) for i in range(20)]
    calls = [("pause", {"seconds": s}) for s in durations]

    results, took = timed(client.call_many, calls, timeout=20)

    assert [r.status for r in results] == ["ok"] * 20
    assert [r.data for r in results] == durations
    assert len({r.call_id for r in results}) == 20
    assert took < 2.0  # serially: more than 7 s


def test_call_many_gives_each_call_of_a_mixed_batch_its_own_result(client: ToolClient) -> None:
    """Given valid, invalid and unknown calls in one batch, each result sits at its call's index."""
    calls = [
        ("pause", {"seconds": 0.2}),
        ("pause", {"seconds": "long"}),
        ("no_such_tool", {}),
        ("pause", '{"seconds": 0.01}'),
        ("crash", {"message": "boom"}),
        ("record", "{not json"),
    ]

    results = client.call_many(calls, timeout=20)

    assert [r.tool for r in results] == [name for name, _ in calls]
    assert [r.error.type if r.error else r.status for r in results] == [
        "ok",
        ErrorType.INVALID_ARGUMENTS,
        ErrorType.UNKNOWN_TOOL,
        "ok",
        ErrorType.TOOL_ERROR,
        ErrorType.INVALID_ARGUMENTS,
    ]
    assert (results[0].data, results[3].data) == (0.2, 0.01)


def test_submit_returns_at_once_and_the_handle_gives_the_result(client: ToolClient) -> None:
    """Given a 1 s tool, submit returns long before it ends; result() waits for it."""
    handle, submitting = timed(client.submit, "pause", {"seconds": 1.0}, timeout=20)
    result, waiting = timed(handle.result)

    assert submitting < 0.5
    assert result.status == "ok"
    assert result.data == 1.0
    assert result.call_id == handle.call_id
    assert submitting + waiting >= 1.0
    assert handle.result() is result  # asking again does not wait again


def test_acall_returns_the_result_under_asyncio(client: ToolClient) -> None:
    """Given an event loop, acall gives the same typed result as call."""
    result = asyncio.run(client.acall("pause", {"seconds": 0.05}, timeout=20))

    assert result.status == "ok"
    assert result.data == 0.05
    assert result.attempts == 1


def test_acall_many_runs_calls_in_parallel_under_asyncio(client: ToolClient) -> None:
    """Given 10 pauses of 0.6 s awaited together, they take about 0.6 s, not 6 s."""
    calls = [("pause", {"seconds": 0.6 + i / 1000}) for i in range(10)]

    results, took = timed(asyncio.run, client.acall_many(calls, timeout=20))

    assert [r.data for r in results] == [0.6 + i / 1000 for i in range(10)]
    assert took < 2.0  # serially: 6 s


def test_concurrent_acalls_share_one_event_loop(client: ToolClient) -> None:
    """Given 5 acalls gathered on one loop, waiting for one does not block the others.

    Pauses of 1.2 s: with 0.3 s and a bound of 1.0 s, five calls' own costs on a loaded
    Redis Cluster run (RabbitMQ broker) took 1.09 s; what is checked is that the waits
    overlap, so the waits are long beside those costs.
    """

    async def gathered() -> list[float]:
        results = await asyncio.gather(
            *(client.acall("pause", {"seconds": 1.2}, timeout=20) for _ in range(5))
        )
        return [r.data for r in results]

    data, took = timed(asyncio.run, gathered())

    assert data == [1.2] * 5
    assert took < 2.4  # serially: 6 s
