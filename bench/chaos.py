"""What happens to tool calls when toolexec's own processes die: one table.

Each scenario starts its own Redis (AOF, ``appendfsync always``, like the
compose file), workers and, for the broker scenario, a RabbitMQ node of its
own, puts calls in flight plus a steady trickle of short calls, injects the
fault with SIGKILL (SIGTERM for the rolling restart), and classifies every
call (``rigs.chaos``: ok, typed error, lost, hung). Recovery is the time
from the dependency's return until a call sent after it succeeded.

    python bench/chaos.py                      # every scenario, no soak
    python bench/chaos.py --scenario redis-restart --scenario worker-kill
    python bench/chaos.py --scenario soak --minutes 20

The soak keeps a steady load on two workers, SIGKILLs and restarts the second
one every ``--kill-every`` seconds and restarts Redis once a quarter of the way
in; it reports the slope of the first worker's RSS and of Redis's key count,
per key family (ids and hash tags replaced by ``*``), over the second half of
the run: after the warm-up, where a plateau shows as a slope near zero.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import redis
from _common import BENCH_DIR, command_line, machine_info, markdown_table, progress
from rigs.chaos import (
    Fault,
    Load,
    RabbitServer,
    Rig,
    Tally,
    fail_over,
    kill_worker,
    restart_rabbitmq,
    restart_redis,
    rig,
    rolling_restart,
    run_fault,
    run_write_fault,
    sentinel_rig,
    stop_worker,
    wait_until,
)

HEADERS = [
    "scenario",
    "calls",
    "ok",
    "typed errors",
    "lost",
    "hung",
    "recovery time (s)",
    "command",
]

Scenario = Callable[[Path, argparse.Namespace], Tally]


def _faulted(make: Callable[[Path], AbstractContextManager[Rig]], fault: Fault) -> Scenario:
    def run(root: Path, _: argparse.Namespace) -> Tally:
        with make(root) as built:
            tally = run_fault(built, fault)
            alive = sum(w.process is not None and w.process.poll() is None for w in built.workers)
        return _with_note(tally, f"{alive}/{len(built.workers)} workers alive after")

    return run


def _with_note(tally: Tally, note: str) -> Tally:
    parts = []
    if tally.in_flight_ok is not None:
        ok, count = tally.in_flight_ok
        parts.append(f"in flight ok {ok}/{count}, slowest {tally.slowest_in_flight_s:.1f} s")
    return Tally(**{**tally.__dict__, "notes": "; ".join([*parts, note])})


def _writes(fault: Fault) -> Scenario:
    def run(root: Path, _: argparse.Namespace) -> Tally:
        with _two_workers(root) as built:
            tally = run_write_fault(built, fault)
        return _with_note(tally, f"{tally.ran_twice} effects happened twice")

    return run


def _two_workers(root: Path) -> AbstractContextManager[Rig]:
    return rig(root, BENCH_DIR, workers=2)


def _rabbit(root: Path) -> AbstractContextManager[Rig]:
    return rig(root, BENCH_DIR, workers=2, rabbitmq=True)


def _sentinel(root: Path) -> AbstractContextManager[Rig]:
    return sentinel_rig(root, BENCH_DIR, workers=2)


def _rolling(root: Path, _: argparse.Namespace) -> Tally:
    with _two_workers(root) as built:
        return rolling_restart(built)


def _rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return float("nan")
    xs, ys = zip(*points, strict=True)
    return statistics.linear_regression(xs, ys).slope * 60


#: Tables a scenario adds below the chaos table (the soak's slopes per key family).
EXTRA: list[str] = []


def _soak(root: Path, args: argparse.Namespace) -> Tally:
    """Steady load; worker 2 SIGKILLed and restarted every --kill-every s; Redis restarted once."""
    with _two_workers(root) as built:
        load = Load(built.tool_client, "chaos_sleep", {"seconds": 0.2}, 20.0, threads=4, pause=0.05)
        load.start()
        start = time.monotonic()
        end = start + args.minutes * 60
        rss: list[tuple[float, float]] = []
        keys: list[tuple[float, float]] = []
        families: list[tuple[float, Counter[str]]] = []
        next_kill, redis_at, back_at = start + args.kill_every, start + args.minutes * 15, None
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_kill:
                progress(f"soak: SIGKILL worker 2 at {now - start:.0f} s")
                built.workers[1].kill()
                built.restart_worker(1)
                next_kill += args.kill_every
            if back_at is None and now >= redis_at:
                progress(f"soak: restarting Redis at {now - start:.0f} s")
                back_at = restart_redis(1, 1.0)(built)
            _sample(built, now - start, rss, keys, families)
            time.sleep(5)
        tally = Tally.of(f"soak {args.minutes:g} min", load.stop(), back_at)
    half = args.minutes * 30
    late_rss = [p for p in rss if p[0] >= half]
    late_keys = [p for p in keys if p[0] >= half]
    note = (
        f"second half: worker 1 RSS slope {_slope_per_min(late_rss):+.1f} KB/min "
        f"({late_rss[0][1]:.0f} -> {late_rss[-1][1]:.0f} KB), Redis keys slope "
        f"{_slope_per_min(late_keys):+.2f}/min ({late_keys[0][1]:.0f} -> {late_keys[-1][1]:.0f}); "
        f"whole run: RSS {_slope_per_min(rss):+.1f} KB/min, keys {_slope_per_min(keys):+.2f}/min"
        if late_rss and late_keys
        else "too short to sample"
    )
    EXTRA.append(_family_table(families, half))
    return _with_note(tally, note)


def _family(name: str) -> str:
    """A key's family: hash tags and ids replaced by *, so one row counts one kind of key."""
    name = re.sub(r"\{[^}]*\}", "{*}", name)
    # a consumer's keys (toolexec.transport.orphans) by what they are, not by which process
    name = re.sub(r":consumer:.+?:(alive|held|inboxes|inbox|reaping)\b", r":consumer:*:\1", name)
    return re.sub(r"[0-9a-f]{16,}|[0-9a-f]{8}-[0-9a-f-]{27}|\d+", "*", name)


