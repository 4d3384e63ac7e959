"""What each protection costs per call: CPU microseconds and Redis round trips.

Every row runs one layer's own code path (the very objects a worker or client
builds) in this process against a fresh Valkey of its own, around a body that
returns at once, so the figure is the layer and nothing else. Round trips are
counted on the connection (one per request sent: a pipeline or a script is
one), commands from the server's ``INFO commandstats``, and the server's CPU
from ``/proc``. The rows are measured in interleaved rounds and the median
round is reported, since the machine may be shared.

Usage: ``python bench/layers.py [--calls N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from _common import command_line, cpu_seconds, interleave, machine_info, markdown_table, median
from overhead import command_counts, load_average, own_server

from toolexec.breaker import BreakerGate, CircuitBreaker, refusal_for
from toolexec.breaker.layer import BreakerLayer
from toolexec.clock import SystemClock
from toolexec.context import CallContext
from toolexec.guard import RunGuard
from toolexec.idempotency import IdempotencyLayer, IdempotencyStore
from toolexec.keys import Keys
from toolexec.layers import Attempt, Final, Layer, Outcome
from toolexec.layers.batch import Batch
from toolexec.layers.ratelimit import RateLimiter, RateLimitLayer
from toolexec.layers.retry_budget import RetryBudget, RetryBudgetLayer
from toolexec.ops.metrics import Metrics
from toolexec.payloads import Offloader, open_store
from toolexec.payloads.offload import PayloadLayer
from toolexec.pipeline.observe import CallObservers
from toolexec.policies import RateLimitPolicy
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.stats import CallStats
from toolexec.stores.tally import Tally
from toolexec.validation import validate_against_schema

TOOLS = Registry()


@tool(registry=TOOLS)
def lookup(city: str, days: int = 1) -> dict[str, Any]:
    """A read-only tool with every default: breaker and retry budget on."""
    return {"city": city}


@tool(registry=TOOLS, rate_limit=RateLimitPolicy(rate=1e9, burst=1000))
def limited(city: str, days: int = 1) -> dict[str, Any]:
    """The same under a fleet-wide rate limit that never defers."""
    return {"city": city}


@tool(registry=TOOLS, side_effects=True)
def write(city: str, days: int = 1) -> dict[str, Any]:
    """A side-effecting tool: one idempotency record per call."""
    return {"city": city}


ARGUMENTS = {"city": "Paris", "days": 3}


class CountingConnection(redis.Connection):
    """Counts requests sent: a command, a pipeline or a script is one round trip."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


def spec(name: str) -> ToolSpec:
    found = TOOLS.get(name)
    assert found is not None
    return found


def context(name: str, **extra: Any) -> CallContext:
    now = time.time()
    call_id = uuid.uuid4().hex
    return CallContext(call_id, name, now + 60, now, call_id, **extra)


def attempt(name: str, **extra: Any) -> Attempt:
    return Attempt(spec(name), context(name, **extra), 1, dict(ARGUMENTS), 60.0)


def _done(_: Attempt) -> Outcome:
    return Outcome(data={"city": "Paris"}, duration_s=0.001)


def through(layer: Layer, name: str, **extra: Any) -> Callable[[], None]:
    """One attempt through every hook of ``layer`` around a body that returns at once.

    ``admit`` and ``record`` queue their commands on a batch each, as in a worker,
    where all layers share those two round trips; here the layer has them to
    itself, so each row counts the round trips the layer would cost alone. A
    read-only call's lease, handed back on the verdict, is released in the
    settlement batch, as the worker's delivery does.
    """

    def run() -> None:
        current = attempt(name, **extra)
        admission = Batch()
        layer.admit(current, admission)
        if len(admission):
            admission.execute()
        outcome = layer.around(current, lambda: _done(current))
        result = ToolResult(
            status="ok", tool=name, call_id=current.ctx.call_id, data=outcome.data, attempts=1
        )
        verdict = layer.settle(current, outcome, Final(result))
        settlement = Batch()
        layer.record(current, outcome, verdict, settlement)
        release = getattr(verdict, "release", None)
        if release is not None and isinstance(layer, IdempotencyLayer):
            layer.store.release(release, settlement)
        if len(settlement):
            settlement.execute()

    return run


