"""Fallback chains without Celery: declaring them, caching last good results, each step's decision.

The chain's decisions come back as actions (a message to send, a result to
deliver), so every branch is checked here on a real Redis with a ManualClock;
tests/integration/test_fallback.py runs the same chains through real workers.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from toolexec.breaker import CircuitBreaker
from toolexec.clock import ManualClock
from toolexec.context import CallContext
from toolexec.errors import ConfigurationError, ErrorType, UnavailableError
from toolexec.fallback import Alternative, Explain, LastGood
from toolexec.fallback.cache import LastGoodCache, LastGoodLayer
from toolexec.fallback.chain import ChainRunner, Deliver, Send
from toolexec.fallback.state import FALLBACK_TASK, ChainState, falls_back
from toolexec.fallback.steps import check_chain, complete_chain
from toolexec.keys import Keys
from toolexec.pipeline.execution import Executor, Final, Verdict, error_info, error_result
from toolexec.redaction import Secret
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.results import ErrorInfo, StepNote, ToolResult

INSTEAD = "Say the forecast is unavailable and suggest checking a weather site."
CACHE = LastGood(ttl_s=600)


def _lite_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"place": arguments["city"]}


@pytest.fixture
def tools(registry: Registry) -> Registry:
    """forecast -> forecast_lite (simpler arguments) -> cache -> explanation."""

    @tool(
        registry=registry,
        queue="weather",
        timeout=10,
        fallbacks=[
            Alternative("forecast_lite", arguments=_lite_arguments),
            CACHE,
            Explain(instead=INSTEAD),
        ],
    )
    def forecast(city: str, days: int = 3) -> dict[str, Any]:
        """A detailed forecast."""
        return {"city": city, "days": days}

    @tool(registry=registry, timeout=4)
    def forecast_lite(place: str) -> dict[str, Any]:
        """Today only."""
        return {"place": place}

    @tool(registry=registry)
    def no_chain(city: str) -> str:
        """A tool without fallbacks."""
        return city

    return registry


@pytest.fixture
def cache(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> LastGoodCache:
    return LastGoodCache(rdb, keys, clock)


@pytest.fixture
def breakers(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(rdb, keys, clock=clock)


@pytest.fixture
def runner(
    tools: Registry, breakers: CircuitBreaker, cache: LastGoodCache, clock: ManualClock
) -> ChainRunner:
    published: dict[str, dict[str, Any]] = {}
    return ChainRunner(tools, published.get, breakers, cache, clock, "tools")


def _spec(registry: Registry, name: str) -> ToolSpec:
    spec = registry.get(name)
    assert spec is not None
    return spec


def _ctx(clock: ManualClock, tool: str = "forecast", deadline_in: float = 30.0) -> CallContext:
    return CallContext(
        call_id="call-1",
        tool=tool,
        deadline=clock.now() + deadline_in,
        submitted_at=clock.now(),
        reply_to="reply-1",
        run_id="run-1",
    )


def _failed(ctx: CallContext, kind: ErrorType = ErrorType.UNAVAILABLE) -> ToolResult:
    info = ErrorInfo(type=kind, message="HTTP 503 from the weather service", retryable=True)
    return error_result(ctx, info, attempts=3, now=ctx.submitted_at + 2)


def _started(runner: ChainRunner, tools: Registry, ctx: CallContext) -> Send:
    """The toolexec.fallback message sent once forecast has failed for good."""
    arguments = {"city": "Oslo"}
    action = runner.after_final(_spec(tools, "forecast"), arguments, ctx, _failed(ctx))
    assert isinstance(action, Send) and action.task == FALLBACK_TASK
    return action


def _advance(runner: ChainRunner, message: Send) -> Any:
    """What toolexec.fallback does with ``message``."""
    return runner.advance(
        CallContext.from_json(message.kwargs["context"]), message.kwargs["arguments"]
    )


def _delivered(action: Any) -> ToolResult:
    assert isinstance(action, Deliver), action
    return action.result


def _sent(action: Any) -> Send:
    assert isinstance(action, Send), action
    return action


# -- declaring a chain ---------------------------------------------------------


def test_an_explanation_anywhere_but_last_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="Explain ends a chain"):
        check_chain("forecast", [Explain(), Alternative("forecast_lite")])


def test_a_tool_cannot_fall_back_to_itself_or_use_two_caches() -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_chain("forecast", [Alternative("forecast"), LastGood(), LastGood()])
    assert "cannot fall back to itself" in str(caught.value)
    assert "at most one LastGood" in str(caught.value)


def test_a_tool_with_side_effects_cannot_answer_from_a_cache(registry: Registry) -> None:
    with pytest.raises(ConfigurationError, match="side effects"):

        @tool(registry=registry, side_effects=True, fallbacks=[LastGood()])
        def send_mail(to: str) -> None:
            """Writes."""


def test_something_that_is_not_a_step_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="is not a fallback step"):
        check_chain("forecast", ["forecast_lite"])


def test_a_chain_without_an_explanation_gets_the_default_one() -> None:
    chain = complete_chain([Alternative("forecast_lite")])
    assert isinstance(chain[-1], Explain) and "Continue without this tool" in chain[-1].instead
    declared = (LastGood(), Explain(instead=INSTEAD))
    assert complete_chain(declared) == declared


def test_the_catalog_describes_the_chain_so_a_client_can_start_it(tools: Registry) -> None:
    entry = _spec(tools, "forecast").catalog_entry("tools")
    assert entry["policy"]["fallbacks"] == [
        {"kind": "tool", "tool": "forecast_lite", "maps_arguments": True, "needs_s": None},
        {"kind": "cache", "ttl_s": 600},
        {"kind": "explain", "instead": INSTEAD},
    ]
    assert _spec(tools, "no_chain").catalog_entry("tools")["policy"]["fallbacks"] == []


def test_a_registry_call_sets_a_chain_and_tells_the_listeners(tools: Registry) -> None:
    seen: list[ToolSpec] = []
    tools.subscribe(seen.append)
    seen.clear()
    updated = tools.set_fallbacks("no_chain", [Alternative("forecast_lite")])
    assert [s.name for s in seen] == ["no_chain"] and seen[0] is updated
    assert _spec(tools, "no_chain").policy.fallbacks == (Alternative("forecast_lite"),)


def test_setting_the_chain_of_an_unknown_tool_says_to_declare_it_first(registry: Registry) -> None:
    with pytest.raises(ConfigurationError, match="declare it with @tool"):
        registry.set_fallbacks("nope", [LastGood()])


@pytest.mark.parametrize(
    "kind",
    [
        ErrorType.INVALID_ARGUMENTS,
        ErrorType.NOT_FOUND,
        ErrorType.UNAUTHORIZED,
        ErrorType.FORBIDDEN,
        ErrorType.CLIENT_ERROR,
        ErrorType.UNKNOWN_TOOL,
    ],
)
def test_agent_fixable_errors_never_fall_back(kind: ErrorType) -> None:
    assert not falls_back(ErrorInfo(type=kind, message="fix your call"))


@pytest.mark.parametrize(
    "kind",
    [
        ErrorType.UNAVAILABLE,
        ErrorType.TIMEOUT,
        ErrorType.RATE_LIMITED,
        ErrorType.CIRCUIT_OPEN,
        ErrorType.DEADLINE_EXCEEDED,
        ErrorType.TOOL_ERROR,
    ],
)
def test_failures_the_model_cannot_fix_fall_back(kind: ErrorType) -> None:
    assert falls_back(ErrorInfo(type=kind, message="the tool cannot answer"))


def test_chain_state_survives_the_trip_through_a_message(clock: ManualClock) -> None:
    info = ErrorInfo(type=ErrorType.CIRCUIT_OPEN, message="open", retry_after=3.0)
    state = ChainState.begin("forecast", "weather", info, 0, {"city": "Oslo"}).noted(
        StepNote(source="forecast_lite", outcome="skipped", reason="deadline")
    )
    ctx = CallContext(
        call_id="c", tool="forecast", deadline=1.0, submitted_at=0.0, reply_to="r",
        fallback=state.at(2).sent(),
    )  # fmt: skip
    back = CallContext.from_json(json.loads(json.dumps(ctx.to_json())))
    assert back.fallback == state.at(2).sent()


# -- the last good result ------------------------------------------------------


def test_a_stored_result_comes_back_with_its_age(cache: LastGoodCache, clock: ManualClock) -> None:
    cache.store("forecast", {"city": "Oslo", "days": 3}, CACHE, {"temp": 4})
    clock.advance(42.5)
    found = cache.lookup("forecast", {"city": "Oslo", "days": 3}, CACHE)
    assert found is not None and found.data == {"temp": 4}
    assert found.age(clock.now()) == 42.5


def test_the_same_call_written_differently_finds_the_same_result(cache: LastGoodCache) -> None:
    cache.store("forecast", {"days": 3.0, "city": "Oslo"}, CACHE, "cloudy")
    found = cache.lookup("forecast", {"city": "Oslo", "days": 3}, CACHE)
    assert found is not None and found.data == "cloudy"
    assert cache.lookup("forecast", {"city": "Oslo", "days": 4}, CACHE) is None
    assert cache.lookup("forecast_lite", {"city": "Oslo", "days": 3}, CACHE) is None


def test_a_result_older_than_its_ttl_is_not_served(
    cache: LastGoodCache, clock: ManualClock, rdb: redis.Redis
) -> None:
    cache.store("forecast", {"city": "Oslo"}, CACHE, "cloudy")
    assert 599_000 < rdb.pttl(cache.key("forecast", {"city": "Oslo"})) <= 600_000
    clock.advance(600)
    assert cache.lookup("forecast", {"city": "Oslo"}, CACHE) is not None
    clock.advance(0.001)
    assert cache.lookup("forecast", {"city": "Oslo"}, CACHE) is None


def test_a_result_too_large_to_keep_is_not_stored(cache: LastGoodCache) -> None:
    small = LastGood(ttl_s=60, max_bytes=100)
    assert not cache.store("forecast", {"city": "Oslo"}, small, "x" * 200)
    assert cache.lookup("forecast", {"city": "Oslo"}, small) is None


def test_a_cached_preview_whose_payload_expired_is_a_miss(
    cache: LastGoodCache, clock: ManualClock
) -> None:
    payload = {"key": "k", "expires_at": clock.now() + 10}
    cache.store("forecast", {"city": "Oslo"}, CACHE, "preview...", payload)
    assert cache.lookup("forecast", {"city": "Oslo"}, CACHE) is not None
    clock.advance(10)
    assert cache.lookup("forecast", {"city": "Oslo"}, CACHE) is None


def _attempt_with_cache(
    tools: Registry, cache: LastGoodCache, clock: ManualClock, name: str, arguments: Any
) -> Verdict:
    executor = Executor(clock=clock, layers=[LastGoodLayer(cache)])
    return executor.attempt(_spec(tools, name), arguments, _ctx(clock, name), 1)


def test_the_layer_stores_each_success_under_the_validated_arguments(
    tools: Registry, cache: LastGoodCache, clock: ManualClock
) -> None:
    verdict = _attempt_with_cache(tools, cache, clock, "forecast", {"city": "Oslo"})
    assert isinstance(verdict, Final) and verdict.result.ok
    found = cache.lookup("forecast", {"city": "Oslo", "days": 3}, CACHE)
    assert found is not None and found.data == {"city": "Oslo", "days": 3}


def test_the_layer_stores_nothing_for_a_failure_or_a_tool_without_a_cache_step(
    registry: Registry, tools: Registry, cache: LastGoodCache, clock: ManualClock
) -> None:
    @tool(registry=registry, max_attempts=1, fallbacks=[CACHE])
    def broken(city: str) -> None:
        """Always fails."""
        raise UnavailableError("down")

    _attempt_with_cache(tools, cache, clock, "broken", {"city": "Oslo"})
    _attempt_with_cache(tools, cache, clock, "no_chain", {"city": "Oslo"})
    assert cache.lookup("broken", {"city": "Oslo"}, CACHE) is None
    assert cache.lookup("no_chain", {"city": "Oslo"}, CACHE) is None


# -- starting a chain ----------------------------------------------------------


def test_a_final_transient_failure_starts_the_chain_on_the_primary_queue(
    runner: ChainRunner, tools: Registry, clock: ManualClock
) -> None:
    ctx = _ctx(clock)
    action = _sent(
        runner.after_final(_spec(tools, "forecast"), {"city": "Oslo"}, ctx, _failed(ctx))
    )
    assert (action.task, action.queue, action.task_id) == (FALLBACK_TASK, "weather", "call-1-fb1")
    started = CallContext.from_json(action.kwargs["context"])
    assert (started.call_id, started.reply_to, started.deadline) == (
        "call-1",
        "reply-1",
        ctx.deadline,
    )
    state = started.fallback
    assert state is not None
    assert state.error.type == "unavailable" and state.primary_attempts == 3
    assert action.kwargs["arguments"] == {"city": "Oslo"}
    assert state.arguments is None  # not a second time in the context


def test_success_an_agent_fixable_error_or_no_chain_is_delivered_as_it_is(
    runner: ChainRunner, tools: Registry, clock: ManualClock
) -> None:
    ctx = _ctx(clock)
    forecast = _spec(tools, "forecast")
    ok = ToolResult(status="ok", tool="forecast", call_id="call-1", data=1, attempts=1)
    assert runner.after_final(forecast, {"city": "Oslo"}, ctx, ok) is None
    invalid = _failed(ctx, ErrorType.INVALID_ARGUMENTS)
    assert runner.after_final(forecast, {"city": "Oslo"}, ctx, invalid) is None
    plain = _spec(tools, "no_chain")
    assert (
        runner.after_final(plain, {"city": "Oslo"}, _ctx(clock, "no_chain"), _failed(ctx)) is None
    )


# -- the steps -----------------------------------------------------------------


def test_the_first_step_sends_the_alternative_its_mapped_arguments(
    runner: ChainRunner, tools: Registry, clock: ManualClock
) -> None:
    action = _sent(_advance(runner, _started(runner, tools, _ctx(clock))))
    assert (action.task, action.queue) == ("tools.forecast_lite", "tools")
    assert action.kwargs["arguments"] == {"place": "Oslo"}
    step_ctx = CallContext.from_json(action.kwargs["context"])
    assert step_ctx.call_id == "call-1" and step_ctx.tool == "forecast"
    assert step_ctx.fallback is not None and step_ctx.fallback.next == 1
    assert action.task_id == "call-1-fb2"


def test_an_alternative_success_is_the_degraded_answer_with_the_primary_error(
    runner: ChainRunner, tools: Registry, clock: ManualClock
) -> None:
    sent = _sent(_advance(runner, _started(runner, tools, _ctx(clock))))
    step_ctx = CallContext.from_json(sent.kwargs["context"])
    lite = ToolResult(status="ok", tool="forecast", call_id="call-1", data={"t": 3}, attempts=1)
    answer = _delivered(runner.after_final(_spec(tools, "forecast_lite"), {}, step_ctx, lite))
    assert answer.ok and answer.degraded and answer.source == "forecast_lite"
    assert answer.data == {"t": 3} and answer.attempts == 4  # 3 of forecast, 1 of forecast_lite
    body = answer.for_model()
    assert body["fallback"]["primary_error"] == {
        "type": "unavailable",
        "message": "HTTP 503 from the weather service",
    }
    assert body["degraded"] is True and body["source"] == "forecast_lite"


def test_a_failed_alternative_hands_on_to_the_cache_with_a_note(
    runner: ChainRunner, tools: Registry, cache: LastGoodCache, clock: ManualClock
) -> None:
    cache.store("forecast", {"city": "Oslo", "days": 3}, CACHE, {"temp": 4})
    sent = _sent(_advance(runner, _started(runner, tools, _ctx(clock))))
    step_ctx = CallContext.from_json(sent.kwargs["context"])
    lite_failed = _failed(step_ctx, ErrorType.TIMEOUT)
    handed = _sent(runner.after_final(_spec(tools, "forecast_lite"), {}, step_ctx, lite_failed))
    assert (handed.task, handed.queue) == (FALLBACK_TASK, "weather")
    clock.advance(5)
    answer = _delivered(_advance(runner, handed))
    assert answer.ok and answer.source == "cache" and answer.data == {"temp": 4}
    assert answer.fallback is not None and answer.fallback.age_s == 5
    assert [(n.source, n.outcome) for n in answer.fallback.tried] == [("forecast_lite", "failed")]
    assert answer.for_model()["fallback"]["age_s"] == 5


def test_an_alternative_that_would_overrun_the_deadline_is_skipped(
    runner: ChainRunner, tools: Registry, cache: LastGoodCache, clock: ManualClock
) -> None:
    cache.store("forecast", {"city": "Oslo", "days": 3}, CACHE, {"temp": 4})
    start = _started(runner, tools, _ctx(clock, deadline_in=3.5))  # forecast_lite's timeout is 4
    answer = _delivered(_advance(runner, start))
    assert answer.source == "cache"
    assert answer.fallback is not None
    note = answer.fallback.tried[0]
    assert (note.source, note.outcome) == ("forecast_lite", "skipped")
    assert note.reason.startswith("deadline: needs 4.0 s, 3.5 s left")


def test_an_alternative_whose_own_breaker_is_open_is_skipped(
    runner: ChainRunner, tools: Registry, breakers: CircuitBreaker, clock: ManualClock
) -> None:
    breakers.trip("forecast_lite", 60)
    answer = _delivered(_advance(runner, _started(runner, tools, _ctx(clock))))
    assert answer.source == "explanation"
    assert answer.fallback is not None
    first, second = answer.fallback.tried
    assert (first.source, first.outcome) == ("forecast_lite", "skipped")
    assert first.reason.startswith("circuit_open")
    assert (second.source, second.outcome) == ("cache", "miss")


def test_the_explanation_says_what_to_do_instead_and_keeps_the_primary_error(
    runner: ChainRunner, tools: Registry, breakers: CircuitBreaker, clock: ManualClock
) -> None:
    breakers.trip("forecast_lite", 60)
    answer = _delivered(_advance(runner, _started(runner, tools, _ctx(clock))))
    assert answer.status == "error" and answer.degraded and answer.source == "explanation"
    assert answer.error is not None and answer.error.type == "unavailable"
    assert answer.error.suggestion == INSTEAD
    assert "'forecast' is unavailable" in answer.error.message
    assert answer.tool == "forecast" and answer.call_id == "call-1" and answer.attempts == 3
    block = answer.to_anthropic_block("tu-1")
    assert block["is_error"] is True and INSTEAD in block["content"]


def test_after_the_deadline_the_cache_is_skipped_and_the_explanation_still_answers(
    runner: ChainRunner, tools: Registry, cache: LastGoodCache, clock: ManualClock
) -> None:
    cache.store("forecast", {"city": "Oslo", "days": 3}, CACHE, {"temp": 4})
    start = _started(runner, tools, _ctx(clock, deadline_in=5))
    clock.advance(5)
    answer = _delivered(_advance(runner, start))
    assert answer.source == "explanation"
    assert answer.fallback is not None
    assert [(n.source, n.outcome) for n in answer.fallback.tried] == [
        ("forecast_lite", "skipped"),
        ("cache", "skipped"),
    ]


def test_a_mapping_that_raises_skips_its_alternative(
    registry: Registry, breakers: CircuitBreaker, cache: LastGoodCache, clock: ManualClock
) -> None:
    def broken_mapping(arguments: Mapping[str, Any]) -> dict[str, Any]:
        return {"place": arguments["no such field"]}

    @tool(registry=registry, fallbacks=[Alternative("lite", arguments=broken_mapping)])
    def heavy(city: str) -> str:
        """Primary."""
        return city

    @tool(registry=registry)
    def lite(place: str) -> str:
        """Alternative."""
        return place

    runner = ChainRunner(registry, {}.get, breakers, cache, clock, "tools")
    ctx = _ctx(clock, "heavy")
    start = _sent(runner.after_final(_spec(registry, "heavy"), {"city": "x"}, ctx, _failed(ctx)))
    answer = _delivered(_advance(runner, start))
    assert answer.source == "explanation" and answer.fallback is not None
    assert answer.fallback.tried[0].reason.startswith("argument mapping failed: KeyError")


def test_an_alternative_this_worker_lacks_is_found_in_the_catalog(
    registry: Registry, breakers: CircuitBreaker, cache: LastGoodCache, clock: ManualClock
) -> None:
    @tool(registry=registry, fallbacks=[Alternative("remote_lite"), Alternative("gone")])
    def primary(city: str) -> str:
        """Primary."""
        return city

    published = {"remote_lite": {"policy": {"timeout": 2.0, "queue": "elsewhere"}}}
    runner = ChainRunner(registry, published.get, breakers, cache, clock, "tools")
    ctx = _ctx(clock, "primary")
    start = _sent(runner.after_final(_spec(registry, "primary"), {"city": "x"}, ctx, _failed(ctx)))
    action = _sent(_advance(runner, start))
    assert (action.task, action.queue) == ("tools.remote_lite", "elsewhere")
    assert action.kwargs["arguments"] == {"city": "x"}  # no mapping: the caller's own
    handed = _sent(
        runner.after_final(
            _spec(registry, "primary"),  # any spec: the chain state decides
            {},
            CallContext.from_json(action.kwargs["context"]),
            _failed(ctx, ErrorType.TIMEOUT),
        )
    )
    answer = _delivered(_advance(runner, handed))
    assert answer.fallback is not None
    assert answer.fallback.tried[1].reason == "no worker has published this tool"


def test_a_chain_that_reaches_a_worker_without_the_primary_still_explains(
    registry: Registry, breakers: CircuitBreaker, cache: LastGoodCache, clock: ManualClock
) -> None:
    runner = ChainRunner(registry, {}.get, breakers, cache, clock, "tools")
    info = error_info(UnavailableError("down"))
    state = ChainState.begin("elsewhere_only", None, info, 0, {})
    ctx = CallContext(
        call_id="c", tool="elsewhere_only", deadline=clock.now() + 9, submitted_at=clock.now(),
        reply_to="r", fallback=state,
    )  # fmt: skip
    answer = _delivered(runner.advance(ctx))
    assert answer.source == "explanation" and answer.error is not None
    assert "Continue without this tool" in (answer.error.suggestion or "")


def test_secret_arguments_are_redacted_in_what_flower_shows_of_each_step(
    registry: Registry, breakers: CircuitBreaker, cache: LastGoodCache, clock: ManualClock
) -> None:
    @tool(registry=registry, fallbacks=[Alternative("mirror")])
    def fetch_private(url: str, token: Annotated[str, Secret]) -> str:
        """Primary with a credential."""
        return url

    @tool(registry=registry)
    def mirror(url: str, token: Annotated[str, Secret]) -> str:
        """Alternative with the same credential."""
        return url

    runner = ChainRunner(registry, {}.get, breakers, cache, clock, "tools")
    ctx = _ctx(clock, "fetch_private")
    arguments = {"url": "https://x.test", "token": "s3cr3t-value"}
    start = _sent(
        runner.after_final(_spec(registry, "fetch_private"), arguments, ctx, _failed(ctx))
    )
    step = _sent(_advance(runner, start))
    for sent in (start, step):
        assert "s3cr3t-value" not in sent.shown and "https://x.test" in sent.shown
    assert step.kwargs["arguments"]["token"] == "s3cr3t-value"  # the tool itself gets it


def test_a_step_that_cannot_be_sent_ends_the_chain_with_its_explanation_at_once(
    runner: ChainRunner, tools: Registry, clock: ManualClock
) -> None:
    ctx = CallContext.from_json(_started(runner, tools, _ctx(clock)).kwargs["context"])
    answer = runner.explain_now(ctx, "could not send tools.forecast_lite (OperationalError: down)")
    assert answer.source == "explanation" and answer.error is not None
    assert answer.error.suggestion == INSTEAD
    assert answer.fallback is not None
    assert answer.fallback.tried[-1].reason.startswith("could not send tools.forecast_lite")


def _unreachable_redis() -> redis.Redis:
    """A real client for a local port nothing listens on: every command fails to connect."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))


