"""The consumer Celery runs: it keeps consuming through broker flaps, and says it polls.

Two parts. :class:`Consumer` is Celery's consumer with a reconnection pace
fit for a blip: Celery asks kombu to wait 2 s, then 4, 6, ... up to 30 s
between attempts, so after three restarts of Redis a worker would sit idle
for seconds after Redis is back; here it tries every half second, then at
most every 2 s (``worker_consumer`` in :mod:`toolexec.worker.app`).

:class:`LivenessBeat` is a consumer bootstep that writes a small JSON file
once a second from inside the consumer's own event loop: when the file goes
stale, the loop that polls the broker has stopped, whatever the process
looks like from outside (Celery's reports of workers that "stop consuming
after a reconnect" keep their process alive, so a PID check passes). The
file also says how many slots are busy, which is what ``toolexec health``
(:mod:`toolexec.ops.health`) needs to tell a busy worker from a stuck one.

:class:`OrphanWatchStep` runs :class:`toolexec.transport.orphans.OrphanWatch` for a
Redis broker, so that a killed worker's messages go back to their queues
within seconds instead of the visibility timeout.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from celery import bootsteps
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer as CeleryConsumer

__all__ = [
    "BEAT_S",
    "Beat",
    "Consumer",
    "LivenessBeat",
    "OrphanWatchStep",
    "beat_dir",
    "read_beats",
]

log = logging.getLogger("toolexec.worker")

#: How often the consumer loop writes its beat.
BEAT_S = 1.0

#: kombu's reconnection pace for the consumer: first retry, step, and longest pause (s).
RECONNECT_START_S = 0.5
RECONNECT_STEP_S = 0.5
RECONNECT_MAX_S = 2.0


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, reconnecting at the pace of a blip instead of an outage."""

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RECONNECT_START_S,
            interval_step=RECONNECT_STEP_S,
            interval_max=RECONNECT_MAX_S,
        )
        return super().ensure_connected(conn)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's handler of every task message, behind the message guard when there is one.

        The guard (``toolexec.tasks.message_guard``) refuses malformed messages,
        hands back unknown tasks and bounds scheduled ones before Celery reads them.
        """
        handler = super().create_task_handler(*args, **kwargs)
        guard = getattr(self, "toolexec_guard", None)
        return handler if guard is None else guard.guarding(handler, self.strategies)

    def _refused(self, message: Any, reason: str) -> bool:
        guard = getattr(self, "toolexec_guard", None)
        if guard is not None:
            guard.refuse(message, reason)
        return guard is not None

    def on_unknown_message(self, body: Any, message: Any) -> None:
        """A message with no task header: refused by the guard (Celery's report logs its body)."""
        if not self._refused(message, "it names no task"):
            super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: BaseException) -> None:
        if not self._refused(message, "it names a task this worker does not have"):
            super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: BaseException) -> None:
        if not self._refused(message, f"Celery could not read it ({type(exc).__name__})"):
            super().on_invalid_task(body, message, exc)

    def on_decode_error(self, message: Any, exc: BaseException) -> None:
        """A message kombu could not decode: refused by the guard (Celery logs its body)."""
        if not self._refused(message, f"its body cannot be decoded ({type(exc).__name__})"):
            super().on_decode_error(message, exc)


@dataclass(frozen=True)
class Beat:
    """What a worker's consumer loop last said about itself."""

    hostname: str
    pid: int
    polled_at: float
    concurrency: int
    active: int
    queues: tuple[str, ...]

    @property
    def idle_slots(self) -> int:
        return max(0, self.concurrency - self.active)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Beat:
        return cls(
            hostname=str(raw["hostname"]),
            pid=int(raw["pid"]),
            polled_at=float(raw["polled_at"]),
            concurrency=int(raw["concurrency"]),
            active=int(raw["active"]),
            queues=tuple(str(q) for q in raw["queues"]),
        )


def beat_dir(data_dir: Path) -> Path:
    """Where the workers of this host write their beats (the data directory is per host)."""
    return data_dir / "consumer-beats"


def read_beats(data_dir: Path) -> list[Beat]:
    """Every beat file of this host; unreadable ones (half written, foreign) are skipped."""
    found = []
    for path in sorted(beat_dir(data_dir).glob("*.json")):
        try:
            found.append(Beat.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


class LivenessBeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """Writes the worker's beat from the consumer's event loop (see the module docstring)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.path: Path | None = None
        self.timer: Any = None

    def start(self, parent: Any) -> None:
        from toolexec.worker.app import settings_of

        directory = beat_dir(settings_of(parent.app).data_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{parent.hostname}.json"
        # the hub's timer runs inside the loop that polls the broker: no loop, no beat
        timer = parent.hub.timer if parent.hub is not None else parent.timer
        self.timer = timer.call_repeatedly(BEAT_S, self.beat, (parent,))
        self.beat(parent)

    def beat(self, parent: Any) -> None:
        if self.path is None:
            return
        beat = Beat(
            hostname=parent.hostname,
            pid=os.getpid(),
            polled_at=time.time(),
            concurrency=int(parent.controller.concurrency or 1),
            active=len(worker_state.active_requests),
            queues=tuple(sorted(q.name for q in parent.task_consumer.queues))
            if parent.task_consumer is not None
            else (),
        )
        part = self.path.with_suffix(".tmp")
        try:
            part.write_text(json.dumps(asdict(beat)))
            part.replace(self.path)
        except OSError as exc:  # a full disk must not stop the consumer
            log.warning("liveness beat not written: %s", exc)

    def stop(self, parent: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class OrphanWatchStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Starts this process's :class:`~toolexec.transport.orphans.OrphanWatch` before it consumes.

    Every step but the event loop starts before the first message is read, so
    the consumer's first beat is written before it holds anything. RabbitMQ
    requeues a dead consumer's messages itself: there the step does nothing.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.watch: Any = None

    def start(self, parent: Any) -> None:
        if self.watch is not None or parent.connection.transport.driver_type != "redis":
            return
        from toolexec.keys import BrokerKeys
        from toolexec.transport import orphans
        from toolexec.worker.app import settings_of

        app = parent.app
        settings = settings_of(app)
        keys = BrokerKeys(settings.key_prefix)

        def connect() -> Any:
            return app.connection_for_write().default_channel

        self.watch = orphans.OrphanWatch(
            connect,
            keys,
            orphans.activate(keys),
            visibility_timeout=settings.visibility_timeout,
        )
        self.watch.tick()
        self.watch.start()

    def shutdown(self, parent: Any) -> None:
        # No goodbye: kombu restores what a stopping worker holds, and the alive
        # key's expiry lets the other watchers forget this consumer.
        if self.watch is not None:
            self.watch.stop()
