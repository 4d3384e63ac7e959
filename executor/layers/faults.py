"""Fault injection: make a tool fail, slow down or lie on purpose, reproducibly.

Agents and this executor both have to be tested against the failures they
will meet: a 503 storm, a slow dependency, a plausible wrong answer. Like
Polly's chaos strategies, a :class:`FaultConfig` per tool injects, for a
share ``rate`` of attempts, an error of a chosen type (``--error``) or a
replaced outcome (``--outcome``), and adds ``latency`` seconds to a share
``latency_rate`` of them. The fault layer sits innermost, right around the
tool body, so breakers, retries and retry budgets see injected failures
exactly as they would see real ones; every result touched by one says
``injected: true``.

Reproducible: the n-th attempt of a tool since its config was set meets a
fate drawn from ``(seed, n)`` alone (:meth:`FaultConfig.plan`), and n is
counted in Redis for the whole fleet, so a seed replays the same sequence
whichever workers run the calls.

Safe by default: configs come from ``TOOLEXEC_FAULTS`` or from
``toolexec faults set`` (a Redis hash), and a worker applies them only when it
was started with ``TOOLEXEC_FAULTS_ENABLED=true``; otherwise it ignores them
and logs a warning, so a config left in a production Redis does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.errors import (
    ClientError,
    ConfigurationError,
    ErrorType,
    ForbiddenError,
    InvalidArgumentsError,
    NotFoundError,
    RateLimitedError,
    ToolConnectionError,
    ToolException,
    ToolTimeoutError,
    UnauthorizedError,
    UnavailableError,
)
from toolexec.keys import FAULT_SEQUENCE_TTL_S, Keys
from toolexec.layers import Attempt, Layer, Outcome, Proceed
from toolexec.stores.failopen import REDIS_ERRORS, FailOpen

__all__ = ["INJECTABLE", "FaultConfig", "FaultLayer", "FaultPlan", "FaultStore", "injected_error"]

log = logging.getLogger("toolexec.layers.faults")

#: The failures a tool itself can meet, and the exception each is raised as.
INJECTABLE: dict[ErrorType, type[ToolException]] = {
    ErrorType.TIMEOUT: ToolTimeoutError,
    ErrorType.CONNECTION_ERROR: ToolConnectionError,
    ErrorType.RATE_LIMITED: RateLimitedError,
    ErrorType.UNAVAILABLE: UnavailableError,
    ErrorType.UNAUTHORIZED: UnauthorizedError,
    ErrorType.FORBIDDEN: ForbiddenError,
    ErrorType.NOT_FOUND: NotFoundError,
    ErrorType.CLIENT_ERROR: ClientError,
    ErrorType.INVALID_ARGUMENTS: InvalidArgumentsError,
    ErrorType.TOOL_ERROR: ToolException,
}


@dataclass(frozen=True)
class FaultPlan:
    """What the n-th attempt of a tool meets: added latency, then an error or a fake outcome."""

    n: int
    latency: float = 0.0
    error: ErrorType | None = None
    replace_outcome: bool = False

    @property
    def injected(self) -> bool:
        return self.latency > 0 or self.error is not None or self.replace_outcome


@dataclass(frozen=True)
class FaultConfig:
    """One tool's faults; see the module docstring.

    ``rate`` is the share of attempts that fail with ``error`` (``unavailable``
    when neither it nor ``outcome`` is given) or return ``outcome`` (any JSON)
    instead of running; ``latency`` seconds are added to a share
    ``latency_rate`` of attempts, before the tool runs.
    """

    rate: float = 0.0
    error: ErrorType | None = None
    outcome: Any = None
    latency: float = 0.0
    latency_rate: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.error is not None:
            try:
                object.__setattr__(self, "error", ErrorType(self.error))
            except ValueError as exc:
                raise ConfigurationError(f"fault config: {exc}") from exc
        problems = [message for bad, message in self._checks() if bad]
        if problems:
            raise ConfigurationError("invalid fault config: " + "; ".join(problems))

    def _checks(self) -> list[tuple[bool, str]]:
        known = ", ".join(sorted(str(t) for t in INJECTABLE))
        return [
            (not _share(self.rate), f"rate must be in [0, 1], not {self.rate}"),
            (
                not _share(self.latency_rate),
                f"latency_rate must be in [0, 1], not {self.latency_rate}",
            ),
            (
                not (math.isfinite(self.latency) and self.latency >= 0),
                f"latency must be >= 0 seconds, not {self.latency}",
            ),
            (
                self.error is not None and self.error not in INJECTABLE,
                f"{self.error} is not a failure a tool raises; use one of {known}",
            ),
            (
                self.error is not None and self.outcome is not None,
                "give an error or a replaced outcome, not both",
            ),
            (
                self.rate == 0 and self.latency == 0,
                "this config injects nothing: give a rate or a latency",
            ),
        ]

    @property
    def fault(self) -> ErrorType | None:
        """The error injected at ``rate``; None when the outcome is replaced instead."""
        if self.outcome is not None:
            return None
        return self.error or ErrorType.UNAVAILABLE

    def plan(self, n: int) -> FaultPlan:
        """The fate of the n-th attempt: a pure function of (seed, n)."""
        rng = random.Random(f"toolexec-faults:{self.seed}:{n}")
        faulted = rng.random() < self.rate
        slowed = self.latency > 0 and rng.random() < self.latency_rate
        return FaultPlan(
            n=n,
            latency=self.latency if slowed else 0.0,
            error=self.fault if faulted else None,
            replace_outcome=faulted and self.fault is None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "error": None if self.error is None else str(self.error),
            "outcome": self.outcome,
            "latency": self.latency,
            "latency_rate": self.latency_rate,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FaultConfig:
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigurationError(f"fault config: unknown fields {sorted(unknown)}")
        return cls(**raw)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _share(value: float) -> bool:
    return math.isfinite(value) and 0 <= value <= 1


def injected_error(plan: FaultPlan, tool: str, seed: int) -> ToolException:
    """The exception an injected failure raises, saying plainly that it was injected."""
    assert plan.error is not None
    return INJECTABLE[plan.error](
        f"injected fault: {plan.error} for attempt #{plan.n} of {tool!r} (seed {seed})",
        suggestion="This failure was injected on purpose to test error handling; "
        "treat it as the real one.",
        details={"injected": True},
    )


class FaultStore:
    """Fault configs set at run time (``toolexec faults``), and each tool's attempt count."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.redis = client
        self.keys = keys or Keys()

    def set(self, tool: str, config: FaultConfig) -> None:
        """Install ``config`` for ``tool``; its sequence starts again at attempt 1."""
        # Not a MULTI: the config and the sequence are in different Redis Cluster
        # slots; a worker that draws between the two steps only counts from 2.
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.faults(), tool, json.dumps(config.to_json()))
        pipe.delete(self.keys.fault_sequence(tool))
        pipe.execute()

    def clear(self, tool: str | None = None) -> list[str]:
        """Remove ``tool``'s config, or every config; returns the tools cleared."""
        tools = [tool] if tool else sorted(self.all())
        if tools:
            pipe = self.redis.pipeline(transaction=False)  # two slots: see set()
            pipe.hdel(self.keys.faults(), *tools)
            pipe.delete(*(self.keys.fault_sequence(t) for t in tools))
            pipe.execute()
        return tools

    def all(self) -> dict[str, FaultConfig]:
        raw = self.redis.hgetall(self.keys.faults())
        return {
            _text(tool): FaultConfig.from_json(json.loads(value)) for tool, value in raw.items()
        }

    def count(self) -> int:
        return int(self.redis.hlen(self.keys.faults()))

    def next_index(self, tool: str) -> int:
        """n for the next attempt of ``tool``, counted for every worker together."""
        key = self.keys.fault_sequence(tool)
        pipe = self.redis.pipeline()
        pipe.incr(key)
        pipe.expire(key, FAULT_SEQUENCE_TTL_S)
        n, _ = pipe.execute()
        return int(n)