def test_a_cache_that_cannot_reach_redis_is_noted_and_the_explanation_still_answers(
    tools: Registry, keys: Keys, breakers: CircuitBreaker, clock: ManualClock
) -> None:
    dead = LastGoodCache(_unreachable_redis(), keys, clock)
    runner = ChainRunner(tools, {}.get, breakers, dead, clock, "tools")
    breakers.trip("forecast_lite", 60)
    answer = _delivered(_advance(runner, _started(runner, tools, _ctx(clock))))
    assert answer.source == "explanation" and answer.fallback is not None
    cache_note = answer.fallback.tried[1]
    assert (cache_note.source, cache_note.outcome) == ("cache", "failed")
    assert cache_note.reason.startswith("ConnectionError")


def test_a_chain_that_cannot_start_delivers_the_primary_result_as_it_is(
    registry: Registry, keys: Keys, cache: LastGoodCache, clock: ManualClock
) -> None:
    @tool(registry=registry, fallbacks=[Alternative("elsewhere")])
    def lonely(city: str) -> str:
        """Its alternative lives on another worker, found through an unreachable catalog."""
        return city

    def catalog(_: str) -> dict[str, Any] | None:
        raise redis.ConnectionError("catalog unreachable")

    dead_breakers = CircuitBreaker(_unreachable_redis(), keys, clock=clock)
    runner = ChainRunner(registry, catalog, dead_breakers, cache, clock, "tools")
    ctx = _ctx(clock, "lonely")
    assert runner.after_final(_spec(registry, "lonely"), {"city": "x"}, ctx, _failed(ctx)) is None


def test_an_alternative_gets_an_idempotency_key_of_its_own_derived_from_the_callers(
    runner: ChainRunner, tools: Registry, clock: ManualClock
) -> None:
    ctx = replace(_ctx(clock), idempotency_key="order-42")
    step = _sent(_advance(runner, _started(runner, tools, ctx)))
    step_ctx = CallContext.from_json(step.kwargs["context"])
    assert step_ctx.idempotency_key == "order-42/fallback/forecast_lite"
    handed = _sent(runner.after_final(_spec(tools, "forecast_lite"), {}, step_ctx, _failed(ctx)))
    assert (
        CallContext.from_json(handed.kwargs["context"]).idempotency_key == step_ctx.idempotency_key
    )
