"""``toolexec status``: the fleet at a glance, from any host.

Queue depths come from the broker (``LLEN`` of each tool queue and its
priority sub-queues on Redis, a passive ``queue_declare`` on RabbitMQ);
workers from the catalog heartbeats (and, with ``--ping``, from a Celery
ping); breakers from their Redis state; calls in flight and the last minutes'
retry and failure rates from the workers' counters (:mod:`toolexec.stores.stats`).
Everything is read, nothing is changed, except that leases of attempts whose
worker died are pruned.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import click
import redis
from kombu.transport.redis import PRIORITY_STEPS, Channel

from toolexec.breaker import CircuitBreaker
from toolexec.connection import redact_url, redis_client, redis_url, unavailable
from toolexec.keys import BrokerKeys, Keys
from toolexec.ops.cli_support import reported
from toolexec.ops.processes import process_label
from toolexec.settings import Settings
from toolexec.stores import catalog as catalog_mod
from toolexec.stores.fairness_store import FairnessStore, QueueLanes
from toolexec.stores.liveness import scheduled_counts, workers_alive
from toolexec.stores.stats import CallStats

__all__ = ["amqp_depths", "gather", "queue_names", "redis_depths", "status"]


def queue_names(catalog: catalog_mod.Catalog, default_queue: str) -> list[str]:
    """Every queue some published tool is routed to, and the default one."""
    names = {default_queue}
    for entry in catalog.values():
        names.add(entry.get("policy", {}).get("queue") or default_queue)
    return sorted(names)


def redis_depths(client: redis.Redis, names: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue on a Redis broker, priority sub-queues included.

    kombu keeps a queue as one list per priority step (``name``, then
    ``name\\x06\\x163``, ...); delivered but unacknowledged messages are not in
    them (see :func:`redis_unacked`).
    """
    pipe = client.pipeline(transaction=False)
    for name in names:
        for step in PRIORITY_STEPS:
            pipe.llen(f"{name}{Channel.sep}{step}" if step else name)
    lengths = iter(pipe.execute())
    return {name: sum(next(lengths) for _ in PRIORITY_STEPS) for name in names}


def redis_unacked(client: redis.Redis) -> int:
    """Messages delivered to workers and not yet acknowledged: running, prefetched or
    waiting for their retry's countdown inside a worker."""
    return int(client.hlen(Channel.unacked_key))


def amqp_depths(url: str, names: Sequence[str]) -> dict[str, int | None]:
    """Messages ready in each queue on RabbitMQ; None for a queue not declared yet."""
    from kombu.connection import Connection

    out: dict[str, int | None] = {}
    with Connection(url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]
        for name in names:
            try:
                with conn.channel() as channel:
                    _, count, _ = channel.queue_declare(queue=name, passive=True)
                out[name] = int(count)
            except conn.channel_errors:
                out[name] = None  # passive declare of a missing queue closes the channel
    return out


def redis_lanes(
    client: redis.Redis, names: Sequence[str], prefix: str, now: float
) -> dict[str, QueueLanes]:
    """What waits in each queue's fairness lanes (toolexec.transport.lanes), by priority and top
    keys."""
    store = FairnessStore(client, BrokerKeys(prefix))
    return {name: store.lanes(name, now) for name in names}


def _broker_view(broker: str, names: Sequence[str], prefix: str, now: float) -> dict[str, Any]:
    view: dict[str, Any] = {"broker": redact_url(broker)}
    lanes: dict[str, QueueLanes] = {}
    if broker.startswith(("amqp://", "amqps://", "pyamqp://")):
        depths: dict[str, int | None] = dict(amqp_depths(broker, names))
        view["unacked"] = None  # RabbitMQ counts them per queue; its own UI shows them
    else:
        client = redis_client(broker, socket_timeout=5.0)
        try:
            depths = dict(redis_depths(client, names))
            lanes = redis_lanes(client, names, prefix, now)
            view["unacked"] = redis_unacked(client)
        finally:
            client.close()
    view["queues"] = [
        {
            "name": name,
            "waiting": _waiting(depths[name], lanes.get(name)),
            **({"lanes": lanes[name].to_json()} if name in lanes and lanes[name].in_lanes else {}),
        }
        for name in names
    ]
    return view


