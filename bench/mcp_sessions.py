"""What an MCP session costs the front, and that TOOLEXEC_MCP_MAX_SESSIONS bounds it.

A real ``toolexec mcp --http`` process on loopback; sessions are opened with
plain ``initialize`` POSTs and left open (no GET stream, no DELETE), as a client
that never closes them would. The front's resident memory (``VmRSS``) is read
before (the baseline, after a warm-up of the same requests) and after; the
per-session cost is the difference over the sessions opened. A second front
with a limit below the number of attempts shows the memory stopping at the
limit while the rest are refused with 503 ``too_many_sessions``.

Usage: ``python bench/mcp_sessions.py [--sessions N] [--limit L] [--redis-url URL]``.
It exits 0 whatever the figures, and non-zero when the front fails.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import httpx
from _common import Row, machine_info, print_report, progress, redis_server, require, run_settings
from mcp_front import front_process

from toolexec.settings import Settings

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}
WARM_UP = 50


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _open(http: httpx.Client, url: str, count: int) -> Counter[int]:
    """``count`` sessions opened and left open; the statuses seen."""
    return Counter(
        http.post(url, json=INITIALIZE, headers=HEADERS).status_code for _ in range(count)
    )


def _measure(
    settings: Settings, log: Path, sessions: int, limit: int
) -> tuple[int, int, Counter[int]]:
    """RSS before and after ``sessions`` attempts on a front limited to ``limit``."""
    extra = {"TOOLEXEC_MCP_MAX_SESSIONS": str(limit + WARM_UP)}
    with front_process(settings, log, 60, **extra) as (url, proc), httpx.Client(timeout=30) as http:
        _open(http, url, WARM_UP)  # imports, caches and the first allocations
        before = _rss_kb(proc.pid)
        seen = _open(http, url, sessions)
        after = _rss_kb(proc.pid)
    return before, after, seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--limit", type=int, default=200, help="the capped front's limit")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    with redis_server(args.redis_url) as server, tempfile.TemporaryDirectory() as tmp:
        settings = run_settings(server.url, Path(tmp))
        progress(f"opening {args.sessions} sessions on a front that takes them all")
        free = _measure(settings, Path(tmp) / "free.log", args.sessions, args.sessions)
        progress(f"opening {args.sessions} sessions on a front limited to {args.limit}")
        capped = _measure(settings, Path(tmp) / "capped.log", args.sessions, args.limit)
        info = machine_info(server.url)
    require(free[2][200] == args.sessions, f"the unlimited front refused some: {free[2]}")
    require(capped[2][200] == args.limit, f"the capped front let in {capped[2]}")
    per_session = (free[1] - free[0]) / args.sessions
    capped_growth = capped[1] - capped[0]
    rows = [
        Row(
            f"{args.sessions} sessions, limit {args.sessions}",
            "front RSS (KB)",
            f"{free[0]:,}",
            f"{free[1]:,}",
            free[1] / free[0],
            f"{per_session:.1f} KB per session",
            None,
        ),
        Row(
            f"{args.sessions} attempts, limit {args.limit}",
            "front RSS (KB)",
            f"{capped[0]:,}",
            f"{capped[1]:,}",
            capped[1] / capped[0],
            f"{dict(capped[2])} by status",
            capped_growth <= per_session * args.limit * 1.5 + 2048,
        ),
    ]
    notes = [
        "baseline: the front's RSS after a warm-up of "
        f"{WARM_UP} sessions; toolexec: after the attempts (sessions left open, none idle yet)",
        f"the capped front grew {capped_growth:,} KB: the target is at most 1.5x the "
        f"per-session cost times the limit, plus 2 MB",
    ]
    print_report("MCP session table", rows, info, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
