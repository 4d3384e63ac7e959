"""A fairness key's ``max_in_flight`` on RabbitMQ (``TOOLEXEC_RABBITMQ_FAIRNESS``).

RabbitMQ pushes calls to consumers and has no fleet-wide count to check, so the
count lives in toolexec's Redis: a sorted set per capped key of the task ids
running (:meth:`toolexec.keys.Keys.amqp_inflight`). Each worker's message guard
(:mod:`toolexec.tasks.message_guard`) takes a place in it with one atomic script
(``lua/amqp_cap_take.lua``) before it hands a call of a capped key's queue to
Celery, in the consumer's own thread, so the check and the count cannot race and
the cap is never exceeded while Redis keeps the set.

A call that finds its key at the cap is never run and never lost: the worker
stops consuming that key's queues (Celery's ``cancel_task_queue``, in the same
thread) and rejects the message with requeue, so RabbitMQ keeps it at its queue's
head for later. The excess waits in the key's own queues, holds no slot, and
other keys' queues are consumed as before. The lanes step's thread
(:mod:`toolexec.worker.amqp_lanes`) looks at each paused key every
:data:`~toolexec.worker.amqp_lanes.POLL_S` and consumes its queues again once
fewer than its cap run. The end of a call (Celery's ``task_postrun``) frees its
place; a place whose worker died lapses after the task's time limit, unless the
redelivered message takes it again first (same task id, counted once).

Caps are read from the broker's fairness settings (``toolexec fairness set
--max-in-flight``, in toolexec's Redis on RabbitMQ) every poll, so a new cap
applies within that. While Redis cannot be reached the cap is not enforced: calls
run (a warning is logged), rather than bounce between the queue and the workers.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from celery import signals

from toolexec.fairness import AMQP_LANE_MARK
from toolexec.keys import BrokerKeys, Keys
from toolexec.lua import script_source
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = [
    "CapGate",
    "CapTaker",
    "admit",
    "connect",
    "gate_of",
    "lane_key",
    "lease_s",
    "member_of",
    "noted",
    "resumable",
]

log = logging.getLogger("toolexec.worker")

_SOURCE = script_source("amqp_cap_take", prelude=False)

#: Every key this process's lanes step saw with a cap, and that process's id.
_caps_seen: set[str] = set()
_caps_pid = 0
_caps_lock = threading.Lock()


def lane_key(queue: Any) -> str | None:
    """The fairness key of a per-key queue name ``<queue>.fair.<key>.<n>``; None for others."""
    if not isinstance(queue, str):
        return None
    _base, mark, rest = queue.rpartition(AMQP_LANE_MARK)
    key, dot, share = rest.rpartition(".")
    if not mark or not dot or not key or not share.isdigit():
        return None
    return key


def lease_s(time_limit: Any, fallback: float, eta: Any, now: float) -> float:
    """How long a place may be held: the task's time limit, plus any wait for its eta (pure).

    A call cannot run past its hard time limit, so a place older than this belongs
    to a worker that died without its message coming back to anyone.
    """
    limit = float(time_limit) if isinstance(time_limit, (int, float)) and time_limit > 0 else 0.0
    base = limit or fallback
    if isinstance(eta, str):
        try:
            return base + max(0.0, datetime.fromisoformat(eta).timestamp() - now)
        except ValueError:
            return base
    return base


def member_of(task_id: Any, retries: Any) -> str | None:
    """A call's entry in its key's set: task id and attempt, so a retry's message (same id,
    next attempt) is not freed by the end of the attempt that sent it, while a message
    redelivered after its worker died (same attempt) is counted once (pure)."""
    if not isinstance(task_id, str) or not task_id:
        return None
    return f"{task_id}:{retries if isinstance(retries, int) else 0}"


def resumable(count: int, cap: int | None) -> bool:
    """Whether a paused key's queues may be consumed again: fewer than its cap run (pure)."""
    return cap is None or count < cap


@dataclass
class CapGate:
    """One consumer's view of the caps: the known caps and the keys it stopped consuming."""

    caps: dict[str, int] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cap_of(self, key: str) -> int | None:
        return self.caps.get(key)

    def pause(self, key: str) -> None:
        with self.lock:
            self.paused.add(key)

    def paused_keys(self) -> set[str]:
        with self.lock:
            return set(self.paused)

    def resume(self, keys: set[str]) -> None:
        with self.lock:
            self.paused -= keys


def gate_of(consumer: Any) -> CapGate:
    """The consumer's gate, shared by its message guard and its lanes step."""
    gate = consumer.__dict__.get("_toolexec_cap_gate")
    if gate is None:
        gate = consumer.__dict__["_toolexec_cap_gate"] = CapGate()
    return gate  # type: ignore[no-any-return]


