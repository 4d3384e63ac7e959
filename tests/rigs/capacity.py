"""The capacity model of docs/scaling.md: what a fleet carries, and where it stops first.

A call costs CPU on five parties (the client, the broker, the queue's own
process, the worker, the Redis shards); each party has a number of cores.
:func:`capacities` divides cores by cost per call for each, so the smallest is
the fleet's throughput and its name the first bottleneck; :func:`size_fleet`
turns a target rate into the fewest of each. :func:`simulate` runs the same
figures as a discrete-event simulation (calls queue for cores at every
station), which adds what the division cannot say: latency, and that
queues near a bottleneck grow long before it is reached.

Two kinds of Redis cost differ. Most commands spread over every shard by key
(call ids hash to 16 buckets, results to their own keys); some state is one
slot by design (one circuit breaker, one retry budget) and every call that
uses it runs its script on that slot's one shard, however many shards there
are. ``hot_ms`` is that part, ``hot_share`` the fraction of calls that share
one such slot (1.0: one breaker in front of every call); the other calls' such
state is on other slots, spread like the rest.

Pure functions of their inputs (the simulation takes its random seed): the
bench (bench/capacity_sim.py) measures the inputs and prints the tables.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace

__all__ = [
    "HOT",
    "SHARD",
    "CallCost",
    "Fleet",
    "SimResult",
    "bottleneck",
    "capacities",
    "simulate",
    "size_fleet",
]


@dataclass(frozen=True)
class CallCost:
    """CPU milliseconds one call costs each party (docs/scaling.md, table 1 and 2)."""

    worker_ms: float
    client_ms: float
    broker_ms: float  # per message, on the broker node's cores
    redis_ms: float  # spread over the shards by key
    hot_ms: float = 0.0  # on one slot's shard, for the calls that share it
    messages: float = 1.0  # broker messages a call: 1, +1 a retry, +1 a fallback step

    def total_ms(self) -> float:
        """Every party's CPU for one call (the hot part is CPU wherever it lands)."""
        return (
            self.worker_ms
            + self.client_ms
            + self.broker_ms * self.messages
            + self.redis_ms
            + self.hot_ms
        )

    def spread_ms(self, hot_share: float) -> float:
        """Redis CPU per call that spreads over the shards: the hot part of other slots too."""
        return self.redis_ms + self.hot_ms * (1.0 - hot_share)


@dataclass(frozen=True)
class Fleet:
    """How many cores each party has, and the broker's per-queue ceiling.

    ``shared_cores`` puts every party on one pool of cores (one machine, as in
    the bench here); then only the queues and the hot slot are limits apart.
    ``queue_msgs_s`` is what one queue carries (one Erlang process), None for
    no limit; calls spread evenly over ``queues``.
    """

    worker_cores: float = 1.0
    client_cores: float = 1.0
    redis_shards: int = 1
    broker_nodes: int = 1
    broker_cores: float = 4.0  # per node
    queues: int = 1
    queue_msgs_s: float | None = None
    hot_share: float = 0.0
    shared_cores: float | None = None


def _per_s(cores: float, ms: float) -> float:
    return math.inf if ms <= 0 else 1000.0 * cores / ms


#: The names :func:`capacities` and :func:`simulate` give the parties.
HOT = "Redis: the hot slot's shard"
SHARD = "Redis shard CPU"


def capacities(cost: CallCost, fleet: Fleet) -> dict[str, float]:
    """Calls/s each party allows at 100% of its cores; the smallest is the fleet's.

    The busiest Redis shard is named for the hot slot when that slot's part of
    its load is the larger: then more shards do not help.
    """
    out: dict[str, float] = {}
    if fleet.queue_msgs_s is not None:
        out["broker queues"] = fleet.queues * fleet.queue_msgs_s / cost.messages
    hot = fleet.hot_share * cost.hot_ms
    if fleet.shared_cores is not None:
        out[HOT] = _per_s(1.0, hot)  # Redis runs a shard's commands on one thread
        out["shared cores"] = _per_s(fleet.shared_cores, cost.total_ms())
        return out
    out["worker CPU"] = _per_s(fleet.worker_cores, cost.worker_ms)
    out["client CPU"] = _per_s(fleet.client_cores, cost.client_ms)
    spread = cost.spread_ms(fleet.hot_share) / fleet.redis_shards
    out[HOT if hot > spread else SHARD] = _per_s(1.0, spread + hot)
    broker = cost.broker_ms * cost.messages
    out["broker CPU"] = _per_s(fleet.broker_nodes * fleet.broker_cores, broker)
    return out