def _waiting(depth: int | None, lanes: QueueLanes | None) -> int | None:
    return depth if depth is None or lanes is None else depth + lanes.in_lanes


def _workers(client: redis.Redis, keys: Keys, now: float, pinged: set[str] | None) -> list[Any]:
    names = dict(workers_alive(client, keys, now))
    for name in pinged or ():
        names.setdefault(name, float("nan"))
    scheduled = scheduled_counts(client, keys)
    return [
        {
            "name": name,
            "process": process_label(name, list(names)),
            "heartbeat_age_s": None if at != at else round(max(0.0, now - at), 1),
            "answered_ping": None if pinged is None else name in pinged,
            "scheduled": scheduled.get(name),
        }
        for name, at in sorted(names.items())
    ]


def _ping(settings: Settings, timeout: float) -> set[str]:
    from toolexec.worker.app import create_app

    celery_app = create_app(settings)
    try:
        replies = celery_app.control.ping(timeout=timeout) or []
    finally:
        celery_app.close()
    return {name for reply in replies for name in reply}


def _tools(stats: CallStats, catalog: catalog_mod.Catalog, minutes: int) -> list[dict[str, Any]]:
    from toolexec.stores.stats import ToolStats

    seen = stats.window(minutes)
    names = sorted(set(seen) | set(catalog))
    return [seen.get(name, ToolStats(tool=name)).to_json() for name in names]


def gather(
    settings: Settings, minutes: int = 5, ping_timeout: float | None = None
) -> dict[str, Any]:
    """Everything ``toolexec status`` shows, as JSON-able data."""
    url = redis_url(settings)
    client = redis_client(url, socket_timeout=5.0)
    keys = Keys(settings.key_prefix)
    try:
        now = float(client.time()[0])
        catalog = catalog_mod.read(client, keys)
        out: dict[str, Any] = {"at": now, "minutes": minutes}
        out |= _broker_view(
            settings.broker_url or url,
            queue_names(catalog, settings.default_queue),
            settings.key_prefix,
            now,
        )
        pinged = None if ping_timeout is None else _ping(settings, ping_timeout)
        out["workers"] = _workers(client, keys, now, pinged)
        out["breakers"] = [v.to_json() for v in CircuitBreaker(client, keys).snapshot_all()]
        out["tools"] = _tools(CallStats(client, keys), catalog, minutes)
        return out
    except redis.RedisError as exc:
        raise unavailable(url, exc) from exc
    finally:
        client.close()


