"""Circuit breakers shared by every worker and client, exact across a fleet.

A breaker's whole state lives in one Redis hash (plus a sorted set of probe
permits), and every transition runs inside one Lua script: the threshold check
and the move to open are one atomic step, so 50 workers failing at once open
it exactly once. pybreaker's Redis storage checks and opens in separate round
trips, resilience4j and Polly keep breakers per process, and LiteLLM's shared
cooldowns lag by seconds (docs/background.md, Resilience systems); none of these can promise that.

Time comes from the injected :class:`~toolexec.clock.Clock` when there is one
(tests: exact, no sleeping), otherwise from Redis ``TIME`` inside the script,
so that clock skew between hosts cannot open or close a breaker early.

States::

    closed ──(N consecutive failures, or failure rate >= threshold
    │         over the last window_size calls, at least min_calls)──> open
    open ──(open_until passed; the next acquire)──> half_open
    half_open ──(M probe successes)──> closed
    half_open ──(one probe failure)──> open
    any ──trip──> open (for some seconds, or isolated until reset)
    any ──reset──> closed

Only outcomes that say something about the service are recorded: the caller
never records agent-fixable errors (invalid arguments, 404), so they cannot
trip a breaker. Every transition bumps a generation number; an outcome of a
call admitted under an earlier generation is ignored, except that a
Retry-After may still push a current open-until later (never earlier).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import redis
import redis.exceptions
from redis.commands.core import Script

from toolexec.clock import Clock
from toolexec.errors import (
    CircuitOpenError,
    ConfigurationError,
    RedisUnavailableError,
    UsageError,
)
from toolexec.keys import BREAKER_IDLE_TTL_S, Keys

__all__ = [
    "Admission",
    "BreakerPolicy",
    "BreakerState",
    "BreakerView",
    "CircuitBreaker",
    "Listener",
    "Transition",
    "TransitionReason",
]

log = logging.getLogger(__name__)

#: What Redis being away looks like; anything else (a script error) is a bug and raises.
_UNREACHABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
)
_MAX_WINDOW = 10_000  # the window is a string of that many marks in the hash


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class TransitionReason(StrEnum):
    CONSECUTIVE_FAILURES = "consecutive_failures"
    FAILURE_RATE = "failure_rate"
    OPEN_ELAPSED = "open_elapsed"
    PROBE_FAILED = "probe_failed"
    PROBES_SUCCEEDED = "probes_succeeded"
    TRIPPED = "tripped"
    RESET = "reset"


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
        return {
            "enabled": self.enabled,
            "consecutive_failures": self.consecutive_failures,
            "failure_rate": self.failure_rate,
            "window_size": self.window_size,
            "min_calls": self.min_calls,
            "slow_call_s": self.slow_call_s,
            "open_s": self.open_s,
            "half_open_probes": self.half_open_probes,
            "close_after": self.close_after,
            "probe_lease_s": self.probe_lease_s,
        }


def _refusal(name: str, state: BreakerState | None, retry_after: float | None) -> CircuitOpenError:
    if state is None:
        why = "cannot reach its Redis and is set to refuse calls meanwhile"
    elif state is BreakerState.HALF_OPEN:
        why = "half-open: the calls that test whether the service is back are in flight"
    elif retry_after is None:
        why = "held open by an operator until reset"
    else:
        why = f"open for about {retry_after:.1f} s more: recent calls failed"
    return CircuitOpenError(
        f"the circuit breaker of {name!r} is {why}; this call was not made",
        retry_after=retry_after,
        suggestion="Use another tool or answer without this one; retry it later if still needed.",
        details={"breaker": name, "state": None if state is None else str(state)},
    )


@dataclass(frozen=True)
class BreakerView:
    """One breaker as a script saw it at ``at``; ``state`` None means not consulted.

    ``admits`` says whether :meth:`CircuitBreaker.acquire` would let a call
    through now (the client's pre-check); when it would not, ``retry_after``
    is when it may (None while isolated). A view from :meth:`snapshot`, which
    knows no policy, treats the number of probes as unlimited.
    """

    name: str
    state: BreakerState | None
    admits: bool
    retry_after: float | None = None
    open_until: float | None = None
    isolated: bool = False
    calls: int = 0
    failures: int = 0
    slow: int = 0
    consecutive: int = 0
    probes_in_flight: int = 0
    probe_successes: int = 0
    generation: int = 0
    changed_at: float | None = None
    reason: TransitionReason | None = None
    at: float | None = None

    @property
    def failure_rate(self) -> float | None:
        """Failures (slow calls included) over calls in the window; None while empty."""
        return self.failures / self.calls if self.calls else None

    def refusal(self) -> CircuitOpenError:
        """The error a refused call reports (``circuit_open``, retryable)."""
        return _refusal(self.name, self.state, self.retry_after)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": None if self.state is None else str(self.state),
            "admits": self.admits,
            "retry_after": self.retry_after,
            "open_until": self.open_until,
            "isolated": self.isolated,
            "calls": self.calls,
            "failures": self.failures,
            "slow": self.slow,
            "failure_rate": self.failure_rate,
            "consecutive": self.consecutive,
            "probes_in_flight": self.probes_in_flight,
            "probe_successes": self.probe_successes,
            "generation": self.generation,
            "changed_at": self.changed_at,
            "reason": None if self.reason is None else str(self.reason),
            "at": self.at,
        }


@dataclass(frozen=True)
class Admission:
    """Whether one call may run, and the permit to hand back to :meth:`CircuitBreaker.record`.

    ``state`` is the state that admitted or refused it (None: the breaker was
    disabled or Redis unreachable). A half-open admission carries a probe
    ``permit``; ``generation`` ties the outcome to the state it was admitted in.
    """

    name: str
    allowed: bool
    state: BreakerState | None
    permit: str | None = None
    generation: int | None = None
    retry_after: float | None = None
    open_until: float | None = None

    @property
    def probe(self) -> bool:
        return self.permit is not None

    def refusal(self) -> CircuitOpenError:
        """The error a refused call reports (``circuit_open``, retryable)."""
        return _refusal(self.name, self.state, self.retry_after)


@dataclass(frozen=True)
class Transition:
    """A breaker changed state; what listeners receive (one frozen object).

    ``calls``, ``failures`` and ``consecutive`` are the window after the
    change: the numbers that opened it, or zeros once it closed.
    """

    name: str
    from_state: BreakerState
    to_state: BreakerState
    at: float
    reason: TransitionReason
    open_until: float | None = None
    calls: int = 0
    failures: int = 0
    consecutive: int = 0


Listener = Callable[[Transition], object]


# --- Lua --------------------------------------------------------------------
# Every script takes KEYS = {state hash, probes zset} of one breaker and
# ARGV[1] = now ('' = Redis TIME). Numbers go back as '%.17g' strings: Lua's
# own tostring and Redis' integer replies would lose precision. Each returns
# the same reply (see _parse): verdict, permit, wait, transition, state.

_PRELUDE = r"""
local STATE, PROBES = KEYS[1], KEYS[2]
local tr = {}

local function fmt(x) return string.format('%.17g', x) end
local function opt(arg) if arg == '' then return nil end return tonumber(arg) end

local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function load()
  local raw = redis.call('HGETALL', STATE)
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
  return {
    exists = #raw > 0, state = h.state or 'closed', gen = tonumber(h.gen or '0'),
    open_until = tonumber(h.open_until or '0'), isolated = h.isolated or '0',
    window = h.window or '', consecutive = tonumber(h.consecutive or '0'),
    probe_ok = tonumber(h.probe_ok or '0'), not_before = tonumber(h.not_before or '0'),
    changed_at = tonumber(h.changed_at or '0'), reason = h.reason or '',
  }
end

local function save(b, now, idle_ttl)
  redis.call('HSET', STATE, 'state', b.state, 'gen', b.gen, 'open_until', fmt(b.open_until),
    'isolated', b.isolated, 'window', b.window, 'consecutive', b.consecutive,
    'probe_ok', b.probe_ok, 'not_before', fmt(b.not_before), 'changed_at', fmt(b.changed_at),
    'reason', b.reason)
  b.exists = true
  if b.isolated == '1' then
    redis.call('PERSIST', STATE)
    return
  end
  local ttl = math.ceil((math.max(b.open_until - now, 0) + idle_ttl) * 1000)
  redis.call('PEXPIRE', STATE, ttl)
  redis.call('PEXPIRE', PROBES, ttl)
end

local function move(b, to, reason, now)
  tr = {b.state, to, reason}
  b.state, b.gen, b.changed_at, b.reason, b.probe_ok = to, b.gen + 1, now, reason, 0
  b.not_before, b.isolated = 0, '0'
  redis.call('DEL', PROBES)
end

local function open(b, now, until_, reason)
  move(b, 'open', reason, now)
  b.open_until = until_
end

local function close(b, now, reason)
  move(b, 'closed', reason, now)
  b.open_until, b.window, b.consecutive = 0, '', 0
end

local function live_probes(now)
  return redis.call('ZCOUNT', PROBES, '(' .. fmt(now), '+inf')
end

-- what acquire would do now: 'allow' | 'probe' | 'deny', and a wait when denied
local function verdict(b, now, k)
  if b.state == 'closed' then return 'allow', nil end
  if b.state == 'open' then
    if b.isolated == '1' then return 'deny', nil end
    if now < b.open_until then return 'deny', b.open_until - now end
  end
  if k == nil or live_probes(now) < k then return 'probe', nil end
  local first = redis.call('ZRANGEBYSCORE', PROBES, '(' .. fmt(now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  return 'deny', tonumber(first[2]) - now
end

local function reply(b, now, v, permit, wait)
  local w = ''
  if wait then w = fmt(wait) end
  local _, failures = string.gsub(b.window, '[12]', '')
  local _, slow = string.gsub(b.window, '2', '')
  return {v, permit, w, tr[1] or '', tr[2] or '', tr[3] or '', fmt(now),
    b.exists and '1' or '0', b.state, tostring(b.gen), fmt(b.open_until), b.isolated,
    tostring(#b.window), tostring(failures), tostring(slow), tostring(b.consecutive),
    tostring(live_probes(now)), tostring(b.probe_ok), fmt(b.changed_at), b.reason}
end

-- the reply of a script that hands out no permit (probes counted as unlimited)
local function view(b, now)
  local v, wait = verdict(b, now, nil)
  return reply(b, now, v, '', wait)
end
"""

# ARGV: now, K ('' = unknown)
_CHECK = r"""
local now = clock(ARGV[1])
local b = load()
local v, wait = verdict(b, now, opt(ARGV[2]))
return reply(b, now, v, '', wait)
"""

# ARGV: now, K, lease_s, permit id, idle_ttl
_ACQUIRE = r"""
local now = clock(ARGV[1])
local k, lease, permit, idle = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local b = load()
if b.state == 'open' and b.isolated ~= '1' and now >= b.open_until then
  move(b, 'half_open', 'open_elapsed', now)
end
local v, wait = verdict(b, now, k)
if v == 'probe' then
  redis.call('ZREMRANGEBYSCORE', PROBES, '-inf', fmt(now))
  redis.call('ZADD', PROBES, fmt(now + lease), permit)
else
  permit = ''
end
if v == 'probe' or tr[1] then save(b, now, idle) end
return reply(b, now, v, permit, wait)
"""

# ARGV: now, failed, slow, retry_after, generation, permit, N, rate, window, min_calls,
#       open_s, M, idle_ttl   (N and rate: 0 = off; retry_after, generation: '' = none)
_RECORD = r"""
local now = clock(ARGV[1])
local failed, slow = ARGV[2] == '1', ARGV[3] == '1'
local ra, gen, permit = opt(ARGV[4]), opt(ARGV[5]), ARGV[6]
local n, rate, size, min_calls = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]),
  tonumber(ARGV[10])
local open_s, m, idle = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local bad = failed or slow
local b = load()
local until_ = now + open_s
if bad and ra then until_ = math.max(until_, now + ra) end
if permit ~= '' then redis.call('ZREM', PROBES, permit) end

local function on_closed()
  local mark = '0'
  if failed then mark = '1' elseif slow then mark = '2' end
  b.window = string.sub(b.window .. mark, -size)
  if bad then
    b.consecutive = b.consecutive + 1
    if ra then b.not_before = math.max(b.not_before, now + ra) end
  else
    b.consecutive, b.not_before = 0, 0
  end
  local calls = #b.window
  local _, failures = string.gsub(b.window, '[12]', '')
  if n > 0 and b.consecutive >= n then
    open(b, now, math.max(until_, b.not_before), 'consecutive_failures')
  elseif rate > 0 and calls >= min_calls and failures / calls >= rate then
    open(b, now, math.max(until_, b.not_before), 'failure_rate')
  end
end

local function on_probe()
  if bad then
    open(b, now, until_, 'probe_failed')
  else
    b.probe_ok = b.probe_ok + 1
    if b.probe_ok >= m then close(b, now, 'probes_succeeded') end
  end
end

local stale = (gen ~= nil and gen ~= b.gen) or (b.state == 'half_open' and permit == '')
local dirty = true
if b.state == 'open' then
  dirty = bad and ra ~= nil and b.isolated ~= '1' and now + ra > b.open_until
  if dirty then b.open_until = now + ra end
elseif stale then
  dirty = false
elseif b.state == 'closed' then
  on_closed()
else
  on_probe()
end
if dirty then save(b, now, idle) end
return view(b, now)
"""

# ARGV: now, seconds ('' = isolate until reset), idle_ttl
_TRIP = r"""
local now = clock(ARGV[1])
local b = load()
local seconds = opt(ARGV[2])
if seconds then
  open(b, now, now + seconds, 'tripped')
else
  open(b, now, 0, 'tripped')
  b.isolated = '1'
end
save(b, now, tonumber(ARGV[3]))
return view(b, now)
"""

# ARGV: now, idle_ttl
_RESET = r"""
local now = clock(ARGV[1])
local b = load()
close(b, now, 'reset')
save(b, now, tonumber(ARGV[2]))
return view(b, now)
"""


@dataclass(frozen=True)
class _Reply:
    verdict: str
    permit: str | None
    wait: float | None
    view: BreakerView
    transition: Transition | None
    exists: bool


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(name: str, raw: Sequence[Any]) -> _Reply:
    """The scripts' common reply, as Python objects."""
    f = [_text(v) for v in raw]
    state, now, isolated = BreakerState(f[8]), float(f[6]), f[11] == "1"
    open_until = float(f[10]) if state is BreakerState.OPEN and not isolated else None
    wait = float(f[2]) if f[2] else None
    view = BreakerView(
        name=name,
        state=state,
        admits=f[0] != "deny",
        retry_after=wait if f[0] == "deny" else None,
        open_until=open_until,
        isolated=isolated,
        calls=int(f[12]),
        failures=int(f[13]),
        slow=int(f[14]),
        consecutive=int(f[15]),
        probes_in_flight=int(f[16]),
        probe_successes=int(f[17]),
        generation=int(f[9]),
        changed_at=float(f[18]) or None,
        reason=TransitionReason(f[19]) if f[19] else None,
        at=now,
    )
    transition = None
    if f[3]:
        transition = Transition(
            name=name,
            from_state=BreakerState(f[3]),
            to_state=BreakerState(f[4]),
            at=now,
            reason=TransitionReason(f[5]),
            open_until=open_until,
            calls=view.calls,
            failures=view.failures,
            consecutive=view.consecutive,
        )
    return _Reply(f[0], f[1] or None, wait, view, transition, f[7] == "1")


def _check_name(name: str) -> None:
    """Names become hash tags: braces would move the tag, blanks confuse the CLI."""
    if not name or len(name) > 200 or any(c in "{}" or c.isspace() for c in name):
        raise UsageError(
            f"breaker name {name!r} must be 1-200 characters without braces or blanks, "
            "e.g. 'get_weather' or 'http_request@api.example.com'"
        )


def _num(value: float | None) -> str:
    return "" if value is None else repr(float(value))


class CircuitBreaker:
    """Breakers in one Redis, under one key prefix; safe to share between threads.

    ``on_redis_error`` decides what :meth:`check` and :meth:`acquire` answer
    while Redis is unreachable: ``"allow"`` (the default) lets calls through,
    ``"deny"`` refuses them; either way a warning is logged at most once per
    ``warn_interval_s``. :meth:`record` then records nothing and returns None.
    After a failure the call path does not ask Redis again for
    ``redis_retry_s``: a client that retries with backoff would otherwise add
    its seconds of waiting to every tool call of an outage. Operator calls
    (:meth:`trip`, :meth:`reset`, :meth:`snapshot`, ...) always ask, and raise
    :class:`~toolexec.errors.RedisUnavailableError`.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys | None = None,
        *,
        clock: Clock | None = None,
        on_redis_error: Literal["allow", "deny"] = "allow",
        warn_interval_s: float = 60.0,
        redis_retry_s: float = 1.0,
        idle_ttl_s: float = BREAKER_IDLE_TTL_S,
    ) -> None:
        if on_redis_error not in ("allow", "deny"):
            raise ConfigurationError(
                f"on_redis_error must be 'allow' or 'deny', not {on_redis_error!r}"
            )
        self.redis = client
        self.keys = keys or Keys()
        self.clock = clock
        self.on_redis_error = on_redis_error
        self.warn_interval_s = warn_interval_s
        self.redis_retry_s = redis_retry_s
        self.idle_ttl_s = idle_ttl_s
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()
        self._warned_at: float | None = None
        self._down_until = float("-inf")
        self._registered: dict[str, float] = {}
        self._check = client.register_script(_PRELUDE + _CHECK)
        self._acquire = client.register_script(_PRELUDE + _ACQUIRE)
        self._record = client.register_script(_PRELUDE + _RECORD)
        self._trip = client.register_script(_PRELUDE + _TRIP)
        self._reset = client.register_script(_PRELUDE + _RESET)

    # -- listeners ---------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every transition this object causes."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    def _announce(self, transition: Transition) -> None:
        level = logging.WARNING if transition.to_state is BreakerState.OPEN else logging.INFO
        log.log(
            level,
            "circuit breaker %s: %s -> %s (%s; window %d/%d failed, %d consecutive%s)",
            transition.name,
            transition.from_state,
            transition.to_state,
            transition.reason,
            transition.failures,
            transition.calls,
            transition.consecutive,
            "" if transition.open_until is None else f", open until {transition.open_until:.3f}",
        )
        for listener in self._listeners:
            try:
                listener(transition)
            except Exception:
                log.exception("breaker listener %r failed on %s; ignored", listener, transition)

    # -- the call path -----------------------------------------------------

    def check(self, name: str, policy: BreakerPolicy) -> BreakerView:
        """What :meth:`acquire` would answer now, without taking a permit (one round trip)."""
        _check_name(name)
        if not policy.enabled:
            return BreakerView(name=name, state=None, admits=True)
        blind = BreakerView(name=name, state=None, admits=self.on_redis_error == "allow")
        if self._down():
            return blind
        try:
            return self._run(self._check, name, [policy.half_open_probes]).view
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return blind

    def acquire(self, name: str, policy: BreakerPolicy) -> Admission:
        """Whether a call may run now; a half-open breaker hands out at most K probe permits.

        One round trip. While closed this writes nothing; the move from open
        to half-open happens here, in the first acquire after open-until.
        """
        _check_name(name)
        if not policy.enabled:
            return Admission(name=name, allowed=True, state=None)
        blind = Admission(name=name, allowed=self.on_redis_error == "allow", state=None)
        if self._down():
            return blind
        args = [policy.half_open_probes, policy.probe_lease_s, uuid.uuid4().hex, self.idle_ttl_s]
        try:
            reply = self._run(self._acquire, name, args)
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return blind
        return Admission(
            name=name,
            allowed=reply.verdict != "deny",
            state=BreakerState.HALF_OPEN if reply.permit else reply.view.state,
            permit=reply.permit,
            generation=reply.view.generation,
            retry_after=reply.wait,
            open_until=reply.view.open_until,
        )

    def record(
        self,
        name: str,
        policy: BreakerPolicy,
        admission: Admission,
        *,
        success: bool,
        duration_s: float,
        retry_after: float | None = None,
    ) -> Transition | None:
        """Count the outcome of an admitted call; returns the transition it caused, if any.

        ``retry_after`` (a 429/503's Retry-After, seconds) on a failure makes
        the breaker, when it opens, stay open at least that long, and extends
        (never shortens) a breaker already open. A refused admission records
        nothing. One round trip (plus one per name per process and quarter
        idle TTL, to list the name for ``toolexec breakers``).
        """
        _check_name(name)
        if admission.name != name:
            raise UsageError(f"an admission of {admission.name!r} was recorded on {name!r}")
        if not policy.enabled or not admission.allowed or self._down():
            return None
        args = [
            "0" if success else "1",
            "1" if policy.is_slow(duration_s) else "0",
            _num(retry_after),
            "" if admission.generation is None else str(admission.generation),
            admission.permit or "",
            policy.consecutive_failures or 0,
            policy.failure_rate or 0,
            policy.window_size,
            policy.min_calls,
            policy.open_s,
            policy.close_after,
            self.idle_ttl_s,
        ]
        try:
            self._register(name)
            return self._run(self._record, name, args).transition
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return None

    # -- the operator's switches -------------------------------------------

    def trip(self, name: str, seconds: float | None = None) -> BreakerView:
        """Force it open for ``seconds``, or (None) isolate it until :meth:`reset`."""
        _check_name(name)
        if seconds is not None and seconds <= 0:
            raise UsageError(f"trip for a positive number of seconds, not {seconds}")
        return self._operate(name, self._trip, [_num(seconds), self.idle_ttl_s], register=True)

    def reset(self, name: str) -> BreakerView:
        """Force it closed with an empty window (ends an isolation too)."""
        _check_name(name)
        return self._operate(name, self._reset, [self.idle_ttl_s], register=False)

    def snapshot(self, name: str) -> BreakerView:
        """The breaker now; with no policy at hand, probes are counted as unlimited."""
        _check_name(name)
        return self._operate(name, self._check, [""], register=False)

    def names(self) -> list[str]:
        """Every breaker some process has recorded on or tripped, sorted."""
        try:
            return sorted(_text(n) for n in self.redis.zrange(self.keys.breakers(), 0, -1))
        except _UNREACHABLE as exc:
            raise self._unavailable(exc) from exc

    def snapshot_all(self) -> list[BreakerView]:
        """Every breaker in one pipelined round trip; forgets breakers long expired."""
        names = self.names()
        try:
            pipe = self.redis.pipeline(transaction=False)
            for name in names:
                self._check(keys=self._keys(name), args=[self._now_arg(), ""], client=pipe)
            raws = pipe.execute()
        except _UNREACHABLE as exc:
            raise self._unavailable(exc) from exc
        replies = [_parse(name, raw) for name, raw in zip(names, raws, strict=True)]
        self._prune([r.view.name for r in replies if not r.exists])
        return [r.view for r in replies if r.exists]

    # -- internals ---------------------------------------------------------

    def _keys(self, name: str) -> list[str]:
        return [self.keys.breaker(name), self.keys.breaker_probes(name)]

    def _now_arg(self) -> str:
        return "" if self.clock is None else repr(float(self.clock.now()))

    def _local_now(self) -> float:
        return time.time() if self.clock is None else self.clock.now()

    def _run(self, script: Script, name: str, args: list[Any]) -> _Reply:
        raw = script(keys=self._keys(name), args=[self._now_arg(), *args])
        reply = _parse(name, raw)
        if reply.transition is not None:
            self._announce(reply.transition)
        return reply

    def _operate(
        self, name: str, script: Script, args: list[Any], *, register: bool
    ) -> BreakerView:
        try:
            if register:
                self._register(name)
            return self._run(script, name, args).view
        except _UNREACHABLE as exc:
            raise self._unavailable(exc) from exc

    def _register(self, name: str) -> None:
        """List the name for ``toolexec breakers``; a separate key, so outside the scripts.

        Once per quarter idle TTL per process: often enough that a live
        breaker's entry is never old enough to be pruned.
        """
        now = self._local_now()
        last = self._registered.get(name)
        if last is not None and now - last < self.idle_ttl_s / 4:
            return
        self.redis.zadd(self.keys.breakers(), {name: now})
        self._registered[name] = now

    def _prune(self, gone: list[str]) -> None:
        """Drop names whose state expired and that nobody registered for an idle TTL."""
        if not gone:
            return
        horizon = self._local_now() - self.idle_ttl_s
        scores = self.redis.zmscore(self.keys.breakers(), gone)
        stale = [n for n, s in zip(gone, scores, strict=True) if s is not None and s < horizon]
        if stale:
            self.redis.zrem(self.keys.breakers(), *stale)

    def _monotonic(self) -> float:
        return time.monotonic() if self.clock is None else self.clock.now()

    def _down(self) -> bool:
        """Whether Redis failed so recently that the call path should not wait on it."""
        return self._monotonic() < self._down_until

    def _unreachable(self, exc: Exception) -> None:
        now = self._monotonic()
        with self._lock:
            self._down_until = now + self.redis_retry_s
            if self._warned_at is not None and now - self._warned_at < self.warn_interval_s:
                return
            self._warned_at = now
        verb = "letting calls through" if self.on_redis_error == "allow" else "refusing calls"
        log.warning(
            "circuit breakers cannot reach Redis (%s: %s); %s (on_redis_error=%r)",
            type(exc).__name__,
            exc,
            verb,
            self.on_redis_error,
        )

    def _unavailable(self, exc: Exception) -> RedisUnavailableError:
        kwargs = self.redis.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return RedisUnavailableError(
            f"circuit breakers cannot reach Redis at {where} ({type(exc).__name__}: {exc}); "
            "check that the server is running and TOOLEXEC_REDIS_URL is right"
        )
