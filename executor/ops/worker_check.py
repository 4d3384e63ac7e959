"""Before a worker starts: are its Redis and its broker there at all?

Celery alone would print its banner and then "Cannot connect to
redis://:**@host:port//… Trying again" for ever, where the ``:**@`` suggests
a password that may not exist and nothing names the setting to fix. So
``toolexec worker`` asks first, says in one line what it cannot reach and
which setting names it, retries for a bounded time (``--connect-wait``,
saying so), and exits with code 3 if the server never answers: a process
manager then restarts it, and a person at a terminal is not left watching a
loop. A server lost later, while the worker runs, is Celery's to reconnect to.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from toolexec.clock import Clock, SystemClock
from toolexec.connection import redact_url, redis_client
from toolexec.settings import Settings

__all__ = ["Target", "targets", "wait_for"]

#: Seconds between two tries, and between two "still waiting" lines at most.
_RETRY_EVERY_S = 2.0
_SAY_EVERY_S = 10.0


@dataclass(frozen=True)
class Target:
    """A server the worker needs, and the setting that names it."""

    what: str
    url: str
    setting: str

    def describe(self) -> str:
        return f"{self.what} at {redact_url(self.url)} ({self.setting})"


def targets(settings: Settings, state_url: str) -> list[Target]:
    """Redis, and the broker when it is another server."""
    found = [Target("Redis", state_url, "TOOLEXEC_REDIS_URL")]
    if settings.broker_url and settings.broker_url != state_url:
        found.append(Target("the broker", settings.broker_url, "TOOLEXEC_BROKER_URL"))
    return found


def probe(url: str) -> str | None:
    """Why ``url`` cannot be reached, or None when it answers."""
    try:
        if url.startswith(("amqp", "pyamqp")):
            from kombu.connection import Connection

            with Connection(url, connect_timeout=2) as conn:  # type: ignore[no-untyped-call]
                conn.connect()
        else:
            client = redis_client(url, socket_connect_timeout=2.0, socket_timeout=2.0)
            with contextlib.closing(client):
                client.ping()
    except (redis.RedisError, OSError) as exc:
        return str(exc).rstrip(".") or type(exc).__name__
    return None


def wait_for(
    target: Target,
    wait_s: float,
    say: Callable[[str], None],
    check: Callable[[str], str | None] = probe,
    clock: Clock | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Whether ``target`` answered within ``wait_s``, saying what it waits for (rarely)."""
    clock = clock or SystemClock()
    why = check(target.url)
    if why is None:
        return True
    end = clock.now() + wait_s
    say(
        f"toolexec worker: cannot reach {target.describe()}: {why}. Retrying every "
        f"{_RETRY_EVERY_S:g} s for up to {wait_s:g} s (--connect-wait), then exiting with code 3."
    )
    said = clock.now()
    while clock.now() < end:
        sleep(min(_RETRY_EVERY_S, max(0.0, end - clock.now())))
        why = check(target.url)
        if why is None:
            say(f"toolexec worker: {target.describe()} answers now; starting.")
            return True
        if clock.now() - said >= _SAY_EVERY_S:
            left = max(0.0, end - clock.now())
            say(f"toolexec worker: still cannot reach {target.describe()}; {left:.0f} s left.")
            said = clock.now()
    say(
        f"toolexec worker: gave up: {target.describe()} did not answer within {wait_s:g} s. "
        f"Start the server or fix {target.setting}."
    )
    return False
