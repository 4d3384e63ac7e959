"""What a breaker is: when it opens, how long it stays open, and what it is named after.

Plain data shared by the tool's declaration (``@tool(breaker=...)``), the
catalog (clients have no tool code) and every script call: the policy travels
into each call and is not stored in Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from toolexec.errors import TRANSIENT_TYPES, ConfigurationError, ToolException

__all__ = ["BreakerPolicy", "breaker_name", "counts_as_failure"]

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
    open_s: float = 30.0
    half_open_probes: int = 2
    close_after: int = 2
    probe_lease_s: float = 60.0

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
            (self.open_s <= 0, f"open_s must be positive, not {self.open_s}"),
            (
                self.half_open_probes < 1,
                f"half_open_probes must be >= 1, not {self.half_open_probes}",
            ),
            (self.close_after < 1, f"close_after must be >= 1, not {self.close_after}"),
            (self.probe_lease_s <= 0, f"probe_lease_s must be positive, not {self.probe_lease_s}"),
            (
                self.enabled and n is None and rate is None,
                "an enabled breaker needs consecutive_failures or failure_rate",
            ),
        ]

    def is_slow(self, duration_s: float) -> bool:
        """Whether a call that took ``duration_s`` counts as a failure for being slow."""
        return self.slow_call_s is not None and duration_s > self.slow_call_s

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BreakerPolicy:
        """The policy a catalog entry describes (clients have no tool code)."""
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def to_json(self) -> dict[str, Any]:
        """Every field, as the catalog publishes it (all are JSON values)."""
        return asdict(self)


def breaker_name(tool: str, key_argument: str | None, arguments: Mapping[str, Any]) -> str:
    """``tool``, or ``tool@host`` when the tool keeps a breaker per downstream host.

    Retry budgets are named the same way, so one host's breaker and budget agree.
    """
    if key_argument:
        value = arguments.get(key_argument)
        host = urlsplit(value).hostname if isinstance(value, str) else None
        if host:
            return f"{tool}@{host}"
    return tool


def counts_as_failure(failure: ToolException | None) -> bool:
    """Only transient failures say the service is unhealthy.

    A 404 or a 400 means the service answered; an agent's mistake must never
    cut everyone else off from a healthy service (nor spend its retry budget).
    """
    return failure is not None and failure.error_type in TRANSIENT_TYPES