# -- rendering -----------------------------------------------------------------


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _section(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[Any]:
    """A bold title line, then a compact table that fits 80 columns.

    Names (tools, workers, breakers, error types) never wrap: a name broken in
    two ("get_weat/her") cannot be copied into the next command. Numbers are
    short, so the columns are few and narrow instead.
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    return [Text(title, style="bold"), table]


def _queues(view: dict[str, Any]) -> list[Any]:
    unacked = view["unacked"]
    title = f"Queues on {view['broker']}"
    if unacked is not None:
        title += f" ({unacked} delivered to workers, not yet acknowledged)"
    rows = [(q["name"], "-" if q["waiting"] is None else q["waiting"]) for q in view["queues"]]
    out = _section(title, ["QUEUE", "WAITING"], rows)
    for queue in view["queues"]:
        if "lanes" in queue:
            out += _lanes_section(queue["name"], queue["lanes"])
    return out


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _lanes_section(name: str, lanes: dict[str, Any]) -> list[Any]:
    """A queue's lanes: per priority, then the fairness keys with the most calls waiting."""
    levels = [(p, v["waiting"], _age(v["oldest_s"])) for p, v in lanes["priorities"].items()]
    keys = [
        (k["key"] or "(none)", k["priority"], k["waiting"], _age(k["oldest_s"]))
        for k in lanes["top_keys"]
    ]
    more = " (a sample: more keys wait)" if lanes["sampled"] else ""
    return [
        *_section(
            f"Lanes of {name} by priority (1 most urgent)",
            ["PRIORITY", "WAITING", "OLDEST"],
            levels,
        ),
        *_section(
            f"Top fairness keys of {name}{more}", ["KEY", "PRIORITY", "WAITING", "OLDEST"], keys
        ),
    ]


def _workers_section(view: dict[str, Any]) -> list[Any]:
    ping = {None: "-", True: "pong", False: "no answer"}
    rows = [
        (
            w["name"] if not w.get("process") else f"{w['name']} (process {w['process']})",
            "-" if w["heartbeat_age_s"] is None else f"{w['heartbeat_age_s']} s ago",
            ping[w["answered_ping"]],
            _held(w.get("scheduled")),
        )
        for w in view["workers"]
    ]
    return _section("Workers", ["WORKER", "LAST HEARTBEAT", "PING", "SCHEDULED"], rows)


def _held(scheduled: dict[str, int] | None) -> str:
    """Messages with a future eta the worker holds, of its bound (``worker_max_scheduled``)."""
    return "-" if not scheduled else f"{scheduled['held']}/{scheduled['max']}"


def _breakers_section(view: dict[str, Any]) -> list[Any]:
    rows = [
        (b["name"], b["state"], f"{b['failures']}/{b['calls']}", _rate(b["failure_rate"]))
        for b in view["breakers"]
    ]
    return _section("Circuit breakers", ["BREAKER", "STATE", "FAILED", "RATE"], rows)


def _tools_section(view: dict[str, Any]) -> list[Any]:
    # RUN: attempts running now; CALLS: calls that ended, those a fallback answered
    # included (FALLBK%: their share); TRIES: attempts in the window, retries included.
    # (OK is CALLS - FAIL, in --json: the column went for FALLBK% within 80 columns.)
    columns = ["TOOL", "RUN", "CALLS", "FAIL", "FAIL%", "FALLBK%", "TRIES", "RETRY%"]
    rows = [
        (
            t["tool"],
            t["in_flight"],
            t["calls"],
            sum(t["failed"].values()),
            _rate(t["failure_rate"]),
            _rate(t.get("degraded_rate")),
            t["attempts"],
            _rate(t["retry_rate"]),
        )
        for t in view["tools"]
    ]
    return _section(f"Tools, last {view['minutes']} min", columns, rows)


def _failures_section(view: dict[str, Any]) -> list[Any]:
    """Failures by error type, one row each: a column of its own would not fit 80 columns."""
    rows = [
        (t["tool"], kind, count)
        for t in view["tools"]
        for kind, count in t["failed"].items()
        if count
    ]
    if not rows:
        return []
    return _section(
        f"Failures by type, last {view['minutes']} min", ["TOOL", "ERROR", "CALLS"], rows
    )


def _render(view: dict[str, Any]) -> list[Any]:
    return [
        *_queues(view),
        *_workers_section(view),
        *_breakers_section(view),
        *_tools_section(view),
        *_failures_section(view),
    ]


@click.command()
@click.option(
    "--minutes",
    type=click.IntRange(1, 60),
    default=5,
    show_default=True,
    help="How many minutes the rates cover.",
)
@click.option("--ping", is_flag=True, help="Also ping the workers over the broker (waits 1 s).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def status(minutes: int, ping: bool, as_json: bool) -> None:
    """Queue depths, workers, breakers, calls in flight, retry and failure rates."""
    with reported():
        view = gather(Settings.from_env(), minutes, ping_timeout=1.0 if ping else None)
    if as_json:
        click.echo(json.dumps(view, indent=2, sort_keys=True))
        return
    from rich.console import Console

    console = Console()
    for part in _render(view):
        console.print(part)
