"""A tool's returned stream is read only up to its result limit (issue 22, item 6).

The executor runs real tools from a private registry on the real Runner; time is
a ManualClock. Each stream counts what it handed out, so the tests see how far it
was read, not how long that took.
"""

from __future__ import annotations

import io
import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest

from toolexec.clock import ManualClock
from toolexec.context import CallContext
from toolexec.errors import ErrorType, ResultTooLargeError
from toolexec.pipeline.execution import Executor, Final
from toolexec.pipeline.runner import Runner
from toolexec.pipeline.streams import bounded_body, drained
from toolexec.registry import Registry, ToolSpec, tool


class Endless:
    """A generator for ever, counting the items drawn and whether it was closed."""

    def __init__(self) -> None:
        self.drawn = 0
        self.closed = False

    def __call__(self) -> Iterator[int]:
        try:
            for number in itertools.count(1_000_000):
                self.drawn += 1
                yield number
        finally:
            self.closed = True


def test_an_endless_generator_is_read_only_to_the_limit() -> None:
    stream = Endless()

    with pytest.raises(ResultTooLargeError) as refused:
        drained(stream(), 10_000)

    # "1000000," is 8 characters: the limit holds 1 249 of them, and one more is read
    assert stream.drawn == 1_250
    assert stream.closed
    assert refused.value.details["limit_bytes"] == 10_000


def test_a_stream_under_the_limit_becomes_its_items() -> None:
    assert drained(iter([{"a": 1}, (2, 3)]), 100) == [{"a": 1}, [2, 3]]
    assert drained(map(str, range(3)), 100) == ["0", "1", "2"]
    assert drained(io.StringIO("one\ntwo\n"), 100) == ["one\n", "two\n"]


@pytest.mark.parametrize("value", ["text", b"bytes", [1, 2], {"k": "v"}, 5, None])
def test_other_values_pass_untouched(value: Any) -> None:
    assert drained(value, 1) is value


def test_an_async_tool_is_left_to_the_event_loop() -> None:
    async def fetch() -> int:
        return 1

    assert bounded_body(fetch, 10) is fetch


def _ctx(clock: ManualClock, spec: ToolSpec) -> CallContext:
    return CallContext(
        call_id="c-1",
        tool=spec.name,
        deadline=clock.now() + 60,
        submitted_at=clock.now(),
        reply_to="reply-1",
    )


def test_the_executor_answers_result_too_large_for_an_endless_stream(
    registry: Registry, clock: ManualClock
) -> None:
    stream = Endless()

    def endless() -> Any:
        return stream()

    tool(registry=registry, max_attempts=1)(endless)
    spec = registry.get("endless")
    assert spec is not None
    executor = Executor(
        runner=Runner(), clock=clock, rng=random.Random(1), result_limit=lambda spec: 50_000
    )

    verdict = executor.attempt(spec, {}, _ctx(clock, spec), attempt=1)

    assert isinstance(verdict, Final)
    assert verdict.result.error is not None
    assert verdict.result.error.type == ErrorType.RESULT_TOO_LARGE
    assert stream.drawn == 50_000 // 8 and stream.closed
