"""The fleet's fairness settings, and what waits in each queue's lanes (Redis broker).

Weights and ``max_in_flight`` per fairness key live on the broker beside the
lanes (:mod:`toolexec.transport.lanes` reads them inside its script); ``toolexec fairness
set`` writes them. :meth:`FairnessStore.lanes` is what ``toolexec status`` and
the metrics show: per priority the calls waiting and the oldest one's age, and
the keys with the most calls waiting, a bounded number of them (a fleet with
100 000 tenants must not put 100 000 series in Prometheus or rows on a screen).
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import redis

from toolexec.clock import Clock
from toolexec.errors import UsageError
from toolexec.fairness import (
    amqp_lane_queue,
    amqp_shares,
    checked_cap,
    checked_fairness_key,
    checked_weight,
)
from toolexec.keys import AMQP_LANES_REFRESH_S, BrokerKeys, Keys

__all__ = [
    "AmqpLanes",
    "FairnessStore",
    "KeyBacklog",
    "QueueLanes",
    "submitted_at",
    "summarise",
]

#: Ready keys read per priority for a view, at most: the view is a sample beyond that.
SCAN_KEYS = 1_000

#: Keys shown by backlog (status rows, metric series), at most.
TOP_KEYS = 10


@dataclass(frozen=True)
class KeyBacklog:
    """One lane: its priority, key ('' = no key), calls waiting, the oldest one's submission."""

    priority: int
    key: str
    waiting: int
    oldest_at: float | None


@dataclass
class QueueLanes:
    """What waits in one queue's lanes, for ``toolexec status`` and ``/metrics``."""

    #: priority -> (calls waiting, oldest's age in seconds or None)
    priorities: dict[int, tuple[int, float | None]] = field(default_factory=dict)
    top: list[tuple[KeyBacklog, float | None]] = field(default_factory=list)
    #: More ready keys than were read: the figures are a lower bound.
    sampled: bool = False
    #: Calls sorted into lanes (the rest wait in the queue itself, not sorted yet).
    in_lanes: int = 0

    @property
    def waiting(self) -> int:
        return sum(n for n, _ in self.priorities.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "priorities": {
                str(p): {"waiting": n, "oldest_s": age} for p, (n, age) in self.priorities.items()
            },
            "top_keys": [
                {"priority": b.priority, "key": b.key, "waiting": b.waiting, "oldest_s": age}
                for b, age in self.top
            ],
            "sampled": self.sampled,
            "in_lanes": self.in_lanes,
        }


def summarise(
    rows: list[KeyBacklog], now: float, top: int = TOP_KEYS, sampled: bool = False
) -> QueueLanes:
    """Per priority totals and oldest age, and the ``top`` lanes by calls waiting."""
    out = QueueLanes(sampled=sampled)
    for row in rows:
        if row.waiting <= 0:
            continue
        count, age = out.priorities.get(row.priority, (0, None))
        mine = None if row.oldest_at is None else round(max(0.0, now - row.oldest_at), 3)
        oldest = mine if age is None else (age if mine is None else max(age, mine))
        out.priorities[row.priority] = (count + row.waiting, oldest)
    ranked = sorted(
        (r for r in rows if r.waiting > 0), key=lambda r: (-r.waiting, r.priority, r.key)
    )
    out.top = [
        (r, None if r.oldest_at is None else round(max(0.0, now - r.oldest_at), 3))
        for r in ranked[:top]
    ]
    out.priorities = dict(sorted(out.priorities.items()))
    return out


