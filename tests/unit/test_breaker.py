"""The breaker's Lua transitions on a real Redis, driven by a ManualClock: exact, no sleeping."""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from toolexec.breaker import Admission, BreakerState, CircuitBreaker, Transition, TransitionReason
from toolexec.breaker.cli import breakers
from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.errors import ConfigurationError, ErrorType, RedisUnavailableError, UsageError
from toolexec.keys import Keys
from toolexec.policies import BreakerPolicy

NAME = "get_weather"
#: Opens after 3 consecutive failures; the rate condition is off unless a test turns it on.
CONSECUTIVE = BreakerPolicy(
    consecutive_failures=3, failure_rate=None, open_s=30.0, half_open_probes=2, close_after=2
)


@pytest.fixture
def breaker(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(rdb, keys, clock=clock)


@pytest.fixture
def events(breaker: CircuitBreaker) -> list[Transition]:
    seen: list[Transition] = []
    breaker.add_listener(seen.append)
    return seen


def call(
    breaker: CircuitBreaker,
    policy: BreakerPolicy = CONSECUTIVE,
    *,
    ok: bool = False,
    duration: float = 0.1,
    retry_after: float | None = None,
    name: str = NAME,
) -> tuple[Admission, Transition | None]:
    """One admitted call's whole life: acquire, then record its outcome."""
    admission = breaker.acquire(name, policy)
    assert admission.allowed, admission
    return admission, breaker.record(
        name, policy, admission, success=ok, duration_s=duration, retry_after=retry_after
    )


def open_breaker(breaker: CircuitBreaker, policy: BreakerPolicy = CONSECUTIVE) -> None:
    for _ in range(policy.consecutive_failures or 0):
        call(breaker, policy)
    assert breaker.snapshot(NAME).state is BreakerState.OPEN


class DeadRedis(redis.Redis):
    """A client for a port nothing listens on, counting its attempts to connect.

    It does not retry: redis-py's default retries with seconds of backoff,
    which the breaker's own ``redis_retry_s`` pause makes unnecessary.
    """

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        super().__init__(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
        self.attempts = 0
        base: Any = self.connection_pool.connection_class
        owner = self

        class Counting(base):  # type: ignore[misc, valid-type]
            def connect(self) -> None:
                owner.attempts += 1
                super().connect()

        self.connection_pool.connection_class = Counting


def dead_redis() -> DeadRedis:
    return DeadRedis()


# --- closed -> open -----------------------------------------------------------


def test_n_consecutive_failures_open_it_exactly_at_the_nth(
    breaker: CircuitBreaker, clock: ManualClock, events: list[Transition]
) -> None:
    assert call(breaker)[1] is None
    assert call(breaker)[1] is None
    assert breaker.snapshot(NAME).consecutive == 2

    _, transition = call(breaker)

    assert transition is not None
    assert (transition.from_state, transition.to_state) == ("closed", "open")
    assert transition.reason is TransitionReason.CONSECUTIVE_FAILURES
    assert transition.open_until == clock.now() + 30.0
    assert transition.consecutive == 3
    assert events == [transition]


def test_a_success_resets_the_consecutive_count(breaker: CircuitBreaker) -> None:
    for ok in (False, False, True, False, False):
        call(breaker, ok=ok)

    view = breaker.snapshot(NAME)
    assert view.state is BreakerState.CLOSED
    assert (view.consecutive, view.calls, view.failures) == (2, 5, 4)


def test_the_failure_rate_opens_it_only_once_min_calls_are_in_the_window(
    breaker: CircuitBreaker,
) -> None:
    policy = BreakerPolicy(consecutive_failures=None, failure_rate=0.5, window_size=10, min_calls=6)
    for ok in (True, True, False, False, False):  # 3/5 failed, but only 5 calls
        assert call(breaker, policy, ok=ok)[1] is None
    assert call(breaker, policy, ok=True)[1] is not None  # 3/6 = 50%: the threshold, reached

    view = breaker.snapshot(NAME)
    assert view.state is BreakerState.OPEN
    assert view.reason is TransitionReason.FAILURE_RATE
    assert (view.calls, view.failures, view.failure_rate) == (6, 3, 0.5)


def test_the_window_slides_so_old_failures_stop_counting(breaker: CircuitBreaker) -> None:
    policy = BreakerPolicy(consecutive_failures=None, failure_rate=0.75, window_size=4, min_calls=4)
    for ok in (False, False, True, True, True, True, False, False):
        assert call(breaker, policy, ok=ok)[1] is None

    view = breaker.snapshot(NAME)
    assert (view.state, view.calls, view.failures) == (BreakerState.CLOSED, 4, 2)
    assert call(breaker, policy)[1] is not None  # the last 4: ok, fail, fail, fail = 75%


def test_slow_successes_count_as_failures_and_as_slow(breaker: CircuitBreaker) -> None:
    policy = BreakerPolicy(consecutive_failures=3, failure_rate=None, slow_call_s=1.0)
    call(breaker, policy, ok=True, duration=1.0)  # exactly the threshold: not slower than it
    call(breaker, policy, ok=True, duration=1.5)
    call(breaker, policy, ok=True, duration=9.0)
    view = breaker.snapshot(NAME)
    assert (view.calls, view.failures, view.slow, view.consecutive) == (3, 2, 2, 2)

    _, transition = call(breaker, policy, ok=False, duration=5.0)  # failed and slow: one failure

    assert transition is not None and transition.to_state is BreakerState.OPEN
    assert (transition.failures, breaker.snapshot(NAME).slow) == (3, 2)


# --- open -----------------------------------------------------------------------


def test_open_refuses_with_the_time_left_and_runs_nothing(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    open_breaker(breaker)
    clock.advance(12.5)

    admission = breaker.acquire(NAME, CONSECUTIVE)
    view = breaker.check(NAME, CONSECUTIVE)

    assert not admission.allowed and admission.state is BreakerState.OPEN
    assert admission.retry_after == 17.5 and admission.permit is None
    assert (view.admits, view.retry_after, view.state) == (False, 17.5, BreakerState.OPEN)
    error = admission.refusal()
    assert (error.error_type, error.retryable, error.retry_after) == (
        ErrorType.CIRCUIT_OPEN,
        True,
        17.5,
    )


def test_check_takes_no_permit_and_changes_nothing(
    breaker: CircuitBreaker, clock: ManualClock, events: list[Transition]
) -> None:
    open_breaker(breaker)
    clock.advance(30.0)
    before = len(events)

    for _ in range(5):
        view = breaker.check(NAME, CONSECUTIVE)

    assert view.admits and view.state is BreakerState.OPEN and view.probes_in_flight == 0
    assert len(events) == before  # the move to half-open waits for a real acquire


# --- half-open --------------------------------------------------------------------


def test_when_open_until_passes_the_next_acquire_moves_to_half_open_with_a_probe(
    breaker: CircuitBreaker, clock: ManualClock, events: list[Transition]
) -> None:
    open_breaker(breaker)
    clock.advance(29.999)
    assert not breaker.acquire(NAME, CONSECUTIVE).allowed
    clock.advance(0.001)

    admission = breaker.acquire(NAME, CONSECUTIVE)

    assert admission.allowed and admission.probe and admission.state is BreakerState.HALF_OPEN
    assert events[-1].reason is TransitionReason.OPEN_ELAPSED
    assert (events[-1].from_state, events[-1].to_state) == ("open", "half_open")


def test_half_open_admits_k_probes_then_refuses_until_the_first_lease_ends(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    policy = BreakerPolicy(consecutive_failures=1, failure_rate=None, probe_lease_s=45.0)
    call(breaker, policy)
    clock.advance(policy.open_s)

    first, second = breaker.acquire(NAME, policy), breaker.acquire(NAME, policy)
    clock.advance(5.0)
    third = breaker.acquire(NAME, policy)

    assert first.probe and second.probe and first.permit != second.permit
    assert not third.allowed and third.state is BreakerState.HALF_OPEN
    assert third.retry_after == 40.0
    assert breaker.snapshot(NAME).probes_in_flight == 2


def test_an_expired_probe_lease_gives_its_permit_back(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    policy = BreakerPolicy(consecutive_failures=1, failure_rate=None, probe_lease_s=45.0)
    call(breaker, policy)
    clock.advance(policy.open_s)
    breaker.acquire(NAME, policy)
    breaker.acquire(NAME, policy)  # both holders die here, never recording
    clock.advance(44.9)
    assert not breaker.acquire(NAME, policy).allowed

    clock.advance(0.1)
    again = breaker.acquire(NAME, policy)

    assert again.probe
    assert breaker.snapshot(NAME).probes_in_flight == 1


def test_m_probe_successes_close_it_with_an_empty_window(
    breaker: CircuitBreaker, clock: ManualClock, events: list[Transition]
) -> None:
    open_breaker(breaker)
    clock.advance(30.0)
    first, second = breaker.acquire(NAME, CONSECUTIVE), breaker.acquire(NAME, CONSECUTIVE)

    assert breaker.record(NAME, CONSECUTIVE, first, success=True, duration_s=0.2) is None
    assert breaker.snapshot(NAME).probe_successes == 1
    closed = breaker.record(NAME, CONSECUTIVE, second, success=True, duration_s=0.2)

    assert closed is not None and closed.reason is TransitionReason.PROBES_SUCCEEDED
    view = breaker.snapshot(NAME)
    assert (view.state, view.calls, view.consecutive, view.probes_in_flight) == ("closed", 0, 0, 0)
    assert breaker.acquire(NAME, CONSECUTIVE).state is BreakerState.CLOSED


def test_one_probe_failure_reopens_it_for_longer_than_the_first_open(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """The second consecutive trip stays open open_factor times longer (Envoy's ejections)."""
    open_breaker(breaker)
    clock.advance(30.0)
    probe, other = breaker.acquire(NAME, CONSECUTIVE), breaker.acquire(NAME, CONSECUTIVE)
    breaker.record(NAME, CONSECUTIVE, probe, success=True, duration_s=0.1)
    clock.advance(3.0)

    reopened = breaker.record(NAME, CONSECUTIVE, other, success=False, duration_s=0.1)

    assert reopened is not None and reopened.reason is TransitionReason.PROBE_FAILED
    assert reopened.open_until == clock.now() + 60.0
    assert reopened.trips == 2
    view = breaker.snapshot(NAME)
    assert (view.state, view.probes_in_flight, view.probe_successes) == ("open", 0, 0)


def test_outcomes_of_calls_admitted_before_a_transition_are_ignored(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """A slow call admitted while closed must not count as a probe when it ends half-open."""
    straggler = breaker.acquire(NAME, CONSECUTIVE)
    open_breaker(breaker)
    clock.advance(30.0)
    breaker.acquire(NAME, CONSECUTIVE)

    assert breaker.record(NAME, CONSECUTIVE, straggler, success=True, duration_s=31) is None
    assert breaker.record(NAME, CONSECUTIVE, straggler, success=False, duration_s=31) is None

    view = breaker.snapshot(NAME)
    assert (view.state, view.probe_successes) == (BreakerState.HALF_OPEN, 0)


# --- Retry-After ------------------------------------------------------------------


def test_a_503_with_retry_after_keeps_it_open_longer_than_open_s(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    policy = BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=2.0)
    call(breaker, policy)
    _, transition = call(breaker, policy, retry_after=10.0)
    assert transition is not None and transition.open_until == clock.now() + 10.0

    clock.advance(9.999)
    refused = breaker.acquire(NAME, policy)
    clock.advance(0.001)

    assert not refused.allowed and refused.retry_after == pytest.approx(0.001, abs=1e-6)
    assert breaker.acquire(NAME, policy).probe


def test_an_earlier_retry_after_is_remembered_until_the_breaker_opens(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    policy = BreakerPolicy(consecutive_failures=3, failure_rate=None, open_s=2.0)
    call(breaker, policy, retry_after=10.0)  # "not before t0 + 10"
    clock.advance(1.0)
    call(breaker, policy)

    _, transition = call(breaker, policy)

    assert transition is not None and transition.open_until == clock.now() + 9.0


def test_while_open_a_later_retry_after_extends_but_never_shortens(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    in_flight = [breaker.acquire(NAME, CONSECUTIVE) for _ in range(2)]
    open_breaker(breaker)  # open until t0 + 30
    start = clock.now()

    breaker.record(NAME, CONSECUTIVE, in_flight[0], success=False, duration_s=1, retry_after=5)
    assert breaker.snapshot(NAME).open_until == start + 30.0
    breaker.record(NAME, CONSECUTIVE, in_flight[1], success=False, duration_s=1, retry_after=60)
    assert breaker.snapshot(NAME).open_until == start + 60.0


# --- operator switches --------------------------------------------------------------


def test_trip_opens_it_for_the_given_seconds_then_it_probes_as_usual(
    breaker: CircuitBreaker, clock: ManualClock, events: list[Transition]
) -> None:
    view = breaker.trip(NAME, 60.0)

    assert (view.state, view.open_until, view.admits) == ("open", clock.now() + 60.0, False)
    assert events[-1].reason is TransitionReason.TRIPPED
    clock.advance(60.0)
    assert breaker.acquire(NAME, CONSECUTIVE).probe


def test_trip_without_seconds_isolates_it_until_reset(
    breaker: CircuitBreaker, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    breaker.trip(NAME)
    clock.advance(10 * 86_400)

    refused = breaker.acquire(NAME, CONSECUTIVE)
    assert rdb.ttl(keys.breaker(NAME)) == -1  # an isolation does not expire on its own
    view = breaker.reset(NAME)

    assert not refused.allowed and refused.retry_after is None
    assert "held open by an operator" in refused.refusal().message
    assert (view.state, view.calls, view.reason) == ("closed", 0, TransitionReason.RESET)
    assert breaker.acquire(NAME, CONSECUTIVE).allowed


def test_reset_closes_an_open_breaker_and_empties_its_window(
    breaker: CircuitBreaker, events: list[Transition]
) -> None:
    open_breaker(breaker)

    view = breaker.reset(NAME)

    assert (view.state, view.calls, view.failures, view.consecutive) == ("closed", 0, 0, 0)
    assert (events[-1].from_state, events[-1].to_state) == ("open", "closed")


def test_names_and_snapshot_all_list_every_breaker_and_forget_expired_ones(
    breaker: CircuitBreaker, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    call(breaker, name="search")
    breaker.trip("http_request@api.example.com", 5.0)

    assert breaker.names() == ["http_request@api.example.com", "search"]
    states = {v.name: v.state for v in breaker.snapshot_all()}
    assert states == {"search": "closed", "http_request@api.example.com": "open"}

    rdb.delete(keys.breaker("search"))  # what the idle TTL does a day later
    assert [v.name for v in breaker.snapshot_all()] == ["http_request@api.example.com"]
    assert "search" in breaker.names()  # registered recently: kept
    clock.advance(breaker.idle_ttl_s + 1)
    breaker.snapshot_all()
    assert breaker.names() == ["http_request@api.example.com"]


def test_a_breakers_keys_share_one_cluster_slot_and_expire_when_idle(
    breaker: CircuitBreaker, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    name = "http_request@api.example.com"
    slots = {key_slot(k.encode()) for k in (keys.breaker(name), keys.breaker_probes(name))}
    assert len(slots) == 1

    breaker.trip(name, 100.0)
    clock.advance(100.0)
    breaker.acquire(name, CONSECUTIVE)  # half-open: a probe permit in the sorted set

    for key in (keys.breaker(name), keys.breaker_probes(name)):
        assert 0 < rdb.ttl(key) <= breaker.idle_ttl_s


def test_names_with_braces_or_blanks_are_refused(breaker: CircuitBreaker) -> None:
    for bad in ("", "a{b}", "two words", "x" * 201):
        with pytest.raises(UsageError):
            breaker.check(bad, CONSECUTIVE)


# --- listeners, Redis away, policy ---------------------------------------------------


def test_a_failing_listener_is_logged_and_never_breaks_record(
    breaker: CircuitBreaker, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: Transition) -> None:
        raise RuntimeError("metrics backend is down")

    seen: list[Transition] = []
    breaker.add_listener(broken)
    breaker.add_listener(seen.append)

    with caplog.at_level(logging.INFO, logger="toolexec.breaker"):
        for _ in range(3):
            _, transition = call(breaker)

    assert transition is not None and seen == [transition]
    assert any("listener" in r.message and r.exc_info for r in caplog.records)
    assert any("closed -> open" in r.getMessage() for r in caplog.records)


def test_unreachable_redis_with_allow_lets_calls_through_and_warns_once_per_interval(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    breaker = CircuitBreaker(dead_redis(), clock=clock, warn_interval_s=60.0)

    with caplog.at_level(logging.WARNING, logger="toolexec.breaker"):
        admission = breaker.acquire(NAME, CONSECUTIVE)
        view = breaker.check(NAME, CONSECUTIVE)
        recorded = breaker.record(NAME, CONSECUTIVE, admission, success=False, duration_s=1)
        assert len(caplog.records) == 1
        clock.advance(60.0)
        breaker.acquire(NAME, CONSECUTIVE)

    assert admission.allowed and admission.state is None and recorded is None
    assert view.admits and view.state is None
    assert len(caplog.records) == 2 and "letting calls through" in caplog.records[0].message


def test_after_redis_failed_the_call_path_does_not_wait_on_it_again_for_a_while(
    clock: ManualClock,
) -> None:
    redis_down = dead_redis()
    breaker = CircuitBreaker(redis_down, clock=clock, redis_retry_s=1.0)
    admission = breaker.acquire(NAME, CONSECUTIVE)
    assert redis_down.attempts == 1

    breaker.check(NAME, CONSECUTIVE)
    breaker.record(NAME, CONSECUTIVE, admission, success=False, duration_s=1)
    clock.advance(0.999)
    assert breaker.acquire(NAME, CONSECUTIVE).allowed
    assert redis_down.attempts == 1
    clock.advance(0.001)
    breaker.acquire(NAME, CONSECUTIVE)
    assert redis_down.attempts == 2


def test_unreachable_redis_with_deny_refuses_calls(clock: ManualClock) -> None:
    breaker = CircuitBreaker(dead_redis(), clock=clock, on_redis_error="deny")

    assert not breaker.acquire(NAME, CONSECUTIVE).allowed
    assert not breaker.check(NAME, CONSECUTIVE).admits


def test_operator_calls_raise_when_redis_is_unreachable(clock: ManualClock) -> None:
    breaker = CircuitBreaker(dead_redis(), clock=clock)

    for operate in (lambda: breaker.trip(NAME), breaker.snapshot_all):
        with pytest.raises(RedisUnavailableError, match="cannot reach Redis"):
            operate()


def test_a_disabled_policy_never_touches_redis(clock: ManualClock) -> None:
    breaker = CircuitBreaker(dead_redis(), clock=clock, on_redis_error="deny")
    policy = BreakerPolicy(enabled=False)

    admission = breaker.acquire(NAME, policy)

    assert admission.allowed and breaker.check(NAME, policy).admits
    assert breaker.record(NAME, policy, admission, success=False, duration_s=1) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"consecutive_failures": 0},
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"window_size": 0},
        {"min_calls": 21},
        {"slow_call_s": 0.0},
        {"open_s": 0.0},
        {"half_open_probes": 0},
        {"close_after": 0},
        {"probe_lease_s": -1.0},
        {"consecutive_failures": None, "failure_rate": None},
    ],
)
def test_invalid_policies_are_configuration_errors(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="invalid breaker policy"):
        BreakerPolicy(**fields)


def test_on_redis_error_must_be_allow_or_deny(rdb: redis.Redis) -> None:
    with pytest.raises(ConfigurationError):
        CircuitBreaker(rdb, on_redis_error="maybe")  # type: ignore[arg-type]


# --- round trips --------------------------------------------------------------------


def counting_client(url: str) -> tuple[redis.Redis, list[int]]:
    """A real client whose connections count the packets they send (one per round trip)."""
    client = redis_client(url)
    sent = [0]
    base: Any = client.connection_pool.connection_class

    class Counting(base):  # type: ignore[misc, valid-type]
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent[0] += 1
            super().send_packed_command(command, check_health)

    client.connection_pool.connection_class = Counting
    return client, sent


def test_each_call_path_method_is_one_round_trip(
    redis_url: str, keys: Keys, clock: ManualClock
) -> None:
    client, sent = counting_client(redis_url)
    breaker = CircuitBreaker(client, keys, clock=clock)
    call(breaker, ok=True)  # loads the scripts and registers the name
    admission = breaker.acquire(NAME, CONSECUTIVE)
    costs = {}

    for label, step in {
        "check": lambda: breaker.check(NAME, CONSECUTIVE),
        "acquire": lambda: breaker.acquire(NAME, CONSECUTIVE),
        "record": lambda: breaker.record(
            NAME, CONSECUTIVE, admission, success=True, duration_s=0.1
        ),
    }.items():
        before = sent[0]
        step()
        costs[label] = sent[0] - before

    assert costs == {"check": 1, "acquire": 1, "record": 1}
    client.close()


# --- the CLI ------------------------------------------------------------------------


def test_cli_lists_trips_and_resets_breakers_on_the_real_redis(
    redis_url: str, keys: Keys, rdb: redis.Redis
) -> None:
    env = {"TOOLEXEC_REDIS_URL": redis_url, "TOOLEXEC_KEY_PREFIX": keys.prefix}
    runner = CliRunner()
    assert "no circuit breakers yet" in runner.invoke(breakers, [], env=env).output
    production = CircuitBreaker(rdb, keys)  # Redis TIME, like the CLI
    for _ in range(3):
        call(production, name="search")

    tripped = runner.invoke(breakers, ["trip", NAME, "--for", "120", "--json", "--force"], env=env)
    listed = runner.invoke(breakers, ["--json"], env=env)
    table = runner.invoke(breakers, [], env=env)

    assert tripped.exit_code == 0, tripped.output
    assert json.loads(tripped.output)[0]["state"] == "open"
    by_name = {row["name"]: row for row in json.loads(listed.output)}
    assert by_name["search"]["state"] == "open" and by_name["search"]["failures"] == 3
    assert by_name[NAME]["open_until"] - by_name[NAME]["at"] == pytest.approx(120.0, abs=1.0)
    assert "search" in table.output and "(in 1" in table.output

    isolated = runner.invoke(breakers, ["trip", "search"], env=env)
    assert "isolated until reset" in isolated.output
    reset = runner.invoke(breakers, ["reset", "search", "--json"], env=env)
    assert json.loads(reset.output)[0]["state"] == "closed"
    bad = runner.invoke(breakers, ["reset", "no good"], env=env)
    assert bad.exit_code == 1 and "without braces or blanks" in bad.output


#: Opens on one failure for 2 s, then 4, 8, at most 10; one probe success closes it.
GROWING = BreakerPolicy(
    consecutive_failures=1, failure_rate=None, open_s=2.0, open_factor=2.0, max_open_s=10.0
)


def probe_fails(breaker: CircuitBreaker, clock: ManualClock, policy: BreakerPolicy) -> Transition:
    """Wait out the open breaker, then fail its probe; returns the reopening."""
    open_until = breaker.snapshot(NAME).open_until
    assert open_until is not None
    clock.advance(open_until - clock.now())
    admission = breaker.acquire(NAME, policy)
    assert admission.probe
    reopened = breaker.record(NAME, policy, admission, success=False, duration_s=0.1)
    assert reopened is not None
    return reopened


def test_each_consecutive_trip_stays_open_longer_up_to_max_open(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    _, first = call(breaker, GROWING)
    assert first is not None and first.open_until == clock.now() + 2.0 and first.trips == 1
    spans = []
    for _ in range(4):
        reopened = probe_fails(breaker, clock, GROWING)
        assert reopened.open_until is not None
        spans.append(reopened.open_until - clock.now())
    assert spans == [4.0, 8.0, 10.0, 10.0]
    assert breaker.snapshot(NAME).trips == 5


def test_one_probe_success_closes_it_by_default(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    call(breaker, GROWING)
    clock.advance(2.0)
    admission = breaker.acquire(NAME, GROWING)
    closed = breaker.record(NAME, GROWING, admission, success=True, duration_s=0.1)
    assert closed is not None and closed.to_state is BreakerState.CLOSED


def test_a_trip_soon_after_closing_continues_the_growth(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    """The service flapping back down within twice the last open is the same outage."""
    call(breaker, GROWING)
    probe_fails(breaker, clock, GROWING)  # trip 2: 4 s
    clock.advance(4.0)
    breaker.record(NAME, GROWING, breaker.acquire(NAME, GROWING), success=True, duration_s=0.1)
    clock.advance(7.9)
    _, again = call(breaker, GROWING)
    assert again is not None and again.trips == 3 and again.open_until == clock.now() + 8.0


def test_a_calm_spell_starts_the_growth_over(breaker: CircuitBreaker, clock: ManualClock) -> None:
    call(breaker, GROWING)
    probe_fails(breaker, clock, GROWING)  # trip 2: 4 s
    clock.advance(4.0)
    breaker.record(NAME, GROWING, breaker.acquire(NAME, GROWING), success=True, duration_s=0.1)
    clock.advance(8.0)  # closed for twice the last open
    _, again = call(breaker, GROWING)
    assert again is not None and again.trips == 1 and again.open_until == clock.now() + 2.0


def test_a_reset_forgets_the_trips(breaker: CircuitBreaker, clock: ManualClock) -> None:
    call(breaker, GROWING)
    probe_fails(breaker, clock, GROWING)
    assert breaker.reset(NAME).trips == 0
    _, again = call(breaker, GROWING)
    assert again is not None and again.trips == 1


def test_the_refusal_says_it_is_toolexecs_breaker_its_trip_and_when_it_probes(
    breaker: CircuitBreaker, clock: ManualClock
) -> None:
    call(breaker, GROWING)
    probe_fails(breaker, clock, GROWING)
    clock.advance(1.0)
    refusal = breaker.acquire(NAME, GROWING).refusal()
    assert "toolexec" in refusal.message and "trip 2" in refusal.message
    assert "in 3.0 s" in refusal.message
    assert refusal.retry_after == pytest.approx(3.0)
    assert refusal.details["defence"] == "circuit_breaker"
    assert refusal.details["trips"] == 2
    assert refusal.details["reason"] == "probe_failed"
    assert refusal.details["reopens_in_s"] == pytest.approx(3.0)
