"""The Celery side of :mod:`toolexec.pipeline.expiry`: drop what nobody waits for, and sweep behind
it.

Called by the message guard (:mod:`toolexec.tasks.message_guard`) for every
message before Celery's handler; kept apart so the guard stays about poison.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import redis

from toolexec.clock import Clock
from toolexec.connection import fleet_clock, redis_client, redis_url
from toolexec.lua import register, script_source
from toolexec.pipeline.expiry import SWEEP, DropCounter, abandoned, stale_run
from toolexec.pipeline.poison import call_context
from toolexec.worker.app import settings_of
from toolexec.worker.logs import oneline

__all__ = ["StaleMessages"]

log = logging.getLogger("toolexec.worker")

_SWEEP_SCRIPT = script_source("stale_sweep", prelude=False)


class StaleMessages:
    """Acknowledges abandoned messages unrun; on Redis, removes the abandoned run behind."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        settings = settings_of(consumer.app)
        self._grace_s = settings.reply_grace
        self._state_url = redis_url(settings)
        self._clock: Clock | None = None
        self._broker: Any = None  # the kombu channel whose client reaches the queues
        self._script: Any = None
        self._drops = DropCounter()

    def _now(self) -> float:
        if self._clock is None:
            self._clock = fleet_clock(redis_client(self._state_url))
        return self._clock.now()

    def dropped(self, message: Any, payload: Any) -> bool:
        """Whether ``message`` was abandoned (then it is acknowledged, and the tail swept)."""
        headers = message.headers
        if headers.get("eta") is not None or headers.get("expires") is not None:
            return False  # a scheduled retry, or headers Celery must parse: the usual way
        now = self._now()
        if not abandoned(call_context(payload), now, self._grace_s):
            return False
        with contextlib.suppress(Exception):
            message.ack()
        queue = oneline((message.delivery_info or {}).get("routing_key"))
        swept = self._sweep(queue, now)
        if self._drops.add(1 + swept):
            log.warning(
                "dropped messages whose caller stopped waiting (past deadline and grace), "
                "unrun and unanswered: queue=%s; %d dropped by this worker so far",
                queue,
                self._drops.dropped,
            )
        return True

    def _sweep(self, queue: str, now: float) -> int:
        """Remove the abandoned run at ``queue``'s tail in one script call; how many."""
        client = self._client()
        if client is None or not queue:
            return 0
        try:
            tail = client.lrange(queue, -SWEEP, -1)
            run = stale_run(tail, now, self._grace_s)
            if not run:
                return 0
            if self._script is None:
                self._script = register(client, _SWEEP_SCRIPT)
            return int(self._script(keys=[queue], args=run))
        except (redis.RedisError, OSError) as exc:  # a sweep is an optimisation only
            log.debug("stale sweep of %s failed: %s", queue, type(exc).__name__)
            self._broker = self._script = None
            return 0

    def _client(self) -> Any:
        """The broker's Redis client, or None on another broker (nothing is swept there)."""
        if self._consumer.connection.transport.driver_type != "redis":
            return None
        if self._broker is None:
            self._broker = self._consumer.app.connection_for_write().default_channel
        return self._broker.client
