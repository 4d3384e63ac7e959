"""Fallback chains end to end: real workers, real Redis, a scripted failing service.

The tools (tests/fallback_tools.py) run on a worker of this module's own, on
a queue nobody else consumes. Hits at the FlakyServer show which step of a
chain ran; the worker's log shows that each step was a Celery task of its own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fallback_tools import INSTEAD, QUEUE

from toolexec.breaker import CircuitBreaker
from toolexec.client import ToolClient
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.replies import ReplyBox
from toolexec.stores.stats import CallStats, ToolStats
from toolexec.testing import FlakyServer, Reply, WorkerProcess
from toolexec.worker.app import create_app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def worker_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fallback") / "worker.log"


@pytest.fixture(scope="module")
def fallback_worker(
    settings: Settings, worker_env: dict[str, str], worker_log: Path
) -> Iterator[WorkerProcess]:
    proc = WorkerProcess(
        "fallback_tools", worker_env, queues=QUEUE, concurrency=8, log_path=worker_log
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tx(settings: Settings, fallback_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


def _urls(flaky: FlakyServer, main: Reply, lite: Reply) -> tuple[str, str]:
    return (
        flaky.script(flaky.unique_path("forecast"), main),
        flaky.script(flaky.unique_path("forecast-lite"), lite),
    )


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def _hits(flaky: FlakyServer, url: str) -> int:
    return len(flaky.hits(_path(url)))


def _tried(result: ToolResult) -> list[tuple[str, str]]:
    assert result.fallback is not None, result
    return [(note.source, note.outcome) for note in result.fallback.tried]


def test_a_primary_out_of_retries_is_answered_by_its_alternative_as_celery_tasks(
    tx: ToolClient, flaky: FlakyServer, worker_log: Path
) -> None:
    # given a forecast service that keeps failing and a healthy lite one
    main, lite = _urls(flaky, Reply(503), Reply(200, {"today": "sun"}))
    call_id = uuid.uuid4().hex

    # when the agent asks for a forecast
    result = tx.call(
        "forecast", {"city": "Oslo", "url": main, "lite_url": lite}, timeout=20, call_id=call_id
    )

    # then the lite variant answers, marked degraded, with the primary's error kept
    assert result.ok and result.degraded and result.source == "forecast_lite", result
    assert result.data == {"today": "sun"} and result.call_id == call_id
    assert result.fallback is not None and result.fallback.primary_error.type == "unavailable"
    assert result.for_model()["fallback"]["primary_error"]["type"] == "unavailable"
    assert (_hits(flaky, main), _hits(flaky, lite)) == (2, 1)
    # and each step ran as its own task, the chain start on the primary's queue
    log = worker_log.read_text()
    assert f"tools.forecast[{call_id}] received" in log
    assert f"toolexec.fallback[{call_id}-fb1] received" in log
    assert f"tools.forecast_lite[{call_id}-fb2] received" in log
    # and no step of it is left counted as running (toolexec status)
    running = [
        m for b in range(tx.keys.buckets) for m in tx.redis.zrange(tx.keys.in_flight(b), 0, -1)
    ]
    assert not [member for member in running if call_id in member]


def test_when_the_alternative_fails_too_the_last_good_result_answers_with_its_age(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a forecast for Bergen that succeeded once
    main, lite = _urls(flaky, Reply(200, {"temp": 7}), Reply(200))
    arguments = {"city": "Bergen", "url": main, "lite_url": lite}
    first = tx.call("forecast", arguments, timeout=20)
    assert first.ok and not first.degraded

    # when both the service and its lite variant fail
    flaky.script(_path(main), Reply(503))
    flaky.script(_path(lite), Reply(503))
    second = tx.call("forecast", arguments, timeout=20)

    # then the stored result comes back with its age, after the lite variant was tried
    assert second.ok and second.degraded and second.source == "cache", second
    assert second.data == {"temp": 7}
    assert second.fallback is not None and second.fallback.age_s is not None
    assert 0 < second.fallback.age_s < 20
    assert _tried(second) == [("forecast_lite", "failed")]
    assert (_hits(flaky, main), _hits(flaky, lite)) == (2, 2)


def test_with_nothing_cached_the_explanation_tells_the_model_what_to_do(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a city never forecast before, and both services failing
    main, lite = _urls(flaky, Reply(503), Reply(502))

    # when the agent asks
    result = tx.call("forecast", {"city": "Tromsø", "url": main, "lite_url": lite}, timeout=20)

    # then every step was tried in order and the explanation is the answer
    assert result.status == "error" and result.degraded and result.source == "explanation"
    assert result.error is not None and result.error.suggestion == INSTEAD
    assert result.error.type == "unavailable"
    assert _tried(result) == [("forecast_lite", "failed"), ("cache", "miss")]
    assert INSTEAD in result.content()


def test_invalid_arguments_go_back_to_the_model_without_any_fallback(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a service that rejects the request as malformed (400)
    main, lite = _urls(flaky, Reply(400, {"error": "unknown city"}), Reply(200))

    # when the agent asks
    result = tx.call("forecast", {"city": "Atlantis", "url": main, "lite_url": lite}, timeout=20)

    # then the model sees its own mistake, and no fallback step ran
    assert result.error is not None and result.error.type == ErrorType.INVALID_ARGUMENTS
    assert not result.degraded and result.source is None and result.fallback is None
    assert (_hits(flaky, main), _hits(flaky, lite)) == (1, 0)


def test_an_alternative_that_would_overrun_the_deadline_is_skipped(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a failing service whose alternative needs 5 s, and a caller with 3 s
    main, lite = _urls(flaky, Reply(503), Reply(200))

    # when the agent asks
    result = tx.call("forecast_hurried", {"city": "Oslo", "url": main, "lite_url": lite}, timeout=3)

    # then the alternative was skipped for the deadline, and the default explanation answered
    assert result.source == "explanation" and result.degraded, result
    assert _tried(result) == [("forecast_slow_lite", "skipped"), ("cache", "miss")]
    assert result.fallback is not None
    assert result.fallback.tried[0].reason.startswith("deadline: needs 5.0 s")
    assert _hits(flaky, lite) == 0
    assert result.elapsed_ms < 3000


def test_while_the_breaker_is_open_the_client_starts_the_chain_without_the_primary(
    tx: ToolClient, flaky: FlakyServer, worker_log: Path
) -> None:
    # given forecast_guarded's breaker opened by two failures (each answered by the chain)
    main, lite = _urls(flaky, Reply(503), Reply(200, {"today": "rain"}))
    arguments = {"city": "Oslo", "url": main, "lite_url": lite}
    for _ in range(2):
        assert tx.call("forecast_guarded", arguments, timeout=20).source == "forecast_lite"
    assert _hits(flaky, main) == 2

    # when the agent calls it again
    call_id = uuid.uuid4().hex
    result = tx.call("forecast_guarded", arguments, timeout=20, call_id=call_id)

    # then the chain answered with circuit_open as the primary's error, and the primary never ran
    assert result.ok and result.source == "forecast_lite" and result.data == {"today": "rain"}
    assert result.fallback is not None
    assert result.fallback.primary_error.type == ErrorType.CIRCUIT_OPEN
    assert result.fallback.primary_attempts == 0
    assert _hits(flaky, main) == 2 and _hits(flaky, lite) == 3
    log = worker_log.read_text()
    assert f"toolexec.fallback[{call_id}] received" in log
    assert f"tools.forecast_guarded[{call_id}]" not in log


def test_a_breaker_open_at_the_worker_starts_the_chain_there(
    tx: ToolClient, flaky: FlakyServer, settings: Settings
) -> None:
    # given forecast_guarded's breaker held open by an operator
    breakers = CircuitBreaker(tx.redis, Keys(settings.key_prefix))
    breakers.trip("forecast_guarded", 60)
    main, lite = _urls(flaky, Reply(200), Reply(200, {"today": "fog"}))
    now = time.time()
    ctx = CallContext(uuid.uuid4().hex, "forecast_guarded", now + 20, now, uuid.uuid4().hex)

    # when a producer that skipped the client's pre-check sends a call to the worker
    producer = create_app(settings)
    arguments = {"city": "Oslo", "url": main, "lite_url": lite}
    producer.send_task(
        "tools.forecast_guarded",
        kwargs={"arguments": arguments, "context": ctx.to_json()},
        task_id=ctx.call_id,
        queue=QUEUE,
    )
    box = ReplyBox(tx.keys, ctx.reply_to, [ctx.call_id])
    box.collect(tx.redis, wait=20)
    producer.close()

    # then the worker's refusal started the chain, and the answer came to the same reply list
    result = box.results[ctx.call_id]
    assert result.ok and result.source == "forecast_lite" and result.data == {"today": "fog"}
    assert result.fallback is not None and result.fallback.primary_error.type == "circuit_open"
    assert (_hits(flaky, main), _hits(flaky, lite)) == (0, 1)


def test_a_call_with_an_idempotency_key_is_still_answered_by_its_alternative(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a failing forecast service and a healthy lite one
    main, lite = _urls(flaky, Reply(503), Reply(200, {"today": "hail"}))
    arguments = {"city": "Oslo", "url": main, "lite_url": lite}

    # when the agent calls with an idempotency key (the primary's, not the alternative's)
    key = uuid.uuid4().hex
    result = tx.call("forecast", arguments, timeout=20, idempotency_key=key)

    # then the alternative ran under a key of its own and answered
    assert result.ok and result.source == "forecast_lite" and result.data == {"today": "hail"}
    assert (_hits(flaky, main), _hits(flaky, lite)) == (2, 1)

    # and the caller's key still names the primary's call: a repeat is no mismatch
    again = tx.call("forecast", arguments, timeout=20, idempotency_key=key)
    assert again.ok and again.source == "forecast_lite", again


def _joined_while_running(
    tx: ToolClient,
    tool: str,
    arguments: dict[str, str],
    key: str | None,
    others: int,
    running: Callable[[], bool],
) -> list[ToolResult]:
    """The first call, then ``others`` identical ones once the first is running."""
    first = tx.submit(tool, arguments, timeout=20, idempotency_key=key)
    # the primary's request has reached its service, which answers after 1.5 s: the others
    # find it in flight and join it
    end = time.monotonic() + 10
    while not running():
        assert time.monotonic() < end, "the first call never reached its service"
        time.sleep(0.02)
    rest = [tx.submit(tool, arguments, timeout=20, idempotency_key=key) for _ in range(others)]
    return [first.result(), *(handle.result() for handle in rest)]


def test_coalesced_calls_that_joined_get_the_same_degraded_answer_as_the_one_that_ran(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a shared read whose service fails slowly, and a healthy lite variant
    main, lite = _urls(flaky, Reply(503, delay=1.5), Reply(200, {"today": "rain"}))
    arguments = {"city": "Tromso", "url": main, "lite_url": lite}

    # when three identical calls are in flight at once
    first, *joined = _joined_while_running(
        tx, "forecast_shared", arguments, None, 2, lambda: _hits(flaky, main) == 1
    )

    # then the primary ran once, and every caller got the lite variant's degraded answer
    assert _hits(flaky, main) == 1 and _hits(flaky, lite) == 1
    assert first.ok and first.degraded and first.source == "forecast_lite", first
    for result in joined:
        assert result.ok and result.degraded and result.source == "forecast_lite", result
        assert result.data == first.data == {"today": "rain"}
        assert result.fallback is not None and result.fallback.primary_error.type == "unavailable"
    assert len({r.call_id for r in (first, *joined)}) == 3


def test_duplicates_of_a_failing_write_get_the_same_explanation_as_the_call_that_ran(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    # given a write whose service fails slowly, called three times with one idempotency key
    url = flaky.script(flaky.unique_path("alert"), Reply(503, delay=1.5))
    key = uuid.uuid4().hex

    # when the duplicates arrive while the first is running
    first, *joined = _joined_while_running(
        tx, "post_alert", {"city": "Oslo", "url": url}, key, 2, lambda: _hits(flaky, url) == 1
    )

    # then the write was attempted once and every caller got the degraded explanation
    assert _hits(flaky, url) == 1
    assert first.degraded and first.source == "explanation", first
    for result in joined:
        assert result.status == first.status and result.degraded, result
        assert result.source == "explanation" and result.error == first.error
    assert len({r.call_id for r in (first, *joined)}) == 3


def test_status_counts_a_call_its_fallback_answered_as_a_degraded_call(
    tx: ToolClient, flaky: FlakyServer
) -> None:
    """Given forecast failing twice and forecast_lite answering, ``toolexec status`` counts
    one forecast call, ok and degraded (answered by its fallback), from two attempts of
    which one was a retry; not zero calls and a retry rate of 100%."""
    stats = CallStats(tx.redis, tx.keys)
    before = stats.window(5).get("forecast", ToolStats(tool="forecast"))
    main, lite = _urls(flaky, Reply(503), Reply(200, {"today": "sun"}))

    result = tx.call("forecast", {"city": "Oslo", "url": main, "lite_url": lite}, timeout=20)
    after = stats.window(5)["forecast"]

    assert result.ok and result.degraded, result
    assert (after.calls - before.calls, after.ok - before.ok) == (1, 1)
    assert after.degraded - before.degraded == 1
    assert (after.attempts - before.attempts, after.retries - before.retries) == (2, 1)
    lite = stats.window(5)["forecast_lite"]
    assert lite.attempts >= 1 and lite.calls == 0  # its attempt, not a call of its own
