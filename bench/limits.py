"""Limits under load: a batch that outlives its deadline, and results far past their limit.

Two parts (issue 22, items 5 and 6), each printing a table:

``batch``: on a fresh Valkey with one threads worker (8 slots), one
``call_many`` of ``--calls`` no-ops with ``--timeout`` seconds, the client's
batch limit raised to fit. Reported: how many came back ok, how long the call
took, how many messages were left in the queue when it returned, and how long a
fresh call made right after took to answer (it waits behind whatever is left).

``results``: in this process, the payload layer's decision for one text of
``--megabytes`` MB on a single line under the default 256 MiB limit (refused),
and the encoding of a single-line text under the limit, beside the newline
search the encoder used before (from the line's start at every 64 KiB mark,
kept here as the baseline) on the same text.

Usage: ``python bench/limits.py batch [--calls N] [--timeout S]`` or
``python bench/limits.py results [--megabytes N] [--under N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis
from _common import command_line, machine_info, markdown_table, progress, run_settings, worker
from overhead import load_average, own_server

from toolexec.client import ToolClient
from toolexec.payloads.encoding import MARK_EVERY_BYTES
from toolexec.settings import Settings


def _batch(settings: Settings, tmp: Path, calls: int, timeout: float) -> list[list[str]]:
    with (
        worker(
            settings,
            "bench_tools",
            concurrency=8,
            pool="threads",
            log_path=tmp / "w.log",
            queues=settings.default_queue,
        ),
        ToolClient(settings) as client,
    ):
        client.call("bench_noop", {}, timeout=60)
        progress(f"batch: call_many of {calls} no-ops, timeout {timeout:g} s")
        start = time.perf_counter()
        results = client.call_many([("bench_noop", {})] * calls, timeout=timeout)
        took = time.perf_counter() - start
        queue = redis.Redis.from_url(settings.redis_url or "")
        left = int(queue.llen(settings.default_queue))  # type: ignore[arg-type]
        start = time.perf_counter()
        fresh = client.call("bench_noop", {}, timeout=120)
        fresh_s = time.perf_counter() - start
        left_after = int(queue.llen(settings.default_queue))  # type: ignore[arg-type]
        queue.close()
    ok = sum(1 for r in results if r.ok)
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[str(r.error.type)] = errors.get(str(r.error.type), 0) + 1
    return [
        [f"call_many of {calls}, timeout {timeout:g} s", f"{took:.1f} s", "until it returned"],
        ["calls ok", f"{ok}", ", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))],
        ["messages left in the queue", f"{left}", "when call_many returned"],
        ["a fresh call right after", f"{fresh_s:.2f} s", f"ok={fresh.ok}; {left_after} left"],
    ]


def _old_marks(body: bytes) -> int:
    """The encoder's newline search before issue 22: back to the line start at each mark."""
    line = pos = 0
    for boundary in range(MARK_EVERY_BYTES, len(body), MARK_EVERY_BYTES):
        newline = body.rfind(b"\n", pos, boundary)
        if newline < 0:
            continue
        line += body.count(b"\n", pos, newline + 1)
        pos = newline + 1
    return line


def _results(megabytes: int, under: int) -> list[list[str]]:
    from toolexec.payloads.encoding import TooLarge, encode, text_marks
    from toolexec.payloads.offload import oversized

    limit = Settings().payload_max_bytes
    big = "x" * (megabytes * 1_000_000)
    progress(f"results: {megabytes} MB on one line against the {limit:,}-byte limit")
    start = time.perf_counter()
    try:
        oversized(big, 32_768, limit)
        verdict = "stored"
    except TooLarge:
        verdict = "result_too_large"
    refused_s = time.perf_counter() - start
    del big
    text = "x" * (under * 1_000_000)
    progress(f"results: encoding {under} MB on one line (under the limit), new and old search")
    start = time.perf_counter()
    encoded = encode(text, limit)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    text_marks(encoded.body, MARK_EVERY_BYTES)
    marks_s = time.perf_counter() - start
    start = time.perf_counter()
    _old_marks(encoded.body)
    old_s = time.perf_counter() - start
    return [
        [f"{megabytes} MB single line, limit 256 MiB", f"{refused_s:.3f} s", verdict],
        [f"encode {under} MB single line (whole)", f"{encode_s:.3f} s", "UTF-8 and marks"],
        [f"marks of {under} MB single line, now", f"{marks_s:.3f} s", "linear search"],
        [
            f"marks of {under} MB single line, before",
            f"{old_s:.3f} s",
            f"search from the line start: {old_s / max(marks_s, 1e-9):.0f}x",
        ],
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["batch", "results"])
    parser.add_argument("--calls", type=int, default=20_000, help="calls in the batch (20000)")
    parser.add_argument("--timeout", type=float, default=6.0, help="the batch's timeout (6)")
    parser.add_argument("--megabytes", type=int, default=300, help="text past the limit (300)")
    parser.add_argument("--under", type=int, default=100, help="text under the limit (100)")
    args = parser.parse_args(argv)
    loads = [load_average()]
    with own_server() as server, tempfile.TemporaryDirectory() as tmp_name:
        if args.part == "batch":
            # a code base from before the batch limit has no such setting
            known = "max_batch_calls" in Settings.model_fields
            fits = {"max_batch_calls": args.calls} if known else {}
            settings = run_settings(server.url, Path(tmp_name), reply_grace=2.0, **fits)
            rows = _batch(settings, Path(tmp_name), args.calls, args.timeout)
        else:
            rows = _results(args.megabytes, args.under)
        loads.append(load_average())
        info = machine_info(server.url)
    print(f"\n## Limits: {args.part}\n")
    print(markdown_table(["figure", "value", "note"], rows))
    print("\n- load average (1 min): " + ", ".join(f"{x:.2f}" for x in loads))
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