def _family_table(families: list[tuple[float, Counter[str]]], half: float) -> str:
    """Each key family at the half and at the end, and its slope over the second half."""
    late = [(at, counts) for at, counts in families if at >= half]
    if len(late) < 3:
        return "(soak too short for a slope per key family)"
    names = sorted(set().union(*(counts for _, counts in late)))
    rows = []
    for name in names:
        points = [(at, float(counts.get(name, 0))) for at, counts in late]
        rows.append(
            [f"`{name}`", f"{points[0][1]:.0f}", f"{points[-1][1]:.0f}",
             f"{_slope_per_min(points):+.2f}"]
        )  # fmt: skip
    span = f"{late[0][0]:.0f} s to {late[-1][0]:.0f} s"
    title = f"\n## Soak: Redis keys per family, second half ({span})\n\n"
    headers = ["key family", "keys at the half", "keys at the end", "slope (keys/min)"]
    return title + markdown_table(headers, rows)


def _sample(
    built: Rig,
    at: float,
    rss: list[tuple[float, float]],
    keys: list[tuple[float, float]],
    families: list[tuple[float, Counter[str]]],
) -> None:
    first = built.workers[0].process
    kb = _rss_kb(first.pid) if first is not None else None
    if kb is not None:
        rss.append((at, float(kb)))
    client = redis.Redis(port=built.servers[0].port, socket_timeout=2, decode_responses=True)
    try:
        counts = Counter(_family(name) for name in client.scan_iter(count=1000))
        keys.append((at, float(sum(counts.values()))))
        families.append((at, counts))
    except redis.RedisError:
        pass
    finally:
        client.close()


SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "redis-restart": (
        "Redis SIGKILL + restart 1 s later (AOF), 20 calls of 2 s in flight",
        _faulted(_two_workers, Fault("redis-restart", restart_redis(1, 1.0))),
    ),
    "redis-restart-writes": (
        "Redis SIGKILL + restart 1 s later (AOF), 20 side-effecting calls of 2 s in flight",
        _writes(Fault("redis-restart-writes", restart_redis(1, 1.0))),
    ),
    "redis-flaps": (
        "Redis SIGKILLed and restarted 3 times within ~4 s, 20 calls in flight",
        _faulted(_two_workers, Fault("redis-flaps", restart_redis(3, 0.5))),
    ),
    "worker-kill": (
        "SIGKILL 1 of 2 workers, 20 read-only calls of 2 s in flight (deadline 40 s)",
        _faulted(_two_workers, Fault("worker-kill", kill_worker)),
    ),
    "worker-sigterm": (
        "SIGTERM 1 of 2 workers with 20 calls of 2 s in flight, then start it again",
        _faulted(_two_workers, Fault("worker-sigterm", stop_worker)),
    ),
    "rabbitmq-restart": (
        "RabbitMQ broker SIGKILL + restart, 20 calls in flight",
        _faulted(_rabbit, Fault("rabbitmq-restart", restart_rabbitmq)),
    ),
    "rolling-restart": ("rolling restart of 2 workers (SIGTERM) under steady load", _rolling),
    "sentinel-failover": (
        "Sentinel failover: master SIGKILLed, 20 calls in flight",
        _faulted(_sentinel, Fault("sentinel-failover", fail_over)),
    ),
    "soak": ("soak", _soak),
}

DEFAULT = [name for name in SCENARIOS if name != "soak"]


def _rows(args: argparse.Namespace) -> Iterator[tuple[list[str], str]]:
    for name in args.scenario or DEFAULT:
        label, run = SCENARIOS[name]
        if name == "rabbitmq-restart" and not RabbitServer.available():
            yield [label, "-", "-", "-", "-", "-", "-", "skipped: no rabbitmq-server"], ""
            continue
        progress(f"scenario {name}")
        try:
            with tempfile.TemporaryDirectory(prefix=f"chaos-{name}-") as tmp:
                tally = run(Path(tmp), args)
        except Exception as exc:  # one broken scenario must not hide the others' rows
            yield [label, "-", "-", "-", "-", "-", "-", f"failed: {type(exc).__name__}: {exc}"], ""
            continue
        recovery = "-" if tally.recovery_s is None else f"{tally.recovery_s:.1f}"
        label = f"soak, {args.minutes:g} min" if name == "soak" else label
        command = f"python bench/chaos.py --scenario {name}" + (
            f" --minutes {args.minutes:g}" if name == "soak" else ""
        )
        yield [label, str(tally.calls), str(tally.ok), str(tally.typed), str(tally.lost),
               str(tally.hung), recovery, f"`{command}`"], f"{name}: {tally.notes}"  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--minutes", type=float, default=20.0, help="Length of the soak.")
    parser.add_argument(
        "--kill-every", type=float, default=120.0, help="Soak: seconds between kills."
    )
    args = parser.parse_args()
    if not (args.minutes > 0 and args.kill_every > 0):
        parser.error("--minutes and --kill-every must be positive")
    rows, notes = [], []
    for row, note in _rows(args):
        rows.append(row)
        if note:
            notes.append(note)
    print("\n## Chaos: calls through killed processes\n")
    print(markdown_table(HEADERS, rows))
    print()
    for note in notes:
        print(f"- {note}")
    for table in EXTRA:
        print(table)
    print(f"\ncommand: `{command_line()}`\n")
    probe = tempfile.mkdtemp(prefix="chaos-info-")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in _machine(Path(probe))))
    sys.stdout.flush()


def _machine(root: Path) -> list[tuple[str, str]]:
    from rigs.chaos import RedisServer

    server = RedisServer(root, aof=False)
    server.start()
    try:
        wait_until(server.ping, 5)
        return machine_info(server.url)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