def submitted_at(raw: bytes | None) -> float | None:
    """When a queued task message's call was submitted (its context), or None if unreadable."""
    if raw is None:
        return None
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _, kwargs, _ = json.loads(body)
        value = kwargs["context"]["submitted_at"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return float(value) if isinstance(value, int | float) else None


class FairnessStore:
    """Fairness settings and lane views on a Redis broker (``client``)."""

    def __init__(self, client: redis.Redis, keys: BrokerKeys) -> None:
        self.client = client
        self.keys = keys

    def set(self, key: str, weight: float | None = None, max_in_flight: int | None = None) -> None:
        """Set ``key``'s weight and/or cap fleet-wide; the next take uses them."""
        name = checked_fairness_key(key, "the fairness key")
        assert name is not None
        pipe = self.client.pipeline(transaction=True)
        if weight is not None:
            pipe.hset(self.keys.fair_weights(), name, repr(checked_weight(weight)))
        if max_in_flight is not None:
            pipe.hset(self.keys.fair_caps(), name, int(checked_cap(max_in_flight) or 0))
        pipe.execute()

    def clear(self, key: str) -> None:
        """Back to weight 1 and no cap."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.keys.fair_weights(), key)
        pipe.hdel(self.keys.fair_caps(), key)
        pipe.execute()

    def config(self) -> dict[str, dict[str, float | int]]:
        """Every key with a setting: ``{"weight": w, "max_in_flight": n}`` (what is set)."""
        out: dict[str, dict[str, float | int]] = {}
        for raw_key, raw in self.client.hgetall(self.keys.fair_weights()).items():
            out.setdefault(_text(raw_key), {})["weight"] = float(raw)
        for raw_key, raw in self.client.hgetall(self.keys.fair_caps()).items():
            out.setdefault(_text(raw_key), {})["max_in_flight"] = int(raw)
        return dict(sorted(out.items()))

    def lanes(self, queue: str, now: float, top: int = TOP_KEYS) -> QueueLanes:
        """What waits in ``queue``'s lanes and in the queue itself (priority 3, no key)."""
        members: list[tuple[int, str]] = []
        sampled = False
        pipe = self.client.pipeline(transaction=False)
        for p in range(1, 6):
            pipe.zrange(self.keys.ready(queue, p), 0, SCAN_KEYS - 1)
            pipe.zcard(self.keys.ready(queue, p))
        pipe.zrange(self.keys.parked(queue), 0, SCAN_KEYS - 1)
        got = pipe.execute()
        for p in range(1, 6):
            names, total = got[2 * (p - 1)], got[2 * (p - 1) + 1]
            sampled = sampled or total > len(names)
            members += [(p, _text(n)) for n in names]
        for parked in got[10]:
            level, _, key = _text(parked).partition("|")
            if level.isdigit():
                members.append((int(level), key))
        rows = self._rows(queue, members)
        view = summarise(_merged(rows), now, top, sampled)
        view.in_lanes = sum(r.waiting for r in rows[:-1])
        return view

    def _rows(self, queue: str, members: list[tuple[int, str]]) -> list[KeyBacklog]:
        lanes = [self.keys.lane(queue, p, k) for p, k in members] + [queue]
        pipe = self.client.pipeline(transaction=False)
        for name in lanes:
            pipe.llen(name)
            pipe.lindex(name, -1)
        got = pipe.execute()
        rows = []
        for i, (p, k) in enumerate([*members, (3, "")]):
            rows.append(KeyBacklog(p, k, int(got[2 * i]), submitted_at(got[2 * i + 1])))
        return rows


def _merged(rows: list[KeyBacklog]) -> list[KeyBacklog]:
    """The queue itself and the default lane are one row (priority 3, no key)."""
    by: dict[tuple[int, str], KeyBacklog] = {}
    for row in rows:
        seen = by.get((row.priority, row.key))
        if seen is None:
            by[(row.priority, row.key)] = row
            continue
        oldest = [t for t in (seen.oldest_at, row.oldest_at) if t is not None]
        by[(row.priority, row.key)] = KeyBacklog(
            row.priority, row.key, seen.waiting + row.waiting, min(oldest) if oldest else None
        )
    return list(by.values())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: (queue, key) pairs a client remembers before starting afresh: bounded memory.
_KNOWN_KEYS = 10_000


class AmqpLanes:
    """Per-key queues on RabbitMQ (``TOOLEXEC_RABBITMQ_FAIRNESS``), in toolexec's Redis.

    A client sends a call with a fairness key to one of its key's queues, in turn
    (:meth:`queue_for`), after adding their names to the queue's set, which the
    workers read to consume them (:mod:`toolexec.worker.amqp_lanes`). Weights are
    read from ``toolexec fairness set``'s hash in the same Redis. What a client
    learnt is kept for :data:`AMQP_LANES_REFRESH_S`: a keyed call costs no Redis
    round trip in between, and a call without a key never comes here.
    """

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock) -> None:
        self.client = client
        self.keys = keys
        self.clock = clock
        self._weights = BrokerKeys(keys.prefix).fair_weights()
        self._known: dict[tuple[str, str], tuple[float, int]] = {}
        #: Each key's own turn: with one count for all, keys sent side by side would
        #: fill some of a key's queues more than others, and an emptied queue is a share lost.
        self._turns: dict[tuple[str, str], itertools.count[int]] = {}

    def queue_for(self, queue: str, key: str) -> str:
        """The queue the next call of ``key`` to ``queue`` goes to (its name registered)."""
        now = self.clock.now()
        known = self._known.get((queue, key))
        if known is None and len(self._known) >= _KNOWN_KEYS:  # a process of many tenants
            self._known.clear()
            self._turns.clear()
        if known is None or known[0] <= now:
            known = (now + AMQP_LANES_REFRESH_S, self._register(queue, key))
            self._known[(queue, key)] = known
        turn = self._turns.setdefault((queue, key), itertools.count())
        return amqp_lane_queue(queue, key, next(turn) % known[1])

    def _register(self, queue: str, key: str) -> int:
        raw = self.client.hget(self._weights, key)
        try:
            shares = amqp_shares(float(raw)) if raw is not None else 1
        except (UsageError, ValueError):  # not written by `fairness set`: weight 1
            shares = 1
        names = [amqp_lane_queue(queue, key, i) for i in range(shares)]
        self.client.sadd(self.keys.amqp_lanes(queue), *names)
        return shares

    def names(self, queue: str) -> set[str]:
        """Every per-key queue of ``queue`` a client has registered."""
        return {_text(n) for n in self.client.smembers(self.keys.amqp_lanes(queue))}

    def count(self, queue: str) -> int:
        return int(self.client.scard(self.keys.amqp_lanes(queue)))
