"""``toolexec health``: a liveness probe that fails for a worker that is alive but stalled.

A process check passes for a worker whose consumer stopped polling after a
broker reconnect (Celery's long line of such reports), so the probe looks at
what a stall leaves behind, for each worker of this host (their beat files,
:mod:`toolexec.worker.consumer`):

- its consumer loop has not written a beat for ``--stall`` seconds while the
  broker answers (while the broker is down, waiting is right and a restart
  would only kill the calls in flight);
- its queues hold a message older than ``--queue-age`` seconds while it has
  idle slots (Redis broker: the oldest message's submission time);
- it has sent no catalog heartbeat for ``--heartbeat`` seconds while Redis
  answers.

The verdict (:func:`judge`) is a pure function of what was read, so it is
tested without processes.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import click
import redis

from toolexec.connection import redis_client, redis_url
from toolexec.keys import Keys
from toolexec.ops.processes import process_label
from toolexec.settings import Settings
from toolexec.worker.consumer import Beat, read_beats

__all__ = ["Evidence", "Limits", "health", "judge", "oldest_age"]


@dataclass(frozen=True)
class Limits:
    """How long each sign may last before the worker counts as stalled (seconds)."""

    stall_s: float = 30.0
    queue_age_s: float = 60.0
    heartbeat_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("stall_s", "queue_age_s", "heartbeat_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise click.BadParameter(
                    f"{name} must be a positive number of seconds, not {value}"
                )


@dataclass(frozen=True)
class Evidence:
    """What the probe read about one worker; None where the source did not answer."""

    beat: Beat
    now: float
    broker_up: bool
    #: Age of the oldest message waiting in the worker's queues (None: empty or unknown).
    oldest_waiting_s: float | None
    #: Seconds since its catalog heartbeat (None: Redis did not answer).
    heartbeat_age_s: float | None


def judge(evidence: Evidence, limits: Limits) -> str | None:
    """Why the worker counts as stalled, or None if it does not."""
    beat = evidence.beat
    silent = evidence.now - beat.polled_at
    if silent > limits.stall_s and evidence.broker_up:
        return f"its consumer has not polled for {silent:.0f} s although the broker answers"
    waiting = evidence.oldest_waiting_s
    if waiting is not None and waiting > limits.queue_age_s and beat.idle_slots > 0:
        return (
            f"a message has waited {waiting:.0f} s in its queues while "
            f"{beat.idle_slots} of its {beat.concurrency} slots are idle"
        )
    heartbeat = evidence.heartbeat_age_s
    if heartbeat is not None and heartbeat > limits.heartbeat_s:
        return f"it has sent no heartbeat for {heartbeat:.0f} s"
    return None


def oldest_age(raw: str | bytes | None, now: float) -> float | None:
    """Age of a waiting kombu message from its toolexec call context; None if it has none."""
    if raw is None:
        return None
    try:
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        submitted = float(body[1]["context"]["submitted_at"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return max(0.0, now - submitted) if math.isfinite(submitted) else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Probe:
    """Reads the broker and Redis once for every worker of this host."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.url = redis_url(settings)
        self.broker = settings.broker_url or self.url
        self.amqp = self.broker.startswith(("amqp://", "amqps://", "pyamqp://"))

    def redis_ok(self, client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def broker_up(self, state: redis.Redis, state_ok: bool) -> bool:
        if not self.amqp:
            return state_ok if self.broker == self.url else self.redis_ok(self._broker_client())
        from kombu.connection import Connection

        try:
            with Connection(self.broker, connect_timeout=3) as conn:  # type: ignore[no-untyped-call]
                conn.ensure_connection(max_retries=1)
            return True
        except Exception:  # any failure to connect means: not up
            return False

    def _broker_client(self) -> redis.Redis:
        return redis_client(self.broker, socket_timeout=3.0, socket_connect_timeout=3.0)

    def oldest(self, queues: Sequence[str], now: float) -> float | None:
        """kombu pushes on the left and pops on the right: the oldest is at index -1."""
        if self.amqp or not queues:
            return None
        client = self._broker_client()
        try:
            ages = [oldest_age(client.lindex(q, -1), now) for q in queues]
        except redis.RedisError:
            return None
        finally:
            client.close()
        known = [a for a in ages if a is not None]
        return max(known) if known else None

    def heartbeat_age(self, client: redis.Redis, hostname: str, now: float) -> float | None:
        try:
            score = client.zscore(self.keys.workers(), hostname)
        except redis.RedisError:
            return None
        return None if score is None else max(0.0, now - float(score))

    def evidence(self, beats: Sequence[Beat]) -> list[Evidence]:
        client = redis_client(self.url, socket_timeout=3.0, socket_connect_timeout=3.0)
        try:
            state_ok = self.redis_ok(client)
            broker_up = self.broker_up(client, state_ok)
            now = time.time()
            return [
                Evidence(
                    beat=beat,
                    now=now,
                    broker_up=broker_up,
                    oldest_waiting_s=self.oldest(beat.queues, now) if broker_up else None,
                    heartbeat_age_s=self.heartbeat_age(client, beat.hostname, now)
                    if state_ok
                    else None,
                )
                for beat in beats
            ]
        finally:
            client.close()


@click.command()
@click.option(
    "--hostname", "-n", default=None, help="Check this worker only (default: all on this host)."
)
@click.option(
    "--stall", type=float, default=30.0, show_default=True, help="Seconds without a consumer poll."
)
@click.option(
    "--queue-age", type=float, default=60.0, show_default=True, help="Seconds a message may wait."
)
@click.option(
    "--heartbeat", type=float, default=60.0, show_default=True, help="Seconds without a heartbeat."
)
def health(hostname: str | None, stall: float, queue_age: float, heartbeat: float) -> None:
    """Exit 1 if a worker on this host is alive but stalled (a liveness probe)."""
    limits = Limits(stall, queue_age, heartbeat)
    settings = Settings.from_env()
    beats = [
        b
        for b in read_beats(settings.data_dir)
        if _running(b.pid) and (hostname is None or b.hostname == hostname)
    ]
    if not beats:
        click.echo(f"unhealthy: no running worker{f' {hostname}' if hostname else ''} on this host")
        sys.exit(1)
    failed = False
    names = [b.hostname for b in beats]
    for evidence in _Probe(settings).evidence(beats):
        reason = judge(evidence, limits)
        failed = failed or reason is not None
        state = f"stalled: {reason}" if reason else "ok"
        label = process_label(evidence.beat.hostname, names)
        process = f" (process {label}, pid {evidence.beat.pid})" if label else ""
        click.echo(f"{evidence.beat.hostname}{process}: {state}")
    sys.exit(1 if failed else 0)
