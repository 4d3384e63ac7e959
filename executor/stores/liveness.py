"""Which workers are alive, and which queues they serve.

A client that sends a call to a queue nobody consumes would wait out the
whole deadline for nothing; with a heartbeat per worker and per queue it can
answer at once that no worker serves the tool. For "alive" to mean alive the
beats are frequent (:data:`HEARTBEAT_S`), a worker that stops cleanly removes
itself at once (:func:`leave`), and one that was killed counts as gone after
missing three beats (:data:`ALIVE_WINDOW_S`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis

from toolexec.clock import Clock
from toolexec.errors import ErrorType
from toolexec.keys import WORKER_FORGET_S, Keys
from toolexec.results import ErrorInfo

__all__ = [
    "ALIVE_WINDOW_S",
    "HEARTBEAT_S",
    "RECHECK_S",
    "LiveQueues",
    "beat",
    "leave",
    "no_catalog_info",
    "no_worker_info",
    "scheduled_counts",
    "serving",
    "workers_alive",
]

#: How often a worker says it is alive. A beat is one pipelined round trip of a
#: few ZADDs, cheap enough to send often.
HEARTBEAT_S = 2.0

#: A worker that missed three beats is gone: a beat delayed by a busy host or a
#: Redis failover still fits, a killed worker drops out within seconds.
ALIVE_WINDOW_S = 3 * HEARTBEAT_S


def beat(
    client: redis.Redis,
    keys: Keys,
    worker: str,
    queues: Iterable[str],
    now: float,
    scheduled: tuple[int, int] | None = None,
) -> None:
    """Note ``worker`` as alive and serving ``queues``, and forget long-silent workers.

    ``scheduled`` (held, bound): its messages with a future eta, for ``toolexec status``.
    """
    pipe = client.pipeline(transaction=False)
    for key in (keys.workers(), *(keys.queue_workers(q) for q in queues)):
        pipe.zadd(key, {worker: now})
        pipe.zremrangebyscore(key, "-inf", now - WORKER_FORGET_S)
    if scheduled is not None:
        held, bound = scheduled
        pipe.hset(keys.scheduled(), worker, json.dumps({"held": held, "max": bound}))
        pipe.expire(keys.scheduled(), WORKER_FORGET_S)
    pipe.execute()


def scheduled_counts(client: redis.Redis, keys: Keys) -> dict[str, dict[str, int]]:
    """Each worker's last reported (held, bound) of scheduled messages; unreadable ones skipped."""
    raw: dict[str, str] = client.hgetall(keys.scheduled())  # type: ignore[assignment]
    found = {}
    for worker, value in raw.items():
        try:
            parsed = json.loads(value)
            found[str(worker)] = {"held": int(parsed["held"]), "max": int(parsed["max"])}
        except (ValueError, TypeError, KeyError):
            continue
    return found


def leave(client: redis.Redis, keys: Keys, worker: str, queues: Iterable[str]) -> None:
    """Remove a worker that is shutting down, so nobody counts it alive any more."""
    pipe = client.pipeline(transaction=False)
    for key in (keys.workers(), *(keys.queue_workers(q) for q in queues)):
        pipe.zrem(key, worker)
    pipe.hdel(keys.scheduled(), worker)
    pipe.execute()


def serving(client: redis.Redis, keys: Keys, queue: str, now: float) -> int:
    """How many live workers consume ``queue``."""
    return int(client.zcount(keys.queue_workers(queue), now - ALIVE_WINDOW_S, "+inf"))


def workers_alive(client: redis.Redis, keys: Keys, now: float) -> list[tuple[str, float]]:
    """Every live worker with the time of its last beat."""
    seen: list[tuple[str, float]] = client.zrangebyscore(  # type: ignore[assignment]
        keys.workers(), now - ALIVE_WINDOW_S, "+inf", withscores=True
    )
    return [(str(name), float(at)) for name, at in seen]


#: While a queue has a live worker, a client asks again at most this often: a
#: call pays the round trip once a second, not every time.
RECHECK_S = 1.0


class LiveQueues:
    """A client's answer to "does any live worker serve this queue?"."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock) -> None:
        self.client = client
        self.keys = keys
        self.clock = clock
        self._confirmed: dict[str, float] = {}

    def served(self, queue: str) -> bool:
        """False only when Redis says nobody serves ``queue``; an error leaves it to the call."""
        now = self.clock.now()
        if self._confirmed.get(queue, float("-inf")) > now - RECHECK_S:
            return True
        try:
            found = serving(self.client, self.keys, queue, now)
        except redis.RedisError:
            return True  # the call itself will say that Redis is unreachable
        if found:
            self._confirmed[queue] = now
        return found > 0


def no_worker_info(queue: str) -> ErrorInfo:
    """What the model reads when no worker is there to run its call."""
    return ErrorInfo(
        type=ErrorType.NO_WORKER,
        message=(
            f"no worker is serving this tool's queue {queue!r} (none sent a heartbeat in the "
            f"last {ALIVE_WINDOW_S:g} s); the call was not made"
        ),
        suggestion="The tool is not available right now; try again later or continue without it.",
        retryable=True,
    )


def no_catalog_info(tool: str) -> ErrorInfo:
    """What the model reads when no worker has ever published a catalog (none started yet).

    Not ``unknown_tool``: the tool may well exist, the workers that would say so
    are missing, which starting one fixes (so it is worth trying again).
    """
    return ErrorInfo(
        type=ErrorType.NO_WORKER,
        message=(
            f"no worker has published a tool catalog yet, so {tool!r} cannot be run or checked: "
            "none is running here (start one with `toolexec worker --tools <your module>`); "
            "the call was not made"
        ),
        suggestion="The tool is not available right now; try again later or continue without it.",
        retryable=True,
    )
