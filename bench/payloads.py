"""Large results: toolexec's claim check and preview vs bare Celery returning the text.

For each result size (1 KB, 1 MB, 10 MB, 50 MB by default) one worker serves
both a toolexec tool and a bare Celery task returning the same cached text;
rounds alternate the two. Measured per call:

- latency to a usable result: toolexec's ``ToolClient.call`` (a preview of at
  most the token budget, the text in the payload store) vs
  ``task.delay(size).get()`` (the whole text through the Redis result backend);
- bytes of the broker message (published once the worker has stopped, so it
  stays on the queue) and of the reply-list entry (toolexec) or the
  result-backend value (Celery), read off Redis;
- Redis traffic (``INFO stats`` net input + output) and Redis memory
  (``used_memory``) per call, the result left in place as in production.

Targets (issue 5): toolexec's latency at 10 MB <= 2x its latency at 1 KB, and
every message it puts through Redis <= 4 KB.

Usage: ``python bench/payloads.py [--quick] [--store redis|file] [--redis-url URL]``.
Exits 0 whatever the figures (``--strict``: 1 when a target is missed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis
from _common import (
    Row,
    forget,
    interleave,
    machine_info,
    median,
    print_report,
    progress,
    redis_server,
    require,
    run_settings,
    worker,
)
from celery import Celery

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.stores import liveness
from toolexec.worker.app import celery_config

KB, MB = 1024, 1024 * 1024
LATENCY_TARGET = 2.0
MESSAGE_TARGET = 4096
CALL_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...] = (KB, MB, 10 * MB, 50 * MB)
    calls: tuple[int, ...] = (40, 20, 10, 4)  # per side per round, by size
    rounds: int = 2
    store: str = "redis"
    redis_url: str | None = None
    strict: bool = False


QUICK: dict[str, Any] = {"calls": (10, 5, 3, 1), "rounds": 1}


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"a fast, smaller run: {QUICK}")
    parser.add_argument("--rounds", type=int, help="rounds, the two sides alternating (2)")
    parser.add_argument(
        "--store", choices=["redis", "file"], help="toolexec's payload store (redis)"
    )
    parser.add_argument("--redis-url", help="use this server instead of a fresh embedded Valkey")
    parser.add_argument(
        "--max-size-mb", type=float, help="skip sizes above this many MB (a smoke run: 1)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = vars(parser.parse_args(argv))
    config = replace(Config(), **QUICK) if args.pop("quick") else Config()
    largest = args.pop("max_size_mb")
    if largest is not None:
        kept = [
            (s, c) for s, c in zip(config.sizes, config.calls, strict=True) if s <= largest * MB
        ]
        config = replace(config, sizes=tuple(s for s, _ in kept), calls=tuple(c for _, c in kept))
    return replace(config, **{k: v for k, v in args.items() if v is not None})


@dataclass
class Side:
    """One contender's figures for one size."""

    latencies: list[float]
    message_bytes: int = 0
    result_bytes: int = 0  # reply-list entry or result-backend value
    traffic_bytes: float = 0.0  # Redis net in + out per call
    memory_bytes: float = 0.0  # Redis used_memory growth per call


