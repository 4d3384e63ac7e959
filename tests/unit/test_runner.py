"""The runner's reusable body threads: reused, never waited for, limit still enforced."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from toolexec.errors import ToolTimeoutError
from toolexec.pipeline.runner import Runner, _BodyThreads


def _ident() -> int:
    return threading.get_ident()


def _wait_until(condition: object, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.005)


def test_a_body_thread_serves_the_next_call_once_its_body_returned() -> None:
    threads = _BodyThreads()
    runner = Runner(threads)
    first = runner.run(_ident, {}, 5.0)
    _wait_until(lambda: threads.idle() == 1)
    assert runner.run(_ident, {}, 5.0) == first
    assert first != threading.get_ident()


def test_a_stuck_body_is_abandoned_on_time_and_the_next_call_does_not_wait_for_it() -> None:
    release = threading.Event()
    runner = Runner(_BodyThreads(max_idle=1))
    start = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        runner.run(release.wait, {"timeout": 30}, 0.2)
    assert time.monotonic() - start < 2.0
    assert runner.abandoned == 1
    # the stuck thread still holds its body; the next call gets a thread of its own
    assert runner.run(lambda: "ran", {}, 5.0) == "ran"
    release.set()


def test_a_body_error_reaches_the_caller_and_the_thread_goes_on() -> None:
    threads = _BodyThreads()
    runner = Runner(threads)

    def fail() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        runner.run(fail, {}, 5.0)
    _wait_until(lambda: threads.idle() == 1)
    assert runner.run(lambda x: x * 2, {"x": 21}, 5.0) == 42


def test_idle_threads_beyond_the_cap_or_the_idle_time_exit() -> None:
    threads = _BodyThreads(max_idle=2, idle_s=0.2)
    runner = Runner(threads)
    gate = threading.Barrier(4)
    callers = [
        threading.Thread(target=runner.run, args=(gate.wait, {"timeout": 5}, 5.0))
        for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    gate.wait(timeout=5)
    for caller in callers:
        caller.join(5)
    _wait_until(lambda: threads.idle() == 2)  # the third exited instead of idling
    _wait_until(lambda: threads.idle() == 0)  # and the two left after their idle time


_SPAN: contextvars.ContextVar[str] = contextvars.ContextVar("span", default="none")


def test_a_reused_thread_runs_each_body_in_its_callers_context() -> None:
    threads = _BodyThreads()
    runner = Runner(threads)
    seen = []
    for span in ("first", "second"):
        token = _SPAN.set(span)
        try:
            seen.append(runner.run(_SPAN.get, {}, 5.0))
        finally:
            _SPAN.reset(token)
        _wait_until(lambda: threads.idle() == 1)
    assert seen == ["first", "second"]


def test_a_limit_already_spent_times_out_at_once() -> None:
    release = threading.Event()
    with pytest.raises(ToolTimeoutError):
        Runner().run(release.wait, {"timeout": 5}, -0.5)
    release.set()
