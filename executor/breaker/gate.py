"""The client's side of a breaker: refuse a call before it is queued.

No permit: the worker's :class:`~toolexec.breaker.layer.BreakerLayer` takes the
permit when the call runs. :func:`refusal_for` asks the breaker's script (one
round trip); the fallback chain asks it before it sends an alternative.

:class:`BreakerGate` is what the client asks before every call, where a round
trip per call for a breaker that is closed nearly always was the price. The
breaker scripts keep a small gate key per breaker
(:meth:`~toolexec.keys.Keys.breaker_gate`) that changes only when the breaker
moves, or while it is not closed, and publish each change on a channel of the
key's name. The gate reads a key once, keeps it, and drops its copy when a
change is published, so a closed breaker costs no round trip; an open one is
refused from the copy; anything in between (half-open, or open-until about to
pass) is asked of the script as before, because only the scripts count probe
permits and read Redis' own clock. The worker's admission stays the authority.

RESP3 client-side caching would do the same with the key itself, but redis-py
enables it only for servers that report Redis 7.4 or later, which Valkey (the
embedded server) does not; a pattern subscription works on both. While the
subscription is down, nothing is kept and every check asks Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import redis
from redis.client import PubSub, PubSubWorkerThread

from toolexec.breaker.policy import breaker_name
from toolexec.breaker.store import CircuitBreaker
from toolexec.breaker.views import BreakerState, BreakerView
from toolexec.clock import Clock, SystemClock
from toolexec.connection import fail_fast_client
from toolexec.errors import CircuitOpenError
from toolexec.keys import Keys
from toolexec.policies import BreakerPolicy
from toolexec.waits import breaker_wait

__all__ = ["BreakerGate", "GateVerdict", "gate_verdict", "refusal_for"]


def refusal_for(
    breakers: CircuitBreaker,
    tool: str,
    policy: BreakerPolicy,
    key: str | None,
    arguments: Mapping[str, Any],
) -> CircuitOpenError | None:
    """The refusal an open breaker gives, or None when it would admit the call."""
    view = breakers.check(breaker_name(tool, key, arguments), policy)
    return None if view.admits else view.refusal()


log = logging.getLogger("toolexec.client")

#: Within this many seconds of open-until the script (Redis' clock) decides,
#: so a client clock that runs behind cannot refuse calls a breaker would admit.
SKEW_MARGIN_S = 1.0

#: Gates one client keeps; past it the copy starts over (a per-host breaker
#: per URL a model invents must not grow a client without bound).
CACHE_SIZE = 10_000

#: After the subscription fails, checks ask Redis this long before it is tried again.
RESUBSCRIBE_S = 1.0


class GateVerdict(Enum):
    ADMIT = "admit"
    DENY = "deny"
    ASK = "ask"  # the script must decide (half-open, or open-until near)


@dataclass(frozen=True)
class Gate:
    verdict: GateVerdict
    retry_after: float | None = None
    trips: int = 0


def gate_verdict(raw: str | None, now: float) -> Gate:
    """What a client may answer from a breaker's gate value alone (pure)."""
    if not raw:
        return Gate(GateVerdict.ADMIT)  # no gate: the breaker is closed (or gone)
    try:
        state, until_text, isolated, *rest = raw.split(" ")
        open_until = float(until_text)
        trips = int(rest[0]) if rest else 0
    except ValueError:
        return Gate(GateVerdict.ASK)
    if state == BreakerState.CLOSED:
        return Gate(GateVerdict.ADMIT)
    if state == BreakerState.OPEN and isolated == "1":
        return Gate(GateVerdict.DENY)
    if state == BreakerState.OPEN and now < open_until - SKEW_MARGIN_S:
        return Gate(GateVerdict.DENY, open_until - now, trips)
    return Gate(GateVerdict.ASK)


def _worth_waiting(refusal: CircuitOpenError, policy: BreakerPolicy) -> bool:
    """Whether a worker would let this call wait for the breaker's next probe.

    Then the client sends it instead of refusing: a first, short trip may be a
    blip, and the call's own deadline decides on the worker (``toolexec.waits``).
    """
    details = refusal.details
    wait = breaker_wait(
        state=details.get("state"),
        retry_after=refusal.retry_after,
        trips=int(details.get("trips") or 0),
        max_wait_s=policy.max_wait_s,
        waited_s=0.0,
    )
    return wait is not None