class CapTaker:
    """The Redis side of the gate: take a place, count, free (thin I/O)."""

    def __init__(self, client: redis.Redis, keys: Keys, broker_keys: BrokerKeys) -> None:
        self.client = client
        self.keys = keys
        self.broker_keys = broker_keys
        self.script = client.register_script(_SOURCE)

    def take(self, key: str, task_id: str, cap: int, now: float, lease: float) -> bool:
        ttl = int(lease) + 1
        args: list[str | int] = [task_id, repr(now), repr(now + lease), cap, ttl]
        return bool(self.script(keys=[self.keys.amqp_inflight(key)], args=args))

    def running(self, key: str, now: float) -> int:
        return int(self.client.zcount(self.keys.amqp_inflight(key), repr(now), "+inf"))

    def free(self, key: str, task_id: str) -> None:
        self.client.zrem(self.keys.amqp_inflight(key), task_id)

    def caps(self) -> dict[str, int]:
        raw = self.client.hgetall(self.broker_keys.fair_caps())
        return {_text(k): int(v) for k, v in raw.items() if int(v) > 0}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def noted(caps: dict[str, int], pid: int) -> None:
    """The lanes step of process ``pid`` read ``caps``: remember every key seen capped."""
    global _caps_pid
    with _caps_lock:
        _caps_seen.update(caps)
        _caps_pid = pid


def freed(queue: Any, pid: int) -> str | None:
    """The key whose place a call of ``queue`` frees when it ends, if any.

    In the process whose lanes step reads the caps (the threads pool, the
    default), only a key ever seen capped there; in any other (a prefork child
    runs what its parent admitted) every per-key queue's key: a ``ZREM`` that
    finds nothing for a key without a cap.
    """
    key = lane_key(queue)
    with _caps_lock:
        if key is None or (pid == _caps_pid and key not in _caps_seen):
            return None
    return key


_taker_lock = threading.Lock()
_takers: dict[str, CapTaker] = {}


def taker_for(app: Any) -> CapTaker:
    """One :class:`CapTaker` per process and Redis (a fail-fast client: the call path)."""
    from toolexec.connection import fail_fast_client, redis_url
    from toolexec.worker.app import settings_of

    settings = settings_of(app)
    url = redis_url(settings)
    with _taker_lock:
        if url not in _takers:
            client = fail_fast_client(url)
            prefix = settings.key_prefix
            _takers[url] = CapTaker(client, Keys(prefix), BrokerKeys(prefix))
        return _takers[url]


def admit(consumer: Any, message: Any, now: float) -> bool:
    """Whether the consumer may hand ``message`` to Celery; if not, it went back to its queue.

    Runs in the consumer's thread. A message of a capped key's queue takes a place
    first; at the cap, this consumer stops consuming the key's queues and rejects
    the message with requeue (RabbitMQ keeps it; it is neither run nor lost).
    """
    info = message.delivery_info if isinstance(message.delivery_info, dict) else {}
    key = lane_key(info.get("routing_key"))
    headers = message.headers if isinstance(message.headers, dict) else {}
    member = member_of(headers.get("id"), headers.get("retries"))
    if key is None or member is None:
        return True
    cap = gate_of(consumer).cap_of(key)
    if cap is None:
        return True
    try:
        taken = taker_for(consumer.app).take(key, member, cap, now, _lease(consumer, headers, now))
    except REDIS_ERRORS as exc:  # fail open: run it rather than bounce it
        log.warning("max_in_flight of %s not checked: Redis failed (%s); the call runs", key, exc)
        return True
    if taken:
        return True
    gate_of(consumer).pause(key)
    for queue in list(consumer.task_consumer.queues):
        if lane_key(queue.name) == key:
            consumer.cancel_task_queue(queue.name)
    message.reject_log_error(log, consumer.connection_errors, requeue=True)
    return False


def _lease(consumer: Any, headers: dict[str, Any], now: float) -> float:
    from toolexec.worker.app import settings_of

    task = consumer.app.tasks.get(headers.get("task"))
    fallback = float(settings_of(consumer.app).visibility_timeout)
    return lease_s(getattr(task, "time_limit", None), fallback, headers.get("eta"), now)


def _on_postrun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    """A call ended: free its place at once (else it lapses after its lease)."""
    request = getattr(sender, "request", None)
    member = member_of(task_id, getattr(request, "retries", 0))
    if member is None or sender is None:
        return
    info = getattr(request, "delivery_info", None) or {}
    key = freed(info.get("routing_key") if isinstance(info, dict) else None, os.getpid())
    if key is None:
        return
    try:
        taker_for(sender.app).free(key, member)
    except REDIS_ERRORS as exc:
        log.warning("could not free %s's place in flight (%s); it lapses", key, exc)


def connect() -> None:
    """Free places when calls end (idempotent)."""
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="toolexec-amqp-caps")