class Meter:
    """Redis's own counters: network bytes in and out, memory in use."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def traffic(self) -> int:
        stats: dict[str, Any] = self.client.info("stats")
        return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])

    def memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])


class Toolexec:
    def __init__(self, settings: Settings, raw: redis.Redis) -> None:
        self.client = ToolClient(settings)
        self.raw = raw

    def call(self, size: int) -> float:
        start = time.perf_counter()
        result = self.client.call("bench_text", {"size": size}, timeout=CALL_TIMEOUT_S)
        seconds = time.perf_counter() - start
        require(result.ok, f"bench_text failed: {result.error}")
        return seconds

    def message_bytes(self, size: int) -> int:
        """The call's broker message; call only once the worker has stopped.

        The client answers ``no_worker`` without publishing when nobody serves the
        queue, so a stand-in heartbeat (never a consumer) lets this one call out.
        """
        queue, keys = self.client.settings.default_queue, self.client.keys
        stand_in = f"bench-message-size-{uuid.uuid4().hex[:8]}"
        liveness.beat(self.raw, keys, stand_in, [queue], self.client.clock.now())
        try:
            end = time.monotonic() + 5.0
            while True:  # the client re-reads who serves a queue at most once a second
                handle = self.client.submit("bench_text", {"size": size}, timeout=5)
                if self.raw.llen(queue) or time.monotonic() > end:
                    break
                handle.result()  # answered no_worker from a cached look-up: ask again
                time.sleep(0.2)
        finally:
            liveness.leave(self.raw, keys, stand_in, [queue])
        return _last_message(self.raw, queue)

    def reply_bytes(self, size: int) -> int:
        """The reply-list entry the worker pushes, read before the client pops it."""
        handle = self.client.submit("bench_text", {"size": size}, timeout=CALL_TIMEOUT_S)
        key = self.client.keys.reply(handle.call_id)
        end = time.monotonic() + CALL_TIMEOUT_S
        while not (entries := self.raw.lrange(key, 0, -1)) and time.monotonic() < end:
            time.sleep(0.005)
        result = handle.result()
        require(result.ok and (size < 4 * KB or result.payload is not None), f"{result}")
        return len(entries[0])

    def close(self) -> None:
        self.client.close()
        self.client.app.close()


class BareCelery:
    def __init__(self, settings: Settings, raw: redis.Redis, result_ids: list[str]) -> None:
        self.app = Celery("bench-bare-payloads", set_as_current=False)
        self.app.conf.update({**celery_config(settings), "task_ignore_result": False})
        self.task = self.app.task(name="bench.payload_text")(_runs_on_the_worker)
        self.raw = raw
        self.result_ids = result_ids

    def call(self, size: int) -> float:
        start = time.perf_counter()
        pending = self.task.delay(size)
        text = pending.get(timeout=CALL_TIMEOUT_S)
        seconds = time.perf_counter() - start
        self.result_ids.append(pending.id)
        require(len(text) == size, f"bench.payload_text returned {len(text)} bytes")
        return seconds

    def message_bytes(self, size: int) -> int:
        """The task's broker message; call only once the worker has stopped."""
        self.task.delay(size)
        return _last_message(self.raw, self.app.conf.task_default_queue)

    def backend_bytes(self) -> int:
        return int(self.raw.strlen(f"celery-task-meta-{self.result_ids[-1]}"))

    def close(self) -> None:
        self.app.close()


def _last_message(raw: redis.Redis, queue: str) -> int:
    """Bytes of the message just published onto ``queue`` (kombu LPUSHes; nobody consumes)."""
    entries = raw.lrange(queue, 0, 0)
    require(len(entries) == 1, f"no message on {queue!r}")
    raw.delete(queue)
    return len(entries[0])


def _runs_on_the_worker(size: int) -> str:
    raise AssertionError("bench.payload_text runs on the worker, never here")


def _per_call(
    meter: Meter, calls: int, run: Callable[[], list[float]]
) -> tuple[list[float], float, float]:
    """Latencies, and Redis traffic and memory growth per call, over ``calls`` calls."""
    traffic, memory = meter.traffic(), meter.memory()
    latencies = run()
    return latencies, (meter.traffic() - traffic) / calls, (meter.memory() - memory) / calls


def measure_size(
    size: int, calls: int, rounds: int, toolexec: Toolexec, bare: BareCelery, meter: Meter
) -> dict[str, Side]:
    toolexec.call(size), bare.call(size)  # warm caches: the text, connections
    sides = {"celery": Side([]), "toolexec": Side([])}
    runs = {
        "celery": lambda: _per_call(meter, calls, lambda: [bare.call(size) for _ in range(calls)]),
        "toolexec": lambda: _per_call(
            meter, calls, lambda: [toolexec.call(size) for _ in range(calls)]
        ),
    }
    for name, outcomes in interleave(rounds, runs).items():
        side = sides[name]
        for latencies, traffic, memory in outcomes:
            side.latencies += latencies
            side.traffic_bytes += traffic / rounds
            side.memory_bytes += memory / rounds
    sides["celery"].result_bytes = bare.backend_bytes()
    sides["toolexec"].result_bytes = toolexec.reply_bytes(size)
    return sides


def _label(size: int) -> str:
    return f"{size // MB} MB" if size >= MB else f"{size // KB} KB"


def _bytes(n: float) -> str:
    if n >= MB:
        return f"{n / MB:.1f} MB"
    return f"{n / KB:.1f} KB" if n >= KB else f"{n:.0f} B"


