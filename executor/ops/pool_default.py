"""Which pool and how many slots ``toolexec worker`` runs when nobody said.

A tool call mostly waits on a service (HTTP, a database, a model), so slots
that wait side by side matter more than cores: the threads pool overlaps the
waits in one process, where prefork would need a process (tens of MB) per
slot. What threads cannot spread over cores is Celery's and toolexec's own
work per call, about 2.8 ms of CPU (docs/performance.md): one process tops out
at a few hundred calls a second whatever the machine, so on a machine with
more cores the way to use them is one worker process per core, each with its
own threads, which ``toolexec worker`` does by default
(``toolexec.ops.processes``) and the message says. An explicit ``--pool`` /
``--concurrency`` or ``TOOLEXEC_WORKER_POOL`` / ``TOOLEXEC_WORKER_CONCURRENCY``
is always taken as given.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PoolChoice", "choose_pool"]

#: Per-call CPU of one threads worker process, measured by bench/overhead.py (no-op,
#: every default layer on, task events on, docs/performance.md), for the message's estimate.
WORKER_CPU_PER_CALL_S = 0.0028


@dataclass(frozen=True)
class PoolChoice:
    pool: str
    concurrency: int
    reason: str


def choose_pool(
    cores: int,
    pool: str | None,
    concurrency: int | None,
    default_concurrency: int,
) -> PoolChoice:
    """The pool and slots to run, and the sentence that says why (pure)."""
    if pool is not None:
        slots = concurrency or default_concurrency
        return PoolChoice(pool, slots, f"{pool} pool, {slots} slots, as configured")
    slots = concurrency or default_concurrency
    ceiling = int(1 / WORKER_CPU_PER_CALL_S)
    advice = (
        f"; this machine has {cores} cores: `toolexec worker` runs a process per core "
        "unless a pool or slots are given (--processes N)"
        if cores > 1
        else ""
    )
    return PoolChoice(
        "threads",
        slots,
        f"threads pool, {slots} slots (the default: tool calls wait on I/O, which threads "
        f"overlap; one process does at most about {ceiling} calls/s on one core{advice}; "
        "--pool prefork for CPU-bound tools)",
    )
