"""Issue 18, item 2: one model must not switch off a tool for every agent, for years.

The attacks: a URL answering 503 with ``Retry-After: 999999999`` (a breaker
open for 31 years) or ``1e300`` (a Lua script that failed half-way and a
``toolexec breakers`` that crashed), a redirect to ``file://`` counted as a
connection failure, and a 501 retried as if it might pass. The first tests drive
the breaker on the session's real Redis; the last ones go through a real worker.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from hostile_input_support import isolated_worker

from toolexec.bounds import MAX_RETRY_AFTER_S, MAX_SECONDS
from toolexec.breaker import BreakerState, CircuitBreaker
from toolexec.breaker.cli import breakers
from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.errors import ErrorType, UnavailableError, UsageError
from toolexec.keys import Keys
from toolexec.pipeline.classify import classify_exception, classify_response, parse_retry_after
from toolexec.policies import BreakerPolicy
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply

POLICY = BreakerPolicy(consecutive_failures=3, failure_rate=None, open_s=30.0)


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url)
    yield client
    client.close()


@pytest.fixture
def keys() -> Keys:
    return Keys(f"sec-{uuid.uuid4().hex[:10]}")


def _fail(breaker: CircuitBreaker, name: str, retry_after: float) -> None:
    admission = breaker.acquire(name, POLICY)
    breaker.record(name, POLICY, admission, success=False, duration_s=0.1, retry_after=retry_after)


@pytest.mark.parametrize("header", ["999999999", "1e300", "1e308", "-5", "nan", "inf"])
def test_a_retry_after_header_is_bounded_before_it_reaches_anything(header: str) -> None:
    seconds = parse_retry_after(header, time.time())

    assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= MAX_RETRY_AFTER_S)


@pytest.mark.parametrize("retry_after", [1e300, 999_999_999.0, float("inf"), float("nan")])
def test_an_outside_retry_after_never_half_applies_the_breaker(
    rdb: redis.Redis, keys: Keys, redis_url: str, retry_after: float
) -> None:
    """Before: 1e300 made PEXPIRE fail after HSET: state written, internal_error, a CLI crash."""
    breaker = CircuitBreaker(rdb, keys)
    name = "http_request@slow.example"

    for _ in range(3):
        _fail(breaker, name, retry_after)

    view = breaker.snapshot(name)
    assert view.state is BreakerState.OPEN
    assert view.open_until is not None and view.at is not None
    assert view.open_until - view.at <= MAX_RETRY_AFTER_S + 1
    ttl_ms = rdb.pttl(keys.breaker(name))
    assert 0 < ttl_ms <= (MAX_RETRY_AFTER_S + 86_400 + 60) * 1000
    listed = CliRunner().invoke(
        breakers, [], env={"TOOLEXEC_REDIS_URL": redis_url, "TOOLEXEC_KEY_PREFIX": keys.prefix}
    )
    assert listed.exit_code == 0, listed.output
    assert name in listed.output


def test_the_script_itself_cannot_be_half_applied_by_a_huge_number(
    rdb: redis.Redis, keys: Keys, redis_url: str
) -> None:
    """A caller that skipped the bounds (an old client) still gets a whole transition."""
    breaker = CircuitBreaker(rdb, keys)
    name = "legacy"
    for _ in range(2):
        _fail(breaker, name, 1.0)
    admission = breaker.acquire(name, POLICY)
    raw = [
        "1", "0", "1e300", str(admission.generation), "", 3, 0, POLICY.window_size,
        POLICY.min_calls, POLICY.open_s, POLICY.close_after, breaker.idle_ttl_s,
    ]  # fmt: skip

    breaker._run(breaker._record, name, raw)

    state = rdb.hgetall(keys.breaker(name))
    assert state["state"] == "open"
    assert 0 < rdb.pttl(keys.breaker(name)) <= MAX_SECONDS * 1000
    listed = CliRunner().invoke(
        breakers, [], env={"TOOLEXEC_REDIS_URL": redis_url, "TOOLEXEC_KEY_PREFIX": keys.prefix}
    )
    assert listed.exit_code == 0, listed.output  # before: OverflowError
    assert "far in the future" in listed.output


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 1e300, -1.0, 0.0])
def test_an_operator_trip_takes_only_a_sane_number_of_seconds(
    rdb: redis.Redis, keys: Keys, seconds: float
) -> None:
    with pytest.raises(UsageError):
        CircuitBreaker(rdb, keys).trip("search", seconds)


def test_a_tool_raising_an_absurd_retry_after_carries_a_bounded_one() -> None:
    assert UnavailableError("x", retry_after=1e300).retry_after == MAX_RETRY_AFTER_S
    assert UnavailableError("x", retry_after=float("nan")).retry_after is None
    assert UnavailableError("x", retry_after=-3).retry_after == 0.0


def test_501_and_505_are_permanent_not_retried() -> None:
    for status in (501, 505):
        failure = classify_response(status, {}, "", "http://api.example/x", 0.0)
        assert failure is not None and not failure.retryable
        assert failure.error_type is ErrorType.CLIENT_ERROR


def test_an_unsupported_redirect_is_a_permanent_client_error() -> None:
    import httpx

    request = httpx.Request("GET", "http://api.example/")
    for exc in (
        httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'file://'."),
        httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=request),
    ):
        failure = classify_exception(exc, 0.0)
        assert failure.error_type is ErrorType.CLIENT_ERROR and not failure.retryable


# -- through a real worker ----------------------------------------------------------------


@pytest.fixture(scope="module")
def capped(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolClient]:
    """A worker whose Retry-After cap is 1 s; it may reach both loopback services."""
    with isolated_worker(
        settings,
        worker_env,
        tmp_path_factory.mktemp("breaker-abuse"),
        TOOLEXEC_RETRY_AFTER_CAP_S="1",
        TOOLEXEC_HTTP_ALLOW="127.0.0.1,127.0.0.2",
    ) as (_, client):
        yield client


@pytest.fixture(scope="module")
def other_host() -> Iterator[FlakyServer]:
    with FlakyServer(host="127.0.0.2") as server:
        yield server


@pytest.mark.integration
def test_a_hostile_retry_after_opens_only_that_hosts_breaker_and_only_for_the_cap(
    capped: ToolClient, flaky: FlakyServer, other_host: FlakyServer
) -> None:
    """Before: five 503s with Retry-After: 999999999 closed http_request everywhere for 31 years."""
    path = flaky.unique_path("forever")
    url = flaky.script(path, Reply(503, {"no": "way"}, headers={"Retry-After": "999999999"}))

    # five failed calls in a row open a breaker (it counts calls, not attempts)
    results = capped.call_many([("http_request", {"url": url})] * 5, timeout=20)
    assert {r.status for r in results} == {"error"}

    host_breaker = capped.breakers.snapshot("http_request@127.0.0.1")
    assert host_breaker.state is BreakerState.OPEN
    assert host_breaker.open_until is not None and host_breaker.at is not None
    assert host_breaker.open_until - host_breaker.at <= POLICY.open_s + 1
    elsewhere = other_host.script(other_host.unique_path("fine"), Reply(200, {"fine": True}))
    assert capped.call("http_request", {"url": elsewhere}, timeout=20).status == "ok"
    # the host's first trip is short (2 s), so a call to it waits for the probe (or is it)
    # instead of being refused at once; either way the hostile host is still shut out
    again = capped.call("http_request", {"url": url}, timeout=10)
    assert again.error is not None
    assert again.error.type in ("circuit_open", "retry_budget_exhausted"), again.error
    capped.breakers.reset("http_request@127.0.0.1")


@pytest.mark.integration
def test_the_retry_countdown_honours_the_cap_not_the_header(
    capped: ToolClient, other_host: FlakyServer
) -> None:
    path = other_host.unique_path("later")
    url = other_host.script(
        path, Reply(503, headers={"Retry-After": "999999999"}), Reply(200, {"at": "last"})
    )

    result = capped.call("http_request", {"url": url}, timeout=20)

    assert result.status == "ok" and result.attempts == 2  # retried after ~1 s, not never
    capped.breakers.reset("http_request@127.0.0.2")


@pytest.mark.integration
def test_a_redirect_to_file_is_permanent_and_not_counted_against_the_breaker(
    capped: ToolClient, other_host: FlakyServer
) -> None:
    """Before: connection_error, retried three times, counted by the breaker."""
    path = other_host.unique_path("to-file")
    url = other_host.script(path, Reply(302, headers={"Location": "file:///etc/passwd"}))
    before = capped.breakers.snapshot("http_request@127.0.0.2")

    result = capped.call("http_request", {"url": url}, timeout=20)

    assert result.error is not None and result.error.type == ErrorType.CLIENT_ERROR
    assert result.attempts == 1 and len(other_host.hits(path)) == 1
    after = capped.breakers.snapshot("http_request@127.0.0.2")
    assert after.failures == before.failures and after.consecutive == 0


@pytest.mark.integration
def test_a_501_is_answered_once(capped: ToolClient, other_host: FlakyServer) -> None:
    path = other_host.unique_path("nope")
    url = other_host.script(path, Reply(501, {"error": "not implemented"}))

    result = capped.call("http_request", {"url": url}, timeout=20)

    assert result.error is not None and result.error.type == ErrorType.CLIENT_ERROR
    assert result.attempts == 1 and len(other_host.hits(path)) == 1


@pytest.mark.parametrize("bad", [math.inf, math.nan, 1e300])
def test_budgets_and_policies_that_become_ttls_are_finite(bad: float) -> None:
    """Before: an infinite wall-time budget or open time reached a TTL and crashed there."""
    from toolexec.errors import ConfigurationError
    from toolexec.policies import RetryBudgetPolicy, RunBudget

    with pytest.raises(ConfigurationError):
        RunBudget(max_wall_s=bad)
    with pytest.raises(ConfigurationError):
        BreakerPolicy(open_s=bad)
    with pytest.raises(ConfigurationError):
        RetryBudgetPolicy(window_s=bad)


@pytest.mark.parametrize("deadline", [math.nan, math.inf, 1e300, "soon", None])
def test_a_messages_deadline_must_be_a_finite_time(deadline: object) -> None:
    from toolexec.context import CallContext

    with pytest.raises(ValueError, match="deadline"):
        CallContext.from_json(
            {
                "call_id": "c",
                "tool": "t",
                "deadline": deadline,
                "submitted_at": 1.0,
                "reply_to": "r",
            }
        )
