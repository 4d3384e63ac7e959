"""Whatever the broker hands a worker, the worker keeps serving (issue 22, items 1, 4 and 9).

Before: ``LPUSH tools 'this is not json {'`` stopped the worker that took it
(``Unrecoverable error: JSONDecodeError``), and the read pushed the item back
to the queue, so every restarted worker died on it too; a ``task`` header that
is a list raised ``unhashable type`` before the message guard ran; ``{}``
restarted the consumer about six times a second; ``retries=10**30`` ran and
reported ``attempts=10^30+1``; 5 000 messages with ``eta=2999-01-01`` were all
held in memory and handed out again at each visibility timeout.

Now each item is dead-lettered with a reason, logged once by queue and short
hash (never its body), never goes back to the queue, and the same worker
processes serve the next call. One worker per deployment serves every case.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from security.hostile_support import (
    Deployment,
    dead_letters,
    deployment,
    eventually,
    rabbitmq_url,
)
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.keys import Keys
from toolexec.ops.status import gather
from toolexec.pipeline.poison import short_hash
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

#: Rides in every broken item: it must never reach a log line or a dead letter.
MARK = f"envelope-{uuid.uuid4().hex}"

#: How many messages with a future eta the ETA deployment may hold.
MAX_SCHEDULED = 3

Fleets = Callable[[str], Deployment]


#: The deployments, each one worker: the inbox path (one queue, threads), the BRPOP path on
#: the prefork pool (two queues), and RabbitMQ.
_KINDS: dict[str, dict[str, Any]] = {
    "redis-inbox": {"extra_env": {"TOOLEXEC_WORKER_MAX_SCHEDULED": str(MAX_SCHEDULED)}},
    "redis-brpop-prefork": {"extra_queue": "b", "pool": "prefork"},
    "rabbitmq": {},
}


@pytest.fixture(scope="module")
def fleets(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleets]:
    """One worker per deployment, started (and stopped) side by side: most of this module's
    time is workers starting."""
    logs = tmp_path_factory.mktemp("envelopes")
    options = {kind: dict(found) for kind, found in _KINDS.items()}
    skipped: str | None = None
    try:
        options["rabbitmq"]["broker"] = rabbitmq_url()
    except pytest.skip.Exception as exc:
        skipped = str(exc)
        del options["rabbitmq"]
    managers = {
        kind: deployment(settings, worker_env, logs / f"{kind}.log", **found)
        for kind, found in options.items()
    }
    started: dict[str, Deployment] = {}
    with ThreadPoolExecutor(len(managers)) as pool:
        futures = {kind: pool.submit(cm.__enter__) for kind, cm in managers.items()}
        errors = []
        for kind, future in futures.items():
            try:
                started[kind] = future.result()
            except Exception as exc:
                errors.append(exc)

    def get(kind: str) -> Deployment:
        if kind not in started:
            pytest.skip(skipped or f"{kind} did not start")
        return started[kind]

    try:
        if errors:
            raise errors[0]
        yield get
    finally:
        with ThreadPoolExecutor(len(managers)) as pool:
            list(pool.map(lambda kind: managers[kind].__exit__(None, None, None), started))


def _family(pid: int) -> set[int]:
    """``pid`` and its children (a prefork pool's processes)."""
    found = {pid}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _pids(fleet: Deployment) -> set[int]:
    assert fleet.worker.process is not None
    return _family(fleet.worker.process.pid)


def _letters(fleet: Deployment) -> list[dict[str, Any]]:
    client = redis_client(fleet.settings.redis_url or "")
    return dead_letters(client, Keys(fleet.settings.key_prefix).deadletter())


def _good_envelope(queue: str) -> dict[str, Any]:
    """A call as kombu's Redis transport writes it; each case below breaks one part."""
    task_id = str(uuid.uuid4())
    body = json.dumps([[], {"arguments": {"text": MARK}}, {}]).encode()
    return {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "tools.sec_echo", "id": task_id, "x-mark": MARK},
        "properties": {
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": queue, "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }


def _broken(envelope: dict[str, Any], part: str, value: Any) -> bytes:
    changed = json.loads(json.dumps(envelope))
    if part.startswith("properties."):
        changed["properties"][part.removeprefix("properties.")] = value
    elif part.startswith("headers."):
        changed["headers"][part.removeprefix("headers.")] = value
    elif value is _DROP:
        del changed[part]
    else:
        changed[part] = value
    return json.dumps(changed).encode()


_DROP = object()


def _redis_items(queue: str) -> dict[str, bytes]:
    good = _good_envelope(queue)
    return {
        "not-json": f"this is not json {{ {MARK}".encode(),
        "null": b"null",
        "empty-list": b"[]",
        "number": b"5",
        "empty-object": b"{}",
        "no-properties": _broken(good, "properties", _DROP),
        "properties-text": _broken(good, "properties", "x"),
        "delivery-info-number": _broken(good, "properties.delivery_info", 5),
        "body-not-base64": _broken(good, "body", "%%% not base64 %%%"),
        "rot13": _broken(good, "properties.body_encoding", "rot13"),
        "headers-list": _broken(good, "headers", ["task", MARK]),
        "headers-text": _broken(good, "headers", MARK),
        "nested-100000": b"[" * 100_000 + b"]" * 100_000,
        "task-list": _broken(good, "headers.task", ["tools.sec_echo"]),
        "task-dict": _broken(good, "headers.task", {"tools.sec_echo": 1}),
        "delivery-tag-list": _broken(good, "properties.delivery_tag", [MARK]),
    }


def _inboxes(fleet: Deployment) -> list[str]:
    client = redis_client(fleet.settings.redis_url or "")
    return list(client.scan_iter(f"{fleet.settings.key_prefix}:consumer:*:inboxes", count=1000))


def _refusal_lines(fleet: Deployment, digest: str) -> int:
    return sum(
        1 for line in fleet.log().splitlines() if "refused" in line and f"sha256={digest}" in line
    )


@pytest.mark.parametrize("kind", ["redis-inbox", "redis-brpop-prefork"])
def test_every_broken_item_on_a_redis_queue_is_dead_lettered_and_the_same_worker_serves_on(
    fleets: Fleets, kind: str
) -> None:
    """Given a live worker, when each broken item is pushed straight onto its Redis queue,
    then each is dead-lettered with a reason and logged once by queue and short hash (never
    its content), the queue and the worker's inbox no longer hold it, the worker processes
    are the same, and a normal call right after is served."""
    fleet = fleets(kind)
    pids = _pids(fleet)
    redis = redis_client(fleet.settings.redis_url or "")
    items = _redis_items(fleet.queue)
    for raw in items.values():
        redis.lpush(fleet.queue, raw)

    def lettered() -> dict[str, dict[str, Any]]:
        return {e["sha256"]: e for e in _letters(fleet)}

    wanted = {name: short_hash(raw) for name, raw in items.items()}
    assert eventually(lambda: len(lettered()) >= len(items), timeout=20), fleet.log()[-4000:]
    result = fleet.client.call("sec_echo", {"text": "still serving"}, timeout=20)

    letters = {sha[:12]: entry for sha, entry in lettered().items()}
    missing = [name for name, digest in wanted.items() if digest not in letters]
    assert not missing, fleet.log()[-4000:]
    assert all(letters[d]["reason"] and letters[d]["queue"] == fleet.queue for d in wanted.values())
    assert [_refusal_lines(fleet, d) for d in wanted.values()] == [1] * len(items)
    assert result.ok, result
    assert redis.llen(fleet.queue) == 0
    assert not list(redis.scan_iter(f"{fleet.settings.key_prefix}:consumer:*:inbox:*"))
    assert _pids(fleet) == pids
    log = fleet.log()
    assert MARK not in log and "Unrecoverable error" not in log
    assert all(MARK not in json.dumps(entry) for entry in letters.values())
    # the path under test: one queue moves into an inbox, two queues wait with BRPOP
    assert bool(_inboxes(fleet)) is (kind == "redis-inbox")


def _amqp_depth(fleet: Deployment) -> int:
    with Connection(fleet.broker) as conn:
        _, count, _ = conn.default_channel.queue_declare(fleet.queue, passive=True)
    return int(count)


def test_every_broken_message_on_rabbitmq_is_dead_lettered_and_the_same_worker_serves_on(
    fleets: Fleets,
) -> None:
    """Given a worker on RabbitMQ, when messages with bodies of the wrong shape or a task header
    that is a list, a mapping or missing are published, then each is dead-lettered with a
    reason, the queue is empty, the worker process is the same, and a normal call is served."""
    fleet = fleets("rabbitmq")
    pids = _pids(fleet)
    cases: list[tuple[Any, bytes]] = [
        ("tools.sec_echo", f"this is not json {{ {MARK}".encode()),
        ("tools.sec_echo", b"null"),
        ("tools.sec_echo", b"[]"),
        ("tools.sec_echo", b"5"),
        ("tools.sec_echo", b"{}"),
        ("tools.sec_echo", b"[" * 100_000 + b"]" * 100_000),
        (["tools.sec_echo"], json.dumps([[], {"arguments": {"text": MARK}}, {}]).encode()),
        ({"tools.sec_echo": 1}, json.dumps([[], {"arguments": {"text": MARK}}, {}]).encode()),
        (None, json.dumps({"m": MARK}).encode()),
    ]
    ids = [fleet.publish_raw(task, body) for task, body in cases]  # type: ignore[arg-type]

    def lettered() -> dict[str, dict[str, Any]]:
        return {e["id"]: e for e in _letters(fleet)}

    assert eventually(lambda: set(ids) <= set(lettered()), timeout=20), fleet.log()[-4000:]
    result = fleet.client.call("sec_echo", {"text": "still serving"}, timeout=20)

    letters = lettered()
    assert all(letters[i]["reason"] for i in ids)
    assert result.ok, result
    assert eventually(lambda: _amqp_depth(fleet) == 0, timeout=5)
    assert _pids(fleet) == pids
    assert MARK not in fleet.log()
    assert [fleet.log().count(f"id={i} ") for i in ids] == [1] * len(ids)


def _call_body(deadline_in: float, text: str = MARK) -> tuple[CallContext, bytes]:
    ctx = CallContext(
        call_id=str(uuid.uuid4()),
        tool="sec_echo",
        deadline=time.time() + deadline_in,
        submitted_at=time.time(),
        reply_to=uuid.uuid4().hex,
    )
    body = [[], {"arguments": {"text": text}, "context": ctx.to_json()}, {}]
    return ctx, json.dumps(body).encode()


def _eta(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def test_a_retries_header_of_ten_to_the_thirty_is_refused_not_run(fleets: Fleets) -> None:
    """Given a good call whose ``retries`` header is 10**30, then it is dead-lettered for its
    retries header and its caller gets no answer claiming 10**30 attempts."""
    fleet = fleets("redis-inbox")
    ctx, body = _call_body(20)
    fleet.publish_raw("tools.sec_echo", body, id=ctx.call_id, retries=10**30)

    assert eventually(lambda: any(e["id"] == ctx.call_id for e in _letters(fleet)))
    entry = next(e for e in _letters(fleet) if e["id"] == ctx.call_id)
    assert "retries" in entry["reason"]
    redis = redis_client(fleet.settings.redis_url or "")
    assert redis.llen(Keys(fleet.settings.key_prefix).reply(ctx.reply_to)) == 0
    assert fleet.client.call("sec_echo", {"text": "ok"}, timeout=20).ok


def _scheduled(fleet: Deployment) -> dict[str, int] | None:
    workers = gather(fleet.settings)["workers"]
    found = [w["scheduled"] for w in workers if w["name"] == fleet.worker.hostname]
    return found[0] if found else None


def test_far_future_etas_are_dead_lettered_and_what_a_worker_holds_is_bounded(
    fleets: Fleets,
) -> None:
    """Given a worker that may hold 3 scheduled messages, when 40 calls arrive with
    ``eta=2999``, one Celery message without a deadline has one too, and 8 calls have an eta
    within their deadline, then the far ones are dead-lettered for their deadline or the
    horizon, the worker holds exactly its bound (``toolexec status`` says 3/3), the rest
    are dead-lettered for the bound, and a normal call is still served."""
    fleet = fleets("redis-inbox")
    far = [_call_body(30) for _ in range(40)]
    for ctx, body in far:
        fleet.publish_raw("tools.sec_echo", body, id=ctx.call_id, eta="2999-01-01T00:00:00+00:00")
    plain = fleet.publish_raw("celery.accumulate", b"[[], {}, {}]", eta="2999-01-01T00:00:00+00:00")
    near = [_call_body(60) for _ in range(8)]
    for ctx, body in near:
        fleet.publish_raw("tools.sec_echo", body, id=ctx.call_id, eta=_eta(45))

    far_ids = {ctx.call_id for ctx, _ in far}
    near_ids = {ctx.call_id for ctx, _ in near}

    def reasons() -> dict[str, str]:
        return {e["id"]: e["reason"] for e in _letters(fleet)}

    done = eventually(lambda: len(set(reasons()) & (far_ids | near_ids | {plain})) >= 46, 20)
    assert done, fleet.log()[-3000:]
    found = reasons()
    assert all("beyond its call's deadline" in found[i] for i in far_ids)
    assert "horizon" in found[plain]
    bounded = [i for i in near_ids if i in found]
    assert len(bounded) == len(near) - MAX_SCHEDULED
    assert all("bound" in found[i] for i in bounded)
    held = {"held": MAX_SCHEDULED, "max": MAX_SCHEDULED}
    assert eventually(lambda: _scheduled(fleet) == held, timeout=10), _scheduled(fleet)
    assert fleet.client.call("sec_echo", {"text": "ok"}, timeout=20).ok
    assert MARK not in fleet.log()