class FaultLayer(Layer):
    """Injects each tool's configured faults around the tool body, when enabled.

    ``static`` configs come from settings; configs in the store (Redis)
    override them per tool and are re-read at most every ``refresh_s``.
    Disabled, the layer only passes calls through, and warns (at most every
    ``warn_interval_s``) if configs are waiting that it ignores.
    """

    name = "faults"

    def __init__(
        self,
        store: FaultStore | None,
        *,
        enabled: bool,
        static: Mapping[str, FaultConfig] | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        refresh_s: float = 1.0,
        warn_interval_s: float = 60.0,
    ) -> None:
        self.store = store
        self.enabled = enabled
        self.static = dict(static or {})
        self.clock = clock or SystemClock()
        self.sleep = sleep
        self.refresh_s = refresh_s
        self.warn_interval_s = warn_interval_s
        self.fail_open = FailOpen("fault injection", clock=clock)
        self._lock = threading.Lock()
        self._configs: dict[str, FaultConfig] = dict(self.static)
        self._read_at = float("-inf")
        self._checked_at = float("-inf")
        if not enabled and self.static:
            _warn_ignored(sorted(self.static), "TOOLEXEC_FAULTS")

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        if not self.enabled:
            self._warn_if_waiting()
            return proceed()
        config = self._configs_now().get(attempt.tool)
        if config is None:
            return proceed()
        plan = self._plan(attempt.tool, config)
        if plan is None or not plan.injected:
            return proceed()
        return self._inject(plan, config, attempt, proceed)

    def _plan(self, tool: str, config: FaultConfig) -> FaultPlan | None:
        if self.store is None or self.fail_open.down():
            return None
        try:
            return config.plan(self.store.next_index(tool))
        except REDIS_ERRORS as exc:
            self.fail_open.failed(exc, "no faults are injected meanwhile")
            return None

    def _inject(
        self, plan: FaultPlan, config: FaultConfig, attempt: Attempt, proceed: Proceed
    ) -> Outcome:
        if plan.latency >= attempt.limit:
            self.sleep(attempt.limit)
            timeout = ToolTimeoutError(
                f"injected latency of {plan.latency:g} s for attempt #{plan.n} of "
                f"{attempt.tool!r} outlasted its {attempt.limit:g} s limit",
                details={"injected": True},
            )
            return Outcome(failure=timeout, duration_s=attempt.limit, injected=True)
        if plan.latency:
            self.sleep(plan.latency)
        if plan.error is not None:
            failure = injected_error(plan, attempt.tool, config.seed)
            return Outcome(failure=failure, duration_s=plan.latency, injected=True)
        if plan.replace_outcome:
            return Outcome(data=config.outcome, duration_s=plan.latency, injected=True)
        outcome = proceed()
        return replace(outcome, duration_s=outcome.duration_s + plan.latency, injected=True)

    def _configs_now(self) -> dict[str, FaultConfig]:
        now = self.clock.now()
        with self._lock:
            if now - self._read_at < self.refresh_s or self.store is None:
                return self._configs
            self._read_at = now
        configs = dict(self.static)
        try:
            configs.update(self.store.all())
        except REDIS_ERRORS as exc:
            self.fail_open.failed(exc, "the last fault configs read stay in force meanwhile")
            return self._configs
        except ConfigurationError:
            log.exception("a fault config in Redis is invalid; the previous configs stay")
            return self._configs
        with self._lock:
            self._configs = configs
        return configs

    def _warn_if_waiting(self) -> None:
        now = self.clock.now()
        with self._lock:
            if self.store is None or now - self._checked_at < self.warn_interval_s:
                return
            self._checked_at = now
        try:
            waiting = self.store.count()
        except REDIS_ERRORS:
            return
        if waiting:
            _warn_ignored([f"{waiting} tool(s)"], "toolexec faults set")


def _warn_ignored(what: list[str], source: str) -> None:
    log.warning(
        "fault configs for %s (from %s) are ignored: fault injection is off on this worker; "
        "start it with TOOLEXEC_FAULTS_ENABLED=true to apply them (never in production)",
        ", ".join(what),
        source,
    )
