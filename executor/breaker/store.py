"""The breaker store: circuit breakers shared by every worker and client, exact across a fleet.

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
    half_open ──(one probe failure)──> open (longer: see BreakerPolicy.open_for)
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
from typing import Any, Literal

import redis
from redis.commands.core import Script

from toolexec.bounds import MAX_SECONDS, bounded_retry_after
from toolexec.breaker.views import (
    Admission,
    BreakerState,
    BreakerView,
    Listener,
    Transition,
    TransitionReason,
)
from toolexec.clock import Clock
from toolexec.errors import ConfigurationError, RedisUnavailableError, UsageError
from toolexec.keys import BREAKER_IDLE_TTL_S, Keys
from toolexec.layers.batch import Batch
from toolexec.lua import register, script_source
from toolexec.policies import BreakerPolicy
from toolexec.stores.failopen import REDIS_ERRORS, FailOpen

__all__ = ["CircuitBreaker"]

log = logging.getLogger(__name__)


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
        trips=int(f[20]) if len(f) > 20 else 0,
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
            trips=view.trips,
        )
    return _Reply(f[0], f[1] or None, wait, view, transition, f[7] == "1")


def _check_name(name: str) -> None:
    """Names become hash tags: braces would move the tag, blanks confuse the CLI."""
    if not name or len(name) > 200 or any(c in "{}" or c.isspace() for c in name):
        raise UsageError(
            f"breaker name {name!r} must be 1-200 characters without braces or blanks, "
            "e.g. 'get_weather' or 'http_request@api.example.com'"
        )


def _ignore_error(exc: Exception) -> None:
    """The record that follows says what Redis being away means; this one adds nothing."""


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
        self.fail_open = FailOpen(
            "circuit breakers",
            clock=clock,
            retry_s=redis_retry_s,
            warn_interval_s=warn_interval_s,
            log=log,
        )
        self._registered: dict[str, float] = {}
        self._check = register(client, script_source("breaker", "breaker_check"))
        self._acquire = register(client, script_source("breaker", "breaker_acquire"))
        self._record = register(client, script_source("breaker", "breaker_record"))
        self._trip = register(client, script_source("breaker", "breaker_trip"))
        self._reset = register(client, script_source("breaker", "breaker_reset"))

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
        if self.fail_open.down():
            return blind
        try:
            return self._run(self._check, name, [policy.half_open_probes]).view
        except REDIS_ERRORS as exc:
            self._unreachable(exc)
            return blind

    def acquire(self, name: str, policy: BreakerPolicy) -> Admission:
        """Whether a call may run now; a half-open breaker hands out at most K probe permits.

        One round trip. While closed this writes nothing; the move from open
        to half-open happens here, in the first acquire after open-until.
        """
        batch = Batch()
        admitted: list[Admission] = []
        self.acquire_into(batch, name, policy, admitted.append)
        batch.execute()
        return admitted[0]

    def acquire_into(
        self, batch: Batch, name: str, policy: BreakerPolicy, admit: Callable[[Admission], None]
    ) -> None:
        """:meth:`acquire` queued on ``batch``: ``admit`` gets the admission when it runs.

        Disabled, or while Redis is away, the answer comes at once, blind.
        """
        _check_name(name)
        if not policy.enabled:
            admit(Admission(name=name, allowed=True, state=None))
            return
        blind = Admission(name=name, allowed=self.on_redis_error == "allow", state=None)
        if self.fail_open.down():
            admit(blind)
            return

        def failed(exc: Exception) -> None:
            self._unreachable(exc)
            admit(blind)

        args = [policy.half_open_probes, policy.probe_lease_s, uuid.uuid4().hex, self.idle_ttl_s]
        batch.script(
            self.redis,
            self._acquire,
            self._keys(name),
            [self._now_arg(), *args],
            lambda raw: admit(self._admission(name, raw)),
            failed,
        )

    def _admission(self, name: str, raw: Sequence[Any]) -> Admission:
        reply = self._reply(name, raw)
        return Admission(
            name=name,
            allowed=reply.verdict != "deny",
            state=BreakerState.HALF_OPEN if reply.permit else reply.view.state,
            permit=reply.permit,
            generation=reply.view.generation,
            retry_after=reply.wait,
            open_until=reply.view.open_until,
            trips=reply.view.trips,
            reason=reply.view.reason,
        )

    def release_into(self, batch: Batch, admission: Admission) -> None:
        """Give back a probe permit that no call used (an outer layer answered first)."""
        if admission.permit is None:
            return
        key, permit = self.keys.breaker_probes(admission.name), admission.permit
        batch.add(
            self.redis,
            lambda pipe: pipe.zrem(key, permit),
            on_error=self._unreachable,
            held="breaker permit release",  # a ZREM: safe to send twice
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
        batch = Batch()
        caused: list[Transition | None] = [None]
        self.record_into(
            batch,
            name,
            policy,
            admission,
            success=success,
            duration_s=duration_s,
            retry_after=retry_after,
            caused=lambda transition: caused.__setitem__(0, transition),
        )
        batch.execute()
        return caused[0]

    def record_into(
        self,
        batch: Batch,
        name: str,
        policy: BreakerPolicy,
        admission: Admission,
        *,
        success: bool,
        duration_s: float,
        retry_after: float | None = None,
        caused: Callable[[Transition | None], None] | None = None,
        write: tuple[str, float] | None = None,
        successes: int = 1,
    ) -> None:
        """:meth:`record` queued on ``batch``; ``caused`` gets the transition, if any.

        ``write`` (an id, and until when to remember it) makes the record a held
        write that counts once however often it is sent (``toolexec.layers.batch``).
        ``successes``: a success record standing for that many calls (a worker's
        sum of them, ``toolexec.stores.tally``).
        """
        _check_name(name)
        if admission.name != name:
            raise UsageError(f"an admission of {admission.name!r} was recorded on {name!r}")
        if not policy.enabled or not admission.allowed or self.fail_open.down():
            return
        args = [
            self._now_arg(),
            "0" if success else "1",
            "1" if policy.is_slow(duration_s) else "0",
            _num(bounded_retry_after(retry_after)),
            "" if admission.generation is None else str(admission.generation),
            admission.permit or "",
            policy.consecutive_failures or 0,
            policy.failure_rate or 0,
            policy.window_size,
            policy.min_calls,
            policy.open_s,
            policy.close_after,
            self.idle_ttl_s,
            "" if write is None else write[0],
            "" if write is None else repr(float(write[1])),
            policy.open_factor,
            policy.max_open_s,
            max(1, successes),
        ]
        self._register_into(batch, name)

        def recorded(raw: Sequence[Any]) -> None:
            transition = self._reply(name, raw).transition
            if caused is not None:
                caused(transition)

        keys = [*self._keys(name), self.keys.breaker_done(name)]
        held = None if write is None else "breaker record"
        batch.script(self.redis, self._record, keys, args, recorded, self._unreachable, held=held)

    # -- the operator's switches -------------------------------------------

    def trip(self, name: str, seconds: float | None = None) -> BreakerView:
        """Force it open for ``seconds``, or (None) isolate it until :meth:`reset`."""
        _check_name(name)
        if seconds is not None and not 0 < seconds <= MAX_SECONDS:  # NaN fails both
            raise UsageError(
                f"trip for a positive number of seconds up to {MAX_SECONDS:.0f}, not {seconds}"
            )
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
        except REDIS_ERRORS as exc:
            raise self._unavailable(exc) from exc

    def snapshot_all(self) -> list[BreakerView]:
        """Every breaker in one pipelined round trip; forgets breakers long expired."""
        names = self.names()
        try:
            pipe = self.redis.pipeline(transaction=False)
            for name in names:
                self._check(keys=self._keys(name), args=[self._now_arg(), ""], client=pipe)
            raws = pipe.execute()
        except REDIS_ERRORS as exc:
            raise self._unavailable(exc) from exc
        replies = [_parse(name, raw) for name, raw in zip(names, raws, strict=True)]
        self._prune([r.view.name for r in replies if not r.exists])
        return [r.view for r in replies if r.exists]

    # -- internals ---------------------------------------------------------

    def _keys(self, name: str) -> list[str]:
        k = self.keys
        return [k.breaker(name), k.breaker_probes(name), k.breaker_gate(name)]

    def _now_arg(self) -> str:
        return "" if self.clock is None else repr(float(self.clock.now()))

    def _local_now(self) -> float:
        return time.time() if self.clock is None else self.clock.now()

    def _run(self, script: Script, name: str, args: list[Any]) -> _Reply:
        raw = script(keys=self._keys(name), args=[self._now_arg(), *args])
        return self._reply(name, raw)

    def _reply(self, name: str, raw: Sequence[Any]) -> _Reply:
        """A script's reply, its transition (if any) announced to the listeners."""
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
        except REDIS_ERRORS as exc:
            raise self._unavailable(exc) from exc

    def _register(self, name: str) -> None:
        """List the name for ``toolexec breakers``; a separate key, so outside the scripts."""
        batch = Batch()
        self._register_into(batch, name, on_error=None)
        batch.execute()

    def _register_into(
        self, batch: Batch, name: str, on_error: Callable[[Exception], None] | None = _ignore_error
    ) -> None:
        """:meth:`_register` on ``batch``: once per quarter idle TTL per process.

        Often enough that a live breaker's entry is never old enough to be pruned.
        """
        now = self._local_now()
        last = self._registered.get(name)
        if last is not None and now - last < self.idle_ttl_s / 4:
            return
        key = self.keys.breakers()
        batch.add(self.redis, lambda pipe: pipe.zadd(key, {name: now}), on_error=on_error)
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

    def _unreachable(self, exc: Exception) -> None:
        verb = "letting calls through" if self.on_redis_error == "allow" else "refusing calls"
        self.fail_open.failed(exc, f"{verb} (on_redis_error={self.on_redis_error!r})")

    def _unavailable(self, exc: Exception) -> RedisUnavailableError:
        kwargs = self.redis.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return RedisUnavailableError(
            f"circuit breakers cannot reach Redis at {where} ({type(exc).__name__}: {exc}); "
            "check that the server is running and TOOLEXEC_REDIS_URL is right"
        )