def bottleneck(cost: CallCost, fleet: Fleet) -> tuple[str, float]:
    """The first party to run out, and the calls/s it allows."""
    caps = capacities(cost, fleet)
    name = min(caps, key=lambda k: caps[k])
    return name, caps[name]


def size_fleet(
    cost: CallCost, rate: float, *, target: float = 0.7, base: Fleet | None = None
) -> Fleet:
    """The fewest cores, shards, nodes and queues that keep each party at ``target`` of its CPU.

    ``base`` gives what is not sized (cores per broker node, the per-queue
    ceiling, the hot share). A hot slot is not sized away: more shards do not
    split one slot, so a fleet whose hot slot exceeds ``target`` is returned
    as it is and :func:`bottleneck` names it.
    """
    base = base or Fleet()
    need = rate / target
    queues = 1
    if base.queue_msgs_s:
        queues = max(1, math.ceil(need * cost.messages / base.queue_msgs_s))
    broker_cores = need * cost.broker_ms * cost.messages / 1000.0
    return replace(
        base,
        shared_cores=None,
        worker_cores=math.ceil(need * cost.worker_ms / 1000.0),
        client_cores=math.ceil(need * cost.client_ms / 1000.0),
        redis_shards=_shards(cost, need, base.hot_share),
        broker_nodes=max(1, math.ceil(broker_cores / base.broker_cores)),
        queues=queues,
    )


def _shards(cost: CallCost, need: float, hot_share: float) -> int:
    """Shards enough that the hot slot's shard, its share of the rest on top, stays at 1 core.

    When the hot slot alone fills a core no number of shards will do: sized
    for the spread part only, and the hot slot stays the bottleneck.
    """
    room = 1000.0 - need * hot_share * cost.hot_ms
    if room <= 0:
        room = 1000.0
    return max(1, math.ceil(need * cost.spread_ms(hot_share) / room))


# -- the simulation --------------------------------------------------------------------


@dataclass
class _Station:
    """``servers`` cores (or one queue process) serving visits first come, first served."""

    servers: int
    speed: float = 1.0  # cores / servers: 1.6 cores are two servers at 0.8
    busy: int = 0
    waiting: deque[tuple[int, int]] = field(default_factory=deque)
    busy_ms: float = 0.0


@dataclass(frozen=True)
class SimResult:
    """What the simulated fleet did: calls/s, latency percentiles, each station's use."""

    calls: int
    throughput: float
    p50_ms: float
    p99_ms: float
    utilisation: dict[str, float]

    def busiest(self) -> str:
        return max(self.utilisation, key=lambda k: self.utilisation[k])


def _pool(cores: float) -> _Station:
    servers = max(1, math.ceil(cores))
    return _Station(servers, speed=min(1.0, cores / servers))


def _stations(fleet: Fleet) -> dict[str, _Station]:
    """One station per pool of cores; a shared machine is one pool for every party."""
    out = {HOT: _Station(1)}
    if fleet.queue_msgs_s is not None:
        out.update({f"queue {q}": _Station(1) for q in range(fleet.queues)})
    if fleet.shared_cores is not None:
        out["shared cores"] = _pool(fleet.shared_cores)
        return out
    out["client CPU"] = _pool(fleet.client_cores)
    out["broker CPU"] = _pool(fleet.broker_nodes * fleet.broker_cores)
    out["worker CPU"] = _pool(fleet.worker_cores)
    out.update({f"shard {s}": _Station(1) for s in range(fleet.redis_shards)})
    return out


def _route(cost: CallCost, fleet: Fleet, rng: random.Random) -> list[tuple[str, float]]:
    """The stations one call visits in order, with the mean CPU ms it needs at each."""
    pool = "shared cores" if fleet.shared_cores is not None else None
    hops: list[tuple[str, float]] = [(pool or "client CPU", cost.client_ms / 2)]
    hops.append((pool or "broker CPU", cost.broker_ms * cost.messages))
    if fleet.queue_msgs_s is not None:
        queue = f"queue {rng.randrange(fleet.queues)}"
        hops.append((queue, 1000.0 * cost.messages / fleet.queue_msgs_s))
    hops.append((pool or f"shard {rng.randrange(fleet.redis_shards)}", cost.redis_ms / 2))
    hops.append((pool or "worker CPU", cost.worker_ms))
    if cost.hot_ms > 0:  # the shared slot lives on shard 0; other calls' slots anywhere
        hot = rng.random() < fleet.hot_share
        shard = "shard 0" if hot else f"shard {rng.randrange(fleet.redis_shards)}"
        hops.append((HOT if pool and hot else pool or shard, cost.hot_ms))
    hops.append((pool or f"shard {rng.randrange(fleet.redis_shards)}", cost.redis_ms / 2))
    hops.append((pool or "client CPU", cost.client_ms / 2))
    return hops