def rows_for(size: int, sides: dict[str, Side], base_ms: float) -> list[Row]:
    bare, ours = sides["celery"], sides["toolexec"]
    bare_ms, ours_ms = 1000 * median(bare.latencies), 1000 * median(ours.latencies)
    label = _label(size)
    is_target = size == 10 * MB
    largest = max(ours.message_bytes, ours.result_bytes)
    return [
        Row(
            label,
            "p50 latency to result (ms)" + (" / vs toolexec 1 KB" if is_target else ""),
            f"{bare_ms:.1f}",
            f"{ours_ms:.1f}" + (f" ({ours_ms / base_ms:.2f}x 1 KB)" if is_target else ""),
            ours_ms / bare_ms,
            f"<= {LATENCY_TARGET}x 1 KB" if is_target else "",
            (ours_ms <= LATENCY_TARGET * base_ms) if is_target else None,
        ),
        Row(
            label,
            "broker message",
            _bytes(bare.message_bytes),
            _bytes(ours.message_bytes),
            ours.message_bytes / bare.message_bytes,
            "",
            None,
        ),
        Row(
            label,
            "backend value / reply entry",
            _bytes(bare.result_bytes),
            _bytes(ours.result_bytes),
            ours.result_bytes / bare.result_bytes,
            f"<= {MESSAGE_TARGET} B",
            largest <= MESSAGE_TARGET,
        ),
        Row(
            label,
            "Redis traffic per call",
            _bytes(bare.traffic_bytes),
            _bytes(ours.traffic_bytes),
            ours.traffic_bytes / max(bare.traffic_bytes, 1),
            "",
            None,
        ),
        Row(
            label,
            "Redis memory per call",
            _bytes(bare.memory_bytes),
            _bytes(max(ours.memory_bytes, 0)),
            max(ours.memory_bytes, 0) / max(bare.memory_bytes, 1),
            "",
            None,
        ),
    ]


@contextlib.contextmanager
def _payload_store(store: str) -> Iterator[str]:
    """The payload-store setting for this run; a file store lives in a temporary directory."""
    if store == "redis":
        yield "redis"
        return
    with tempfile.TemporaryDirectory(prefix="toolexec-bench-payloads-") as tmp:
        yield f"file://{tmp}"


def run(config: Config) -> tuple[list[Row], list[tuple[str, str]]]:
    with (
        redis_server(config.redis_url) as server,
        tempfile.TemporaryDirectory(prefix="toolexec-bench-") as tmp,
        _payload_store(config.store) as store,
    ):
        settings = run_settings(server.url, Path(tmp), payload_store=store, default_timeout=600)
        os.environ["TOOLEXEC_PAYLOAD_STORE"] = store  # the worker inherits it
        raw = redis.Redis.from_url(server.url)
        result_ids: list[str] = []
        log = Path(tmp) / "worker.log"
        toolexec, bare = Toolexec(settings, raw), BareCelery(settings, raw, result_ids)
        measured: dict[int, dict[str, Side]] = {}
        try:
            with worker(
                settings, "payload_bench_tools", concurrency=4, pool="threads", log_path=log
            ):
                for size, calls in zip(config.sizes, config.calls, strict=True):
                    progress(f"{_label(size)}: {calls} calls per side, {config.rounds} round(s)")
                    measured[size] = measure_size(
                        size, calls, config.rounds, toolexec, bare, Meter(raw)
                    )
            for size, sides in measured.items():  # the worker is gone: messages stay put
                sides["celery"].message_bytes = bare.message_bytes(size)
                sides["toolexec"].message_bytes = toolexec.message_bytes(size)
        finally:
            toolexec.close()
            bare.close()
            forget(server.url, settings, result_ids)
            raw.close()
        base_ms = 1000 * median(measured[config.sizes[0]]["toolexec"].latencies)
        rows = [row for size, sides in measured.items() for row in rows_for(size, sides, base_ms)]
        info = machine_info(server.url)
    return rows, info


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    rows, info = run(config)
    notes = [
        "baseline: bare Celery, `task.delay(size).get()`, the text through the Redis result "
        "backend (SETEX + PUBLISH of the whole value); toolexec: `ToolClient.call`, the text "
        f"in the payload store ({config.store}), a preview of <= 600 tokens in the reply",
        "latency: median over all calls; both sides return the same cached text, one worker "
        "(threads pool, 4 slots), rounds alternating the two sides",
        "messages measured off Redis: the broker message published once the worker has "
        "stopped (LRANGE), the reply-list entry before the client pops it, the backend value "
        "(STRLEN; Celery also PUBLISHes it once more)",
        "traffic: Redis INFO total_net_input_bytes + total_net_output_bytes per call; "
        "memory: used_memory growth per call with results kept (toolexec TTL 1 h, Celery 1 day)",
    ]
    print_report("Large results: toolexec payloads vs bare Celery", rows, info, notes)
    missed = [row for row in rows if row.passed is False]
    return 1 if config.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
