"""Every Redis command one call issues, in order, and which process sent it.

A real worker (threads pool) and a client on a fresh Valkey of their own; after
a warm-up, ``MONITOR`` records one ``ToolClient.call`` of a no-op with every
default layer on. Each command is attributed to the worker or the client by
the connection's port (``/proc``), and scripts are named by what they do, so
the list shows which round trips an attempt could fold together.

Usage: ``python bench/commands.py [--tool bench_noop] [--calls 1]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from _common import command_line, run_settings, worker
from overhead import own_server

from toolexec.client import ToolClient
from toolexec.lua import script_source


def socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def script_names() -> dict[str, str]:
    """SHA-1 of each script in ``toolexec/lua`` -> its name, to name EVALSHA lines."""
    names: dict[str, str] = {}
    folder = resources.files("toolexec.lua")
    scripts = [p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua")]
    for name in scripts:  # alone, or after any other file (a family's shared part)
        sources = [script_source(name)] + [script_source(head, name) for head in scripts]
        for body in sources:
            names[hashlib.sha1(body.encode()).hexdigest()] = name
    return names


def record(url: str, seconds: float, out: list[dict[str, Any]], ready: threading.Event) -> None:
    """What MONITOR shows for ``seconds``: one dict per command (redis-py's parsing)."""
    client = redis.Redis.from_url(url)
    with client.monitor() as monitor:
        ready.set()
        end = time.monotonic() + seconds
        conn = monitor.connection
        assert conn is not None
        while time.monotonic() < end:
            if conn.can_read(timeout=0.1):
                out.append(monitor.next_command())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", default="bench_noop")
    parser.add_argument("--calls", type=int, default=1)
    args = parser.parse_args(argv)
    names = script_names()
    with own_server() as server, tempfile.TemporaryDirectory() as tmp:
        settings = run_settings(server.url, Path(tmp))
        with (
            worker(
                settings,
                "bench_tools",
                concurrency=8,
                pool="threads",
                log_path=Path(tmp) / "w.log",
                queues=settings.default_queue,
            ) as proc,
            ToolClient(settings) as client,
        ):
            assert proc.process is not None
            for _ in range(20):
                client.call(args.tool, {}, timeout=60)
            time.sleep(1.5)  # let the worker's idle polling settle into its rhythm
            lines: list[dict[str, Any]] = []
            ready = threading.Event()
            recorder = threading.Thread(
                target=record, args=(server.url, 1.0 + 0.05 * args.calls, lines, ready)
            )
            recorder.start()
            ready.wait()
            time.sleep(0.05)
            for _ in range(args.calls):
                client.call(args.tool, {}, timeout=60)
            worker_ports = socket_ports(proc.process.pid)
            client_ports = socket_ports(os.getpid())
            recorder.join()
    print(f"\n## Redis commands of {args.calls} call(s) of {args.tool}\n")
    tally: Counter[tuple[str, str]] = Counter()
    skipping = False
    for entry in lines:
        words = entry["command"].split(" ")
        cmd, rest = words[0].upper(), " ".join(words[1:])
        port = entry.get("client_port")
        who = (
            "lua"
            if entry.get("client_type") == "lua"
            else (
                "worker"
                if port and int(port) in worker_ports
                else "client"
                if port and int(port) in client_ports
                else "other"
            )
        )
        background = (
            cmd in ("BRPOP", "PING")
            or names.get(words[1] if len(words) > 1 else "", "") == "idempotency_due"
        )
        if background or (who == "lua" and skipping):
            # the worker's idle polling of its queues; the lease sweeper's scan and its Lua
            skipping = background or (who == "lua" and skipping)
            continue
        skipping = False
        detail = rest[:110]
        if cmd == "EVALSHA":
            detail = names.get(words[1], words[1][:12]) + " " + " ".join(words[2:])[:80]
        print(f"{who:7} {cmd:16} {detail}")
        tally[(who, cmd)] += 1
    print("\nper process and command:")
    for (who, cmd), n in sorted(tally.items()):
        print(f"  {who:7} {cmd:16} {n / args.calls:.1f}")
    print(f"\ncommand: `{command_line()}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