@dataclass
class _Run:
    """The simulation's state: an event heap of (time ms, seq, call, hop)."""

    cost: CallCost
    fleet: Fleet
    rng: random.Random
    stations: dict[str, _Station]
    events: list[tuple[float, int, int, int]] = field(default_factory=list)
    routes: dict[int, list[tuple[str, float]]] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    seq: int = 0

    def push(self, at: float, call: int, hop: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, call, hop))

    def start(self, at: float, call: int) -> None:
        self.routes[call] = _route(self.cost, self.fleet, self.rng)
        self.started[call] = at
        self.arrive(at, call, 0)

    def arrive(self, now: float, call: int, hop: int) -> None:
        """``call`` reaches its ``hop``: served at once if a server is free, else queued."""
        if hop == len(self.routes[call]):
            self.latencies.append(now - self.started.pop(call))
            del self.routes[call]
            return
        station = self.stations[self.routes[call][hop][0]]
        if station.busy < station.servers:
            self.serve(now, station, call, hop)
        else:
            station.waiting.append((call, hop))

    def serve(self, now: float, station: _Station, call: int, hop: int) -> None:
        mean = self.routes[call][hop][1]
        took = self.rng.expovariate(1.0 / mean) / station.speed if mean > 0 else 0.0
        station.busy += 1
        station.busy_ms += took * station.speed
        self.push(now + took, call, -(hop + 1))  # a negative hop: leaving it

    def leave(self, now: float, call: int, hop: int) -> None:
        station = self.stations[self.routes[call][hop][0]]
        station.busy -= 1
        if station.waiting:
            self.serve(now, station, *station.waiting.popleft())
        self.arrive(now, call, hop + 1)


def simulate(
    cost: CallCost,
    fleet: Fleet,
    *,
    rate: float | None = None,
    population: int | None = None,
    calls: int = 20_000,
    seed: int = 1,
) -> SimResult:
    """Run ``calls`` calls through the fleet and measure what came out.

    Open (``rate`` calls/s arrive at random, Poisson) for a fleet facing its
    traffic; closed (``population`` callers, each starting its next call when
    the last answers) for the bench's clients, which wait for each reply.
    Service times are exponential around the means; the first and last tenth
    of the calls are left out of the figures (warm-up and drain).
    """
    if (rate is None) == (population is None):
        raise ValueError("simulate takes a rate (open) or a population (closed), not both")
    run = _Run(cost, fleet, random.Random(seed), _stations(fleet))
    first = min(calls, population) if population else 1
    for call in range(first):
        run.start(0.0, call)
    if rate is not None:
        run.push(run.rng.expovariate(rate / 1000.0), first, 0)  # hop 0 unstarted: an arrival
    next_call, done_at = first, []
    while run.events:
        now, _, call, hop = heapq.heappop(run.events)
        if hop < 0:
            before = len(run.latencies)
            run.leave(now, call, -hop - 1)
            if len(run.latencies) > before:
                done_at.append(now)
                if population and next_call < calls:
                    run.start(now, next_call)
                    next_call += 1
        elif next_call < calls:  # an open arrival
            run.start(now, call)
            next_call += 1
            if next_call < calls and rate is not None:
                run.push(now + run.rng.expovariate(rate / 1000.0), next_call, 0)
    return _result(run, done_at)


def _result(run: _Run, done_at: list[float]) -> SimResult:
    n = len(done_at)
    lo, hi = n // 10, n - n // 10
    window = max(1e-9, done_at[hi - 1] - done_at[lo]) if hi - 1 > lo else 1e-9
    steady = sorted(run.latencies[lo:hi]) or [0.0]
    end = max(done_at, default=1e-9)
    use = {
        name: s.busy_ms / (s.servers * s.speed * end)
        for name, s in run.stations.items()
        if s.busy_ms > 0 or name != HOT
    }
    return SimResult(
        calls=n,
        throughput=1000.0 * (hi - 1 - lo) / window,
        p50_ms=steady[len(steady) // 2],
        p99_ms=steady[min(len(steady) - 1, int(len(steady) * 0.99))],
        utilisation=use,
    )
