"""RetryPolicy and ``decide`` as pure functions: no clock, no sleep, seeded randomness."""

from __future__ import annotations

import math
import random

import pytest

from toolexec.errors import TRANSIENT_TYPES, ConfigurationError, ErrorType
from toolexec.policies import Jitter, RetryPolicy
from toolexec.retry import RetryDecision, decide

DRAWS = 2000
NOW = 1_700_000_000.0
FAR = NOW + 3600.0


def _draws(policy: RetryPolicy, attempt: int, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [policy.backoff(attempt, None, rng) for _ in range(DRAWS)]


def _decide(policy: RetryPolicy, **overrides: object) -> RetryDecision:
    """``decide`` for attempt 1 of a transient failure far from its deadline, unless told."""
    args: dict[str, object] = {
        "attempt": 1,
        "error_type": ErrorType.UNAVAILABLE,
        "retry_after": None,
        "now": NOW,
        "deadline": FAR,
        "previous_delay": None,
        "rng": random.Random(1),
    }
    args.update(overrides)
    return decide(policy, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("attempt", [1, 2, 3, 6])
def test_full_jitter_stays_within_zero_and_the_exponential_and_spreads_over_it(
    attempt: int,
) -> None:
    policy = RetryPolicy(base=0.5, cap=30.0, jitter=Jitter.FULL)
    expo = policy.exponential(attempt)
    draws = _draws(policy, attempt)
    assert all(0.0 <= d <= expo for d in draws)
    assert min(draws) < 0.05 * expo and max(draws) > 0.95 * expo


@pytest.mark.parametrize("attempt", [1, 2, 3, 6])
def test_equal_jitter_never_waits_less_than_half_the_exponential(attempt: int) -> None:
    policy = RetryPolicy(base=0.5, cap=30.0, jitter=Jitter.EQUAL)
    expo = policy.exponential(attempt)
    draws = _draws(policy, attempt)
    assert all(expo / 2 <= d <= expo for d in draws)
    assert min(draws) < 0.55 * expo and max(draws) > 0.95 * expo


@pytest.mark.parametrize("previous", [None, 0.1, 0.5, 2.0, 7.0, 100.0])
def test_decorrelated_jitter_lies_between_base_and_three_times_the_previous_delay_capped(
    previous: float | None,
) -> None:
    policy = RetryPolicy(base=0.5, cap=10.0, jitter=Jitter.DECORRELATED)
    last = policy.base if previous is None else max(previous, policy.base)
    upper = min(policy.cap, last * 3)
    rng = random.Random(11)
    draws = [policy.backoff(2, previous, rng) for _ in range(DRAWS)]
    assert all(policy.base <= d <= upper for d in draws)


def test_decorrelated_jitter_grows_from_its_previous_delay_across_a_chain_of_retries() -> None:
    """Each delay feeds the next, so a long chain climbs towards the cap."""
    policy = RetryPolicy(base=0.5, cap=10.0, jitter=Jitter.DECORRELATED)
    rng = random.Random(3)
    delay: float | None = None
    chain = []
    for attempt in range(1, 40):
        delay = policy.backoff(attempt, delay, rng)
        chain.append(delay)
    assert max(chain[20:]) > 5.0
    assert all(policy.base <= d <= policy.cap for d in chain)


@pytest.mark.parametrize("attempt", [1, 2, 5, 9])
def test_no_jitter_waits_exactly_the_exponential(attempt: int) -> None:
    policy = RetryPolicy(base=0.5, cap=30.0, jitter=Jitter.NONE)
    assert set(_draws(policy, attempt)) == {policy.exponential(attempt)}


def test_exponential_doubles_from_base_until_the_cap() -> None:
    policy = RetryPolicy(base=0.5, factor=2.0, cap=30.0)
    assert [policy.exponential(n) for n in range(1, 10)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
        30.0,
    ]


def test_exponential_of_a_huge_attempt_is_the_cap_not_an_overflow() -> None:
    assert RetryPolicy(base=1.0, factor=10.0, cap=60.0).exponential(100_000) == 60.0


def test_delays_keep_sub_second_precision() -> None:
    """Celery's own backoff is whole seconds; ours must not round a 0.25 s base to 0 or 1."""
    policy = RetryPolicy(base=0.25, cap=0.9, jitter=Jitter.NONE)
    assert [policy.exponential(n) for n in (1, 2, 3)] == [0.25, 0.5, 0.9]
    full = _draws(RetryPolicy(base=0.25, cap=0.9, jitter=Jitter.FULL), 2)
    assert all(0.0 < d < 1.0 for d in full[:100])
    assert len({round(d, 6) for d in full}) > DRAWS * 0.9
    decision = _decide(RetryPolicy(base=0.25, jitter=Jitter.EQUAL))
    assert decision.retry and 0.125 <= decision.delay <= 0.25


def test_the_same_seed_gives_the_same_delays() -> None:
    policy = RetryPolicy(jitter=Jitter.FULL)
    assert _draws(policy, 3, seed=5) == _draws(policy, 3, seed=5)
    assert _draws(policy, 3, seed=5) != _draws(policy, 3, seed=6)


def test_a_transient_failure_with_attempts_left_is_retried_within_the_jittered_bound() -> None:
    policy = RetryPolicy(max_attempts=3, base=2.0, jitter=Jitter.FULL)
    decision = _decide(policy, attempt=2, rng=random.Random(9))
    expected = policy.backoff(2, None, random.Random(9))
    assert decision == RetryDecision(True, delay=expected, reason="retry")
    assert 0.0 <= decision.delay <= 4.0


def test_retry_after_is_a_floor_even_above_the_cap() -> None:
    """A server asking for 45 s would refuse a retry after the 30 s cap."""
    policy = RetryPolicy(cap=30.0, jitter=Jitter.FULL)
    decision = _decide(policy, error_type=ErrorType.RATE_LIMITED, retry_after=45.0)
    assert decision.retry and decision.delay == 45.0


def test_retry_after_shorter_than_the_backoff_does_not_shorten_it() -> None:
    policy = RetryPolicy(base=4.0, jitter=Jitter.NONE)
    decision = _decide(policy, error_type=ErrorType.RATE_LIMITED, retry_after=0.5)
    assert decision.delay == 4.0


def test_the_last_attempt_is_never_retried() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert _decide(policy, attempt=2).retry
    exhausted = _decide(policy, attempt=3)
    assert exhausted == RetryDecision(False, reason="attempts_exhausted")


def test_a_single_attempt_policy_never_retries() -> None:
    assert _decide(RetryPolicy(max_attempts=1)).reason == "attempts_exhausted"


@pytest.mark.parametrize(
    "error_type",
    sorted(set(ErrorType) - TRANSIENT_TYPES),
)
def test_permanent_error_types_are_not_retried_by_default(error_type: ErrorType) -> None:
    decision = _decide(RetryPolicy(max_attempts=5), error_type=error_type)
    assert decision == RetryDecision(False, reason="not_retryable")


@pytest.mark.parametrize("error_type", sorted(TRANSIENT_TYPES))
def test_transient_error_types_are_retried_by_default(error_type: ErrorType) -> None:
    assert _decide(RetryPolicy(), error_type=error_type).retry


def test_retry_on_narrows_what_is_retried() -> None:
    policy = RetryPolicy(retry_on=frozenset({ErrorType.RATE_LIMITED}))
    assert _decide(policy, error_type=ErrorType.RATE_LIMITED).retry
    assert _decide(policy, error_type=ErrorType.TIMEOUT).reason == "not_retryable"


def test_retry_on_accepts_the_string_names_of_error_types() -> None:
    policy = RetryPolicy(retry_on=frozenset({"timeout"}))  # type: ignore[arg-type]
    assert policy.retry_on == frozenset({ErrorType.TIMEOUT})
    assert RetryPolicy(jitter="equal").jitter is Jitter.EQUAL  # type: ignore[arg-type]


def test_a_retry_that_would_start_after_the_deadline_is_refused() -> None:
    policy = RetryPolicy(base=5.0, jitter=Jitter.NONE)
    decision = _decide(policy, now=NOW, deadline=NOW + 4.9)
    assert decision == RetryDecision(False, delay=5.0, reason="deadline")


def test_a_retry_that_would_start_exactly_at_the_deadline_is_refused() -> None:
    policy = RetryPolicy(base=5.0, jitter=Jitter.NONE)
    assert _decide(policy, now=NOW, deadline=NOW + 5.0).reason == "deadline"
    assert _decide(policy, now=NOW, deadline=NOW + 5.001).retry


def test_a_retry_after_beyond_the_deadline_is_refused_even_when_the_backoff_fits() -> None:
    policy = RetryPolicy(base=0.1, jitter=Jitter.NONE)
    decision = _decide(
        policy, error_type=ErrorType.RATE_LIMITED, retry_after=120.0, deadline=NOW + 60.0
    )
    assert decision == RetryDecision(False, delay=120.0, reason="deadline")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"base": -0.1},
        {"cap": -1.0},
        {"factor": 0.5},
        {"jitter": "sometimes"},
        {"retry_on": frozenset({"not_a_type"})},
    ],
)
def test_an_impossible_policy_is_a_configuration_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_policy_is_frozen() -> None:
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.max_attempts = 10  # type: ignore[misc]


def test_policy_delays_are_finite_floats() -> None:
    policy = RetryPolicy(base=0.5, factor=3.0, cap=12.0)
    for attempt in range(1, 50):
        delay = policy.backoff(attempt, None, random.Random(attempt))
        assert isinstance(delay, float) and math.isfinite(delay)


@pytest.mark.parametrize("field", ["base", "cap", "factor"])
def test_a_nan_backoff_setting_is_refused(field: str) -> None:
    """NaN fails every comparison; unchecked it would make every delay NaN."""
    with pytest.raises(ConfigurationError):
        RetryPolicy(**{field: math.nan})  # type: ignore[arg-type]
