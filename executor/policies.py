"""Every policy a tool or a run declares, as plain frozen data in one place.

A policy says *what* should happen (how often to retry, when a breaker opens,
how much a run may spend); the decision functions that apply it live beside
their I/O (``toolexec.retry``, ``toolexec.breaker``, ``toolexec.layers.retry_budget``,
``toolexec.layers.ratelimit``, ``toolexec.guard``) and import it from here. Each
policy checks itself when built, so a bad declaration fails at import time of
the tool module, and each travels through the catalog as JSON (clients have
no tool code), so this module imports nothing that talks to Redis.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from toolexec.bounds import MAX_SECONDS
from toolexec.errors import TRANSIENT_TYPES, ConfigurationError, ErrorType

if TYPE_CHECKING:
    from toolexec.fallback.steps import FallbackStep

__all__ = [
    "ApprovalPolicy",
    "BreakerPolicy",
    "Jitter",
    "RateLimitPolicy",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "RunBudget",
    "ToolPolicy",
    "known_fields",
]

_P = TypeVar("_P")


def known_fields(cls: type[_P], raw: Mapping[str, Any]) -> _P:
    """Build ``cls`` from the fields of ``raw`` it knows.

    A catalog written by a newer worker may carry fields this process does not
    know yet; ignoring them keeps old clients working during a rolling upgrade.
    """
    names = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: raw[k] for k in names if k in raw})


class Jitter(StrEnum):
    """How a backoff is spread; Brooker (2015) compares them under contention."""

    NONE = "none"  # plain exponential: every client retries in lock-step
    FULL = "full"  # uniform(0, expo): fewest calls under contention
    EQUAL = "equal"  # expo/2 + uniform(0, expo/2): never retries at once
    DECORRELATED = "decorrelated"  # min(cap, uniform(base, previous * 3))


@dataclass(frozen=True)
class RetryPolicy:
    """How many times to try a tool and how long to wait between tries.

    ``base`` and ``cap`` are seconds; attempt ``n`` (1-based) that failed is
    followed by ``min(cap, base * factor ** (n - 1))`` before jitter.
    """

    max_attempts: int = 3
    base: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    jitter: Jitter = Jitter.FULL
    retry_on: frozenset[ErrorType] = field(default=TRANSIENT_TYPES)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, not {self.max_attempts}")
        # Written as 'not (x >= 0)' so that NaN, which fails every comparison, is refused too.
        if not (self.base >= 0 and self.cap >= 0 and self.factor >= 1):
            raise ConfigurationError(
                f"backoff needs base >= 0, cap >= 0 and factor >= 1 "
                f"(got base={self.base}, cap={self.cap}, factor={self.factor})"
            )
        try:
            object.__setattr__(self, "jitter", Jitter(self.jitter))
            object.__setattr__(self, "retry_on", frozenset(ErrorType(t) for t in self.retry_on))
        except ValueError as exc:  # a declaration error, like the checks above
            raise ConfigurationError(f"retry policy: {exc}") from exc

    def exponential(self, attempt: int) -> float:
        """The un-jittered delay after failed attempt ``attempt`` (1-based)."""
        exponent = min(attempt - 1, 64)  # beyond this the cap has long been reached
        return min(self.cap, self.base * self.factor**exponent)

    def backoff(self, attempt: int, previous: float | None, rng: random.Random) -> float:
        """The jittered delay after failed attempt ``attempt``."""
        expo = self.exponential(attempt)
        if self.jitter is Jitter.FULL:
            return rng.uniform(0.0, expo)
        if self.jitter is Jitter.EQUAL:
            return expo / 2 + rng.uniform(0.0, expo / 2)
        if self.jitter is Jitter.DECORRELATED:
            last = self.base if previous is None else max(previous, self.base)
            return min(self.cap, rng.uniform(self.base, last * 3))
        return expo


_MAX_WINDOW = 10_000  # the window is a string of that many marks in the hash


@dataclass(frozen=True)
class BreakerPolicy:
    """When one breaker opens, how long it stays open and how it probes.

    Every process using a breaker must pass the same policy (it comes from the
    tool's declaration): the policy travels into each script call and is not
    stored in Redis. ``None`` turns a trip condition off. ``probe_lease_s``
    should exceed the tool's timeout, or a live probe's permit is handed on.
    """

    enabled: bool = True
    consecutive_failures: int | None = 5
    failure_rate: float | None = 0.5
    window_size: int = 20
    min_calls: int = 10
    slow_call_s: float | None = None
    #: The first open; each trip that follows without a calm spell in between stays
    #: open ``open_factor`` times longer, up to ``max_open_s`` (docs/breaker.md).
    open_s: float = 2.0
    open_factor: float = 2.0
    max_open_s: float = 60.0
    half_open_probes: int = 2
    close_after: int = 1
    probe_lease_s: float = 60.0
    #: Longest a call refused by this breaker waits for its next probe instead of
    #: failing at once (only on a first trip, or while a probe is in flight); 0: never.
    max_wait_s: float = 2.0

    def __post_init__(self) -> None:
        problems = [message for bad, message in self._checks() if bad]
        if problems:
            raise ConfigurationError("invalid breaker policy: " + "; ".join(problems))

    def _checks(self) -> list[tuple[bool, str]]:
        n, rate, slow = self.consecutive_failures, self.failure_rate, self.slow_call_s
        return [
            (n is not None and n < 1, f"consecutive_failures must be >= 1 or None, not {n}"),
            (rate is not None and not 0 < rate <= 1, f"failure_rate must be in (0, 1], not {rate}"),
            (
                not 1 <= self.window_size <= _MAX_WINDOW,
                f"window_size must be in 1..{_MAX_WINDOW}, not {self.window_size}",
            ),
            (
                not 1 <= self.min_calls <= self.window_size,
                f"min_calls must be in 1..window_size, not {self.min_calls}",
            ),
            (slow is not None and slow <= 0, f"slow_call_s must be positive or None, not {slow}"),
            (
                not 0 < self.open_s <= MAX_SECONDS,  # NaN fails too: it becomes a TTL
                f"open_s must be positive and finite, not {self.open_s}",
            ),
            (
                not 1 <= self.open_factor <= 100,
                f"open_factor must be in 1..100, not {self.open_factor}",
            ),
            (
                not 0 < self.max_open_s <= MAX_SECONDS,
                f"max_open_s must be positive and finite, not {self.max_open_s}",
            ),
            (
                not 0 <= self.max_wait_s <= MAX_SECONDS,
                f"max_wait_s must be >= 0 and finite, not {self.max_wait_s}",
            ),
            (
                self.half_open_probes < 1,
                f"half_open_probes must be >= 1, not {self.half_open_probes}",
            ),
            (self.close_after < 1, f"close_after must be >= 1, not {self.close_after}"),
            (
                not 0 < self.probe_lease_s <= MAX_SECONDS,
                f"probe_lease_s must be positive and finite, not {self.probe_lease_s}",
            ),
            (
                self.enabled and n is None and rate is None,
                "an enabled breaker needs consecutive_failures or failure_rate",
            ),
        ]

    def open_for(self, trips: int) -> float:
        """Seconds the ``trips``-th consecutive trip keeps it open (Envoy's growing ejection).

        A first trip is short, so a blip that opened it costs a probe soon; each
        trip that follows without a calm spell in between doubles it (by default),
        so a service that stays down is asked less and less often. Never shorter
        than ``open_s``, never longer than ``max_open_s`` (or ``open_s`` if larger).
        """
        exponent = min(max(trips, 1) - 1, 64)
        return min(max(self.open_s, self.max_open_s), self.open_s * self.open_factor**exponent)

    def is_slow(self, duration_s: float) -> bool:
        """Whether a call that took ``duration_s`` counts as a failure for being slow."""
        return self.slow_call_s is not None and duration_s > self.slow_call_s

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BreakerPolicy:
        """The policy a catalog entry describes (clients have no tool code)."""
        return known_fields(cls, raw)

    def to_json(self) -> dict[str, Any]:
        """Every field, as the catalog publishes it (all are JSON values)."""
        return asdict(self)


@dataclass(frozen=True)
class RetryBudgetPolicy:
    """How many retries a tool's callers may make together; see the module docstring.

    ``key_argument`` names an argument holding a URL to keep one budget per
    downstream host (``http_request@api.example.com``), as ``breaker_key`` does
    for breakers. Every worker must use the same policy for one budget.
    """

    enabled: bool = True
    kind: Literal["ratio", "tokens"] = "ratio"
    ratio: float = 0.1
    window_s: float = 10.0
    min_retries: int = 10
    max_tokens: float = 100.0
    token_ratio: float = 0.1
    key_argument: str | None = None
    #: Longest a call whose retry a ratio budget refused waits for budget instead of
    #: ending at once, while the retries it waits for are succeeding; 0: never.
    max_wait_s: float = 5.0

    def __post_init__(self) -> None:
        problems = [message for bad, message in self._checks() if bad]
        if problems:
            raise ConfigurationError("invalid retry budget: " + "; ".join(problems))

    def _checks(self) -> list[tuple[bool, str]]:
        return [
            (
                self.kind not in ("ratio", "tokens"),
                f"kind must be ratio or tokens, not {self.kind}",
            ),
            (not 0 <= self.ratio <= 1, f"ratio must be in [0, 1], not {self.ratio}"),
            (
                not 0 < self.window_s <= MAX_SECONDS,  # NaN fails too: it becomes a TTL
                f"window_s must be positive and finite, not {self.window_s}",
            ),
            (self.min_retries < 0, f"min_retries must be >= 0, not {self.min_retries}"),
            (
                not 0 < self.max_tokens <= 1000,
                f"max_tokens must be in (0, 1000], not {self.max_tokens}",
            ),
            (
                not 0 < self.token_ratio <= 1,
                f"token_ratio must be in (0, 1], not {self.token_ratio}",
            ),
            (
                not 0 <= self.max_wait_s <= MAX_SECONDS,
                f"max_wait_s must be >= 0 and finite, not {self.max_wait_s}",
            ),
        ]

    def to_json(self) -> dict[str, Any]:
        """Every field, as the catalog publishes it (all are JSON values)."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RetryBudgetPolicy:
        return known_fields(cls, raw)


@dataclass(frozen=True)
class RateLimitPolicy:
    """At most ``rate`` calls per second for the whole fleet, ``burst`` of them at once."""

    rate: float
    burst: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ConfigurationError(f"a rate limit needs a positive rate, not {self.rate}")
        if self.burst < 1:
            raise ConfigurationError(f"a rate limit's burst must be at least 1, not {self.burst}")

    @property
    def interval(self) -> float:
        """Seconds between calls at the sustained rate."""
        return 1.0 / self.rate

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RateLimitPolicy:
        return known_fields(cls, raw)

    def describe(self) -> str:
        return f"{self.rate:g}/s, burst {self.burst}"


@dataclass(frozen=True)
class ApprovalPolicy:
    """A person approves each call before its first attempt (``@tool(approval=...)``).

    ``timeout_s`` bounds the wait for a decision (never past the call's deadline);
    the call is parked in the queue meanwhile and looks again every ``poll_s``.
    ``prompt`` is what the approver reads (default: the tool and its arguments).
    """

    timeout_s: float = 300.0
    poll_s: float = 1.0
    prompt: str | None = None

    def __post_init__(self) -> None:
        for name in ("timeout_s", "poll_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"ApprovalPolicy.{name} must be positive, not {value!r}")

    def to_json(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s, "poll_s": self.poll_s, "prompt": self.prompt}


@dataclass(frozen=True)
class ToolPolicy:
    """How the executor runs one tool; docs/guides/tools.md says what each field does."""

    timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    queue: str | None = None
    side_effects: bool = False
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    breaker_key: str | None = None
    coalesce: bool = False  # read-only: identical calls in flight share one execution
    payload_threshold_bytes: int | None = None  # None: the settings' value (toolexec.payloads)
    payload_token_budget: int | None = None
    #: Largest result, as stored JSON or text, the tool may return; None: the settings'
    #: ``payload_max_bytes``. A larger one is ``result_too_large``, never stored.
    max_result_bytes: int | None = None
    fallbacks: tuple[FallbackStep, ...] = ()  # toolexec.fallback.steps; checked by check_chain
    retry_budget: RetryBudgetPolicy = field(default_factory=RetryBudgetPolicy)
    rate_limit: RateLimitPolicy | None = None  # None: unlimited
    #: The priority of the tool's calls when the caller names none (1 most urgent … 5;
    #: None: 3). ``toolexec.fairness``.
    priority: int | None = None
    #: The most calls of this tool running at once across the fleet (None: no cap); the
    #: excess waits in a lane of its own (``toolexec.transport.lanes``, a Redis broker).
    max_in_flight: int | None = None
    approval: ApprovalPolicy | None = None  # None: runs without asking (toolexec.layers.approvals)

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and (
            type(self.max_in_flight) is not int or not 1 <= self.max_in_flight <= 100_000
        ):
            raise ConfigurationError(
                f"a tool's max_in_flight must be a whole number from 1 to 100000, "
                f"not {self.max_in_flight!r}"
            )
        if self.priority is not None and (
            type(self.priority) is not int or not 1 <= self.priority <= 5
        ):
            raise ConfigurationError(
                f"a tool's priority must be a whole number from 1 (most urgent) to 5, "
                f"not {self.priority!r}"
            )
        if not self.timeout > 0:
            raise ConfigurationError(f"a tool's timeout must be positive, not {self.timeout}")
        if self.coalesce and self.side_effects:
            raise ConfigurationError(
                "coalesce=True is for read-only tools; a tool with side_effects=True is "
                "already deduplicated by its idempotency key"
            )
        _check_payload_limits(self.payload_threshold_bytes, self.payload_token_budget)
        if self.max_result_bytes is not None and self.max_result_bytes <= 0:
            raise ConfigurationError(
                f"max_result_bytes must be positive or None, not {self.max_result_bytes}"
            )
        if self.breaker.enabled and self.breaker.probe_lease_s <= self.timeout:
            raise ConfigurationError(
                f"the breaker's probe_lease_s ({self.breaker.probe_lease_s} s) must exceed the "
                f"tool's timeout ({self.timeout} s), or a live probe's permit is handed on"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "max_attempts": self.retry.max_attempts,
            "backoff_base": self.retry.base,
            "backoff_factor": self.retry.factor,
            "backoff_cap": self.retry.cap,
            "jitter": str(self.retry.jitter),
            "retry_on": sorted(str(t) for t in self.retry.retry_on),
            "queue": self.queue,
            "side_effects": self.side_effects,
            "coalesce": self.coalesce,
            "breaker": self.breaker.to_json(),
            "breaker_key": self.breaker_key,
            "fallbacks": [step.describe() for step in self.fallbacks],
            "retry_budget": self.retry_budget.to_json(),
            "rate_limit": None if self.rate_limit is None else self.rate_limit.to_json(),
            **({} if self.priority is None else {"priority": self.priority}),
            **({} if self.max_in_flight is None else {"max_in_flight": self.max_in_flight}),
            "approval": None if self.approval is None else self.approval.to_json(),
        }


def _check_payload_limits(threshold: int | None, budget: int | None) -> None:
    """A tool's own payload limits; 200 tokens is the smallest budget a preview fits
    (``toolexec.payloads.tokens.MIN_TOKEN_BUDGET``)."""
    if threshold is not None and threshold <= 0:
        raise ConfigurationError(f"payload_threshold_bytes must be positive, not {threshold}")
    if budget is not None and budget < 200:
        raise ConfigurationError(
            f"payload_token_budget must be at least 200 tokens (a preview's note alone "
            f"takes ~120), not {budget}"
        )


@dataclass(frozen=True)
class RunBudget:
    """The limits of one run, and how eagerly repetition counts as a loop.

    A step is one round: one model response's tool calls, however many. ``None``
    turns a limit off. The budget is stored with the run, so a guard built
    later without one adopts it; a guard built with one replaces it (that is
    how an operator extends a run).
    """

    max_steps: int | None = 25
    max_wall_s: float | None = 600.0
    max_consecutive_failures: int | None = 5
    max_tool_errors: int | None = 15
    max_tokens: int | None = None
    repeat_threshold: int = 3
    repeat_window: int = 10
    cycle_max_length: int = 3
    cycle_repeats: int = 2
    no_progress_rounds: int = 3

    def __post_init__(self) -> None:
        problems = [message for bad, message in self._checks() if bad]
        if problems:
            raise ConfigurationError("invalid run budget: " + "; ".join(problems))

    def _checks(self) -> list[tuple[bool, str]]:
        limits = {
            "max_steps": self.max_steps,
            "max_wall_s": self.max_wall_s,
            "max_consecutive_failures": self.max_consecutive_failures,
            "max_tool_errors": self.max_tool_errors,
            "max_tokens": self.max_tokens,
        }
        checks = [
            (  # written so that NaN and infinity fail too: the wall time becomes a TTL
                value is not None and not 0 < value <= MAX_SECONDS,
                f"{name} must be positive and finite, or None, not {value}",
            )
            for name, value in limits.items()
        ]
        return [
            *checks,
            (
                self.repeat_threshold < 2,
                f"repeat_threshold must be >= 2, not {self.repeat_threshold}",
            ),
            (
                self.repeat_window < self.repeat_threshold,
                f"repeat_window must be >= repeat_threshold, not {self.repeat_window}",
            ),
            (
                self.cycle_max_length < 2,
                f"cycle_max_length must be >= 2, not {self.cycle_max_length}",
            ),
            (self.cycle_repeats < 2, f"cycle_repeats must be >= 2, not {self.cycle_repeats}"),
            (
                self.no_progress_rounds < 2,
                f"no_progress_rounds must be >= 2, not {self.no_progress_rounds}",
            ),
        ]

    @property
    def window(self) -> int:
        """Calls of history the detectors need: enough for the longest repeated cycle."""
        return max(self.repeat_window, self.cycle_max_length * self.cycle_repeats)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunBudget:
        return known_fields(cls, raw)
