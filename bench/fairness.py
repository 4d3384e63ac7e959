"""Fairness lanes: weighted shares under a mixed backlog, and the cost of one take.

Two parts (issue 26), each printing a table:

``shares``: on a fresh Valkey, one threads worker of 8 slots, three fairness
keys with weights 1, 2 and 4 (``toolexec fairness set``), each with a backlog
larger than it can get through in the window; the tool counts its starts per
key in Redis. The slots are held by gate calls while every backlog is queued,
so the window starts with all of them waiting, however slow the machine; over
``--seconds`` (30), or until a key's backlog runs dry (said under the table),
each key's share of the starts is compared with its weight's share (1/7, 2/7, 4/7).

``dispatch``: the take itself, without a worker. A queue holds ``--messages``
task envelopes spread over 1, 1 000 and 10 000 fairness keys; each take is one
call of the lane script (sorting queued messages into lanes on the way, as a
worker's does), and the moved message is then removed from the inbox, as the
unacknowledged record's MULTI does. The baseline is the plain path on the same
server in the same run: ``LMOVE queue inbox`` (what the consumer's ``BLMOVE``
does when a message waits) and the same removal. Reported per take: the
client's round trip and the server's own time (``INFO commandstats``).

Usage: ``python bench/fairness.py shares [--seconds 30]`` or
``python bench/fairness.py dispatch [--messages 20000]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis
from _common import command_line, machine_info, markdown_table, progress, run_settings, worker
from overhead import load_average, own_server

from toolexec.client import ToolClient
from toolexec.keys import BrokerKeys
from toolexec.settings import Settings
from toolexec.stores.fairness_store import FairnessStore
from toolexec.transport.lanes import take_args

WEIGHTS = {"w1": 1.0, "w2": 2.0, "w4": 4.0}

#: Calls queued per unit of weight: more than a key can start in 30 s at the slots' ceiling
#: (8 slots of 10 ms: 800 starts/s, 4/7 of them the weight-4 key's).
BACKLOG_PER_WEIGHT = 4_000

#: The worker's slots (one threads worker).
SLOTS = 8


def _started(client: redis.Redis, settings: Settings) -> dict[str, int]:
    keys = [f"{settings.key_prefix}:bench:started:{k}" for k in WEIGHTS]
    return {k: int(v or 0) for k, v in zip(WEIGHTS, client.mget(keys), strict=True)}


def _hold_slots(client: ToolClient, gate: Path) -> None:
    """Every slot busy on a gate call, so the backlog is all queued before one call starts."""
    for _ in range(SLOTS):
        client.submit("fair_gate", {"flag": str(gate)}, timeout=600)
    end = time.monotonic() + 120
    while len(list(gate.parent.glob(f"{gate.name}.held.*"))) < SLOTS:
        if time.monotonic() > end:
            raise SystemExit("shares: the worker did not start its gate calls within 120 s")
        time.sleep(0.05)


def _count(
    broker: redis.Redis, settings: Settings, seconds: float, queued: dict[str, int]
) -> tuple[dict[str, int], float, str]:
    """Starts per key over the window, which ends early when a key's backlog runs dry.

    A key with nothing left can take no share, so counting past that point would
    measure the backlog's sizes, not the dispatch.
    """
    start = time.monotonic()
    while True:
        started = _started(broker, settings)
        took = time.monotonic() - start
        dry = [k for k in WEIGHTS if started[k] >= queued[k]]
        if dry:
            return started, took, f"ended early: {dry[0]}'s backlog ran dry"
        if took >= seconds:
            return started, took, "every key had a backlog throughout"
        time.sleep(0.02)


def _shares(
    settings: Settings, tmp: Path, seconds: float, nap_ms: int, backlog: int
) -> tuple[list[list[str]], list[tuple[str, str]]]:
    broker = redis.Redis.from_url(settings.redis_url or "")
    store = FairnessStore(broker, BrokerKeys(settings.key_prefix))
    for key, weight in WEIGHTS.items():
        store.set(key, weight)
    queued = {key: int(weight * backlog) for key, weight in WEIGHTS.items()}
    gate = tmp / "open"
    with (
        worker(
            settings,
            "fairness_tools",
            concurrency=SLOTS,
            pool="threads",
            log_path=tmp / "w.log",
            queues=settings.default_queue,
        ),
        ToolClient(settings) as client,
    ):
        _hold_slots(client, gate)
        progress(f"shares: slots held; queueing {sum(queued.values())} calls of {nap_ms} ms")
        for key, count in queued.items():
            for _ in range(count):
                client.submit(
                    "fair_count", {"key": key, "ms": nap_ms}, fairness_key=key, timeout=600
                )
        progress(f"shares: every key has its backlog; counting starts for {seconds:g} s")
        gate.touch()
        started, took, why = _count(broker, settings, seconds, queued)
    broker.close()
    all_started = sum(started.values()) or 1
    rows = []
    for key, weight in WEIGHTS.items():
        share = started[key] / all_started
        expected = weight / sum(WEIGHTS.values())
        rows.append(
            [
                key,
                f"{weight:g}",
                f"{started[key]}",
                f"{share:.1%}",
                f"{expected:.1%}",
                f"{(share - expected) / expected:+.1%}",
                f"{queued[key] - started[key]}",
            ]
        )
    return rows, [("window", f"{took:.1f} s ({why})")]


def _envelope(key: str | None, i: int) -> bytes:
    """A task message as kombu stores it, with a lane header when ``key`` is given."""
    body = base64.b64encode(json.dumps([[], {"context": {"submitted_at": 0}}, {}]).encode())
    headers = {"task": "tools.x", "id": uuid.uuid4().hex}
    if key is not None:
        headers["toolexec_lane"] = f"3|{key}"
    envelope = {
        "body": body.decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {"body_encoding": "base64", "delivery_tag": f"tag-{i}", "priority": 0},
    }
    return json.dumps(envelope).encode()


def _fill(client: redis.Redis, queue: str, messages: int, keys: int | None) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(messages):
        pipe.lpush(queue, _envelope(None if keys is None else f"k{i % keys}", i))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


def _server_usec(client: redis.Redis, command: str) -> float:
    stats = client.info("commandstats")
    entry = stats.get(f"cmdstat_{command}", {})
    return float(entry.get("usec", 0))


def _takes(
    client: redis.Redis, queue: str, inbox: str, messages: int, keys: int | None
) -> list[str]:
    """Take every message of ``queue``; the client's and the server's time per take."""
    bkeys = BrokerKeys(f"bench-{uuid.uuid4().hex[:6]}")
    _fill(client, queue, messages, keys)
    if keys is not None:
        script = client.register_script(_lane_source())
        args = take_args(bkeys, queue, inbox, b"", "", 3600.0)
        count = int(args[0])
        names, argv = args[1 : 1 + count], args[1 + count :]
        script(keys=names, args=argv)  # loaded, and the first message out
        client.lpop(inbox)
        taken = 1
        command = "evalsha"
    else:
        taken = 0
        command = "lmove"
    server_before = _server_usec(client, command)
    start = time.perf_counter()
    while True:
        if keys is None:
            item = client.lmove(queue, inbox, "RIGHT", "LEFT")
        else:
            item = script(keys=names, args=argv)[0]
        if item is None:
            break
        client.lrem(inbox, 1, item)
        taken += 1
    took = time.perf_counter() - start
    server = _server_usec(client, command) - server_before
    leftovers = list(client.scan_iter(f"{bkeys.prefix}:*"))
    if leftovers:
        client.delete(*leftovers)
    label = "plain queue (LMOVE), baseline" if keys is None else f"lanes, {keys:,} active keys"
    per = max(taken - (0 if keys is None else 1), 1)
    return [label, f"{taken:,}", f"{took / per * 1e6:.0f} µs", f"{server / per:.1f} µs"]


def _lane_source() -> str:
    from toolexec.lua import script_source

    return script_source("fair_take")


def _dispatch(url: str, messages: int) -> list[list[str]]:
    client = redis.Redis.from_url(url)
    queue, inbox = f"bench-q-{uuid.uuid4().hex[:6]}", f"bench-inbox-{uuid.uuid4().hex[:6]}"
    rows = []
    for keys in (None, 1, 1_000, 10_000):
        progress(f"dispatch: {messages} messages, keys={keys}")
        rows.append(_takes(client, queue, inbox, messages, keys))
    client.delete(queue, inbox)
    client.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["shares", "dispatch"])
    parser.add_argument("--seconds", type=float, default=30.0, help="the shares' window (30)")
    parser.add_argument("--nap-ms", type=int, default=10, help="each call's length (10 ms)")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per take run")
    parser.add_argument(
        "--backlog", type=int, default=BACKLOG_PER_WEIGHT, help="calls queued per unit of weight"
    )
    args = parser.parse_args(argv)
    loads = [load_average()]
    with own_server() as server, tempfile.TemporaryDirectory() as tmp_name:
        if args.part == "shares":
            settings = run_settings(server.url, Path(tmp_name), reply_grace=2.0)
            rows, notes = _shares(settings, Path(tmp_name), args.seconds, args.nap_ms, args.backlog)
            headers = ["key", "weight", "started", "share", "weight's share", "off by", "left"]
        else:
            rows, notes = _dispatch(server.url, args.messages), []
            headers = ["take", "messages", "round trip / take", "server time / take"]
        loads.append(load_average())
        info = machine_info(server.url)
    print(markdown_table(headers, rows))
    print()
    for name, value in [
        *notes,
        *info,
        ("load average (1 min), before/after", f"{loads[0]} / {loads[1]}"),
    ]:
        print(f"- {name}: {value}")
    print(f"- command: `{command_line()}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