#: The fast path's rows flush their tally once per this many calls: one worker process
#: at about 400 calls/s flushes every 0.25 s (toolexec.stores.tally.FLUSH_S).
CALLS_PER_FLUSH = 100


def flushed(op: Callable[[], None], tally: Tally) -> Callable[[], None]:
    """``op``, with the tally's flush (its round trip and scripts) shared by its calls."""
    done = [0]

    def run() -> None:
        op()
        done[0] += 1
        if done[0] % CALLS_PER_FLUSH == 0:
            tally.flush()

    return run


def bare() -> None:
    """What every row includes besides its layer: building the attempt, calling the body."""
    current = attempt("lookup")
    _done(current)


@dataclass(frozen=True)
class Case:
    layer: str
    where: str
    op: Callable[[], None]
    note: str = ""
    subtract_bare: bool = True


def cases(client: redis.Redis, settings: Settings, keys: Keys, url: str) -> list[Case]:
    clock = SystemClock()
    breakers = CircuitBreaker(client, keys)
    gate = BreakerGate(url, breakers, keys)
    store = IdempotencyStore(client, keys, lease_s=10.0, retention_s=600.0)
    observers = CallObservers(CallStats(client, keys), [Metrics()])
    metrics_only = CallObservers(None, [Metrics()])
    tallies = [Tally(client) for _ in range(3)]
    fast_observers = CallObservers(CallStats(client, keys, tally=tallies[2]), [Metrics()])
    fast_breaker = BreakerLayer(breakers, gate=gate, tally=tallies[0])
    fast_budget = RetryBudgetLayer(RetryBudget(client, keys), tally=tallies[1])
    per_flush = f"per call, a flush per {CALLS_PER_FLUSH} calls"
    payloads = PayloadLayer(
        Offloader(open_store(settings, settings.redis_url or "", clock), clock), settings
    )
    look = spec("lookup")
    schema = look.json_schema()
    result = ToolResult(status="ok", tool="lookup", call_id="c", data=None, attempts=1)

    def observe(obs: CallObservers) -> Callable[[], None]:
        def run() -> None:
            ctx = context("lookup")
            obs.started(look, ctx, 1)
            obs.finished(ctx, 1, result)

        return run

    def guard_round() -> None:
        guard = RunGuard(uuid.uuid4().hex, redis=client, keys=keys)
        plan = guard.begin_round([("lookup", ARGUMENTS)], alternatives=["lookup"])
        guard.end_round(plan, [result])

    return [
        Case(
            "validation, client (JSON Schema)",
            "client",
            lambda: validate_against_schema(ARGUMENTS, schema) and None,
            subtract_bare=False,
        ),
        Case(
            "validation, worker (pydantic)",
            "worker",
            lambda: look.arguments.model_validate(ARGUMENTS) and None,
            subtract_bare=False,
        ),
        Case(
            "breaker check, client (gate copy, closed)",
            "client",
            lambda: gate.refusal("lookup", look.policy.breaker, None, ARGUMENTS) and None,
            subtract_bare=False,
        ),
        Case(
            "breaker check, client (script, as before)",
            "client",
            lambda: refusal_for(breakers, "lookup", look.policy.breaker, None, ARGUMENTS) and None,
            subtract_bare=False,
        ),
        Case("breaker permit + record", "worker", through(BreakerLayer(breakers), "lookup")),
        Case(
            "breaker, fast path (gate copy + tally)",
            "worker",
            flushed(through(fast_breaker, "lookup"), tallies[0]),
            per_flush,
        ),
        Case(
            "retry budget record",
            "worker",
            through(RetryBudgetLayer(RetryBudget(client, keys)), "lookup"),
        ),
        Case(
            "retry budget record, fast path (tally)",
            "worker",
            flushed(through(fast_budget, "lookup"), tallies[1]),
            per_flush,
        ),
        Case(
            "rate limit (when the tool has one)",
            "worker",
            through(RateLimitLayer(RateLimiter(client, keys)), "limited"),
        ),
        Case(
            "idempotency (side effects / key)",
            "worker",
            through(IdempotencyLayer(store, default_queue="tools"), "write"),
        ),
        Case(
            "idempotency: the in-flight lease (read-only tool)",
            "worker",
            through(IdempotencyLayer(store, default_queue="tools"), "lookup"),
        ),
        Case(
            "idempotency, read-only, fast path (no lease: the orphan watch)",
            "worker",
            through(IdempotencyLayer(store, default_queue="tools", lease_reads=False), "lookup"),
        ),
        Case("payload check (small result)", "worker", through(payloads, "lookup")),
        Case("stats + in-flight lease (Redis)", "worker", observe(observers), subtract_bare=False),
        Case(
            "stats + running set, fast path (tally)",
            "worker",
            flushed(observe(fast_observers), tallies[2]),
            per_flush,
            subtract_bare=False,
        ),
        Case(
            "metrics (Prometheus, in process)", "worker", observe(metrics_only), subtract_bare=False
        ),
        Case(
            "run guard, one round of 1 call",
            "client",
            guard_round,
            "per round",
            subtract_bare=False,
        ),
    ]