class BreakerGate:
    """The client's pre-check: from the kept gate, else from the breaker's script."""

    def __init__(
        self, url: str, breakers: CircuitBreaker, keys: Keys, clock: Clock | None = None
    ) -> None:
        self._url = url
        self.breakers = breakers
        self.keys = keys
        self.clock = clock or SystemClock()
        # Re-entrant: subscribing happens under the lock, and redis-py may run a
        # connect callback (_on_reconnect, which takes it too) on this same thread
        # when the pub/sub connection it hands out had one from an earlier
        # subscription; a plain Lock deadlocked there after a Redis restart.
        self._lock = threading.RLock()
        self._gates: dict[str, str | None] = {}  # gate key -> value (None: absent, closed)
        self._epoch = 0  # moves on every published change and every loss of the subscription
        self._listener: tuple[PubSub, PubSubWorkerThread] | None = None
        self._retry_at = float("-inf")
        self._reader: redis.Redis | None = None

    def refusal(
        self,
        tool: str,
        policy: BreakerPolicy,
        key_argument: str | None,
        arguments: Mapping[str, Any],
    ) -> CircuitOpenError | None:
        """None when the call may go out; else the refusal an open breaker gives."""
        if not policy.enabled:
            return None
        name = breaker_name(tool, key_argument, arguments)
        found, raw = self._gate(self.keys.breaker_gate(name))
        gate = gate_verdict(raw, self.clock.now()) if found else Gate(GateVerdict.ASK)
        if gate.verdict is GateVerdict.ASK:
            refused = refusal_for(self.breakers, tool, policy, key_argument, arguments)
        elif gate.verdict is GateVerdict.ADMIT:
            return None
        else:
            refused = BreakerView(
                name=name,
                state=BreakerState.OPEN,
                admits=False,
                retry_after=gate.retry_after,
                trips=gate.trips,
            ).refusal()
        return None if refused is None or _worth_waiting(refused, policy) else refused

    def closed(self, name: str) -> bool:
        """Whether the kept copy says breaker ``name`` is closed (False: ask the script).

        The worker's admission (``toolexec.breaker.layer``) takes no permit from a
        closed breaker, so it asks this instead of the script: a round trip per
        attempt saved while the copy is subscribed to the breaker's changes.
        """
        found, raw = self._gate(self.keys.breaker_gate(name))
        return found and gate_verdict(raw, self.clock.now()).verdict is GateVerdict.ADMIT

    def forget(self, name: str) -> None:
        """Drop the copy of ``name``'s gate: this process just saw the breaker move."""
        with self._lock:
            self._epoch += 1
            self._gates.pop(self.keys.breaker_gate(name), None)

    def close(self) -> None:
        with self._lock:
            self._stop_listening()
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    # -- the copy ----------------------------------------------------------

    def _gate(self, key: str) -> tuple[bool, str | None]:
        """(True, value) from the copy or one read; (False, None) when it cannot be trusted."""
        with self._lock:
            if not self._listening():
                return False, None
            if key in self._gates:
                return True, self._gates[key]
            epoch, reader = self._epoch, self._reader
        assert reader is not None
        try:
            value = reader.get(key)
        except redis.RedisError:
            return False, None  # the script path applies on_redis_error and its pause
        raw = None if value is None else str(value)
        with self._lock:
            if self._epoch == epoch:  # nothing was published while we read
                if len(self._gates) >= CACHE_SIZE:
                    self._gates.clear()
                self._gates[key] = raw
        return True, raw

    def _on_change(self, message: dict[str, Any]) -> None:
        with self._lock:
            self._epoch += 1
            self._gates.pop(str(message["channel"]), None)

    def _on_reconnect(self, connection: object) -> None:
        with self._lock:
            self._epoch += 1
            self._gates.clear()

    def _on_error(self, exc: BaseException, pubsub: PubSub, thread: PubSubWorkerThread) -> None:
        """A lost subscription may have missed changes: forget everything, ask Redis a while."""
        with self._lock:
            if self._listener is None or self._listener[1] is not thread:
                return  # closed by us: not news
            log.info("breaker gate subscription lost (%s); checks ask Redis", _what(exc))
            self._stop_listening()

    # -- the subscription ----------------------------------------------------

    def _listening(self) -> bool:
        """Whether changes are being received; (re)subscribes when due. Holds the lock."""
        if self._listener is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._listener = self._subscribe()
        except (redis.RedisError, OSError) as exc:
            log.info("breaker gates not subscribed (%s); checks ask Redis", _what(exc))
            self._retry_at = time.monotonic() + RESUBSCRIBE_S
            return False
        return True

    def _subscribe(self) -> tuple[PubSub, PubSubWorkerThread]:
        if self._reader is None:
            self._reader = fail_fast_client(self._url)
        # confirmations stay visible: this waits for one; the listening thread skips them
        pubsub = self._reader.pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.psubscribe(**{self.keys.breaker_gates(): self._on_change})
            # wait for the confirmation: a gate read before it could miss a change
            deadline = time.monotonic() + 1.0
            while True:
                message = pubsub.get_message(ignore_subscribe_messages=False, timeout=0.1)
                if message is not None and message["type"] == "psubscribe":
                    break
                if time.monotonic() > deadline:
                    raise redis.TimeoutError("the subscription was not confirmed within 1 s")
            # redis-py reconnects and subscribes again on its own; changes published
            # meanwhile were missed, so a new connection empties the copy
            assert pubsub.connection is not None
            pubsub.connection.register_connect_callback(self._on_reconnect)
        except BaseException:
            pubsub.close()
            raise
        thread = pubsub.run_in_thread(sleep_time=1.0, daemon=True, exception_handler=self._on_error)
        return pubsub, thread

    def _stop_listening(self) -> None:
        """Holds the lock."""
        self._epoch += 1
        self._gates.clear()
        self._retry_at = time.monotonic() + RESUBSCRIBE_S
        if self._listener is not None:
            pubsub, thread = self._listener
            self._listener = None
            thread.stop()
            pubsub.close()


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