@dataclass
class Sample:
    cpu_us: float
    server_us: float
    round_trips: float
    commands: float


def measure(op: Callable[[], None], calls: int, server: redis.Redis, server_pid: int) -> Sample:
    for _ in range(min(50, calls)):
        op()
    sent, cmds = CountingConnection.sent, command_counts(server)
    srv, cpu = cpu_seconds(server_pid) or 0.0, time.process_time()
    for _ in range(calls):
        op()
    cpu = time.process_time() - cpu
    srv = (cpu_seconds(server_pid) or 0.0) - srv
    after = command_counts(server)
    commands = sum(after.values()) - sum(cmds.values()) - 1  # the INFO itself
    return Sample(
        1e6 * cpu / calls,
        1e6 * srv / calls,
        (CountingConnection.sent - sent) / calls,
        commands / calls,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per row per round (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, rows interleaved (3)")
    args = parser.parse_args(argv)
    loads = [load_average()]
    with own_server() as server, tempfile.TemporaryDirectory() as tmp:
        settings = Settings(redis_url=server.url, data_dir=Path(tmp), key_prefix="layers")
        client = counting_client(server.url)
        info_client = redis.Redis.from_url(server.url)
        all_cases = cases(client, settings, Keys("layers"), server.url)
        contenders = {c.layer: _bind(c.op, args.calls, info_client, server.pid) for c in all_cases}
        contenders["(attempt + body alone)"] = _bind(bare, args.calls, info_client, server.pid)
        runs = interleave(args.rounds, contenders)
        loads.append(load_average())
        base = median([s.cpu_us for s in runs["(attempt + body alone)"]])
        rows = []
        for c in all_cases:
            samples = runs[c.layer]
            cpu = median([s.cpu_us for s in samples]) - (base if c.subtract_bare else 0.0)
            rows.append(
                [
                    c.layer,
                    c.where,
                    f"{cpu:.0f}",
                    f"{median([s.server_us for s in samples]):.0f}",
                    f"{median([s.round_trips for s in samples]):.2f}",
                    f"{median([s.commands for s in samples]):.2f}",
                    c.note or "per call",
                ]
            )
        info = machine_info(server.url)
        client.close()
        info_client.close()
    headers = ["layer", "where", "CPU µs", "Redis CPU µs", "round trips", "commands", "unit"]
    print("\n## Cost per layer\n")
    print(markdown_table(headers, rows))
    print(
        f"\n- {args.rounds} round(s) of {args.calls} calls per row, rows interleaved; medians; "
        f"CPU µs is this process's (the layer's Python and redis-py), the attempt's own "
        f"construction ({base:.0f} µs) subtracted for layers"
    )
    print(
        "- load average (1 min): "
        + ", ".join(f"{x:.2f}" for x in loads)
        + f" on {os.cpu_count()} core(s), shared: figures are noisy"
    )
    print(f"\ncommand: `{command_line()}`\n")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info))
    return 0


def _bind(
    op: Callable[[], None], calls: int, server: redis.Redis, pid: int
) -> Callable[[], Sample]:
    return lambda: measure(op, calls, server, pid)


if __name__ == "__main__":
    sys.exit(main())
