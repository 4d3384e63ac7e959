"""Idempotent side-effecting tools, coalesced reads and takeover of crashed calls.

Celery with a Redis broker delivers at least once (docs/background.md, Celery): a killed
worker, a lost connection or a long countdown runs a task again. For a tool
that writes, that is a second charge or a second e-mail. celery-once and
celery-singleton answer with a lock: duplicates are dropped (the caller of the
duplicate gets nothing), and the lock outlives a crashed worker for its whole
TTL (celery-once #147, celery-singleton #40), or expires under a live one and
lets a duplicate in (#38). Stripe stores the outcome once execution starts and
replays it. toolexec does what Stripe does, and adds what a fleet of workers
needs (docs/background.md, Resilience systems):

* **One record per key**, a Redis hash changed only by Lua scripts
  (``executor/lua/idempotency_*.lua``, run by :mod:`.store`).
  The key is a hash of the run id, the tool and the normalised arguments
  (:func:`~toolexec.normalize.arguments_hash`), or of a key the caller gave.
  States: ``in_progress`` (a lease: owner, fencing token, lease end),
  ``succeeded`` and ``failed`` (the stored :class:`ToolResult`), ``unknown``
  (the write may have happened: a timeout or a lost connection during it).
  A transient failure that is certain to have done nothing (503s until the
  attempts ran out) *releases* the key instead of storing it, so that the
  agent can simply try again later.
* **A duplicate joins** the call in flight without holding a worker slot: its
  context goes into the record's waiters (a sorted set, scored by deadline) in
  the same script that sees the lease, its task ends at once, and whoever
  finishes the call hands the waiters to its verdict, and the worker's one
  delivery answers them, after the fallback decision, as it answers the call. A
  worker that polled the record would sit on a slot for the whole call; a
  joiner here costs one script call. A duplicate after completion gets the
  stored result at once, with ``replayed: true``; the same key with other
  arguments is ``idempotency_mismatch``.
* **Leases of seconds, renewed while the body runs** (one keeper thread per
  process renews all its calls' leases in one round trip). A worker that
  dies stops renewing; every worker runs a sweeper that finds expired leases
  (an index sorted by lease end) and publishes the call's message again, so
  another worker takes it over within ``lease_s`` plus one sweep, instead of
  after the broker's visibility timeout (``max_timeout`` + 60 s; lowering
  that would redeliver every long call and every countdown,
  docs/background.md, Celery). Each new holder gets a **fencing token** from
  a counter that only grows; storing an outcome requires the holder's owner
  id and token, so a worker that wakes up after a takeover (a GC pause,
  SIGSTOP, a partition) cannot overwrite the outcome of the one that took
  over.
* **Uncertain writes are checked, never blindly repeated.** A taken-over call
  and the retry of an attempt that timed out first run the tool's ``check``
  (same signature, returns whether the effect is there); the write runs again
  only if it is not. Without a ``check`` the call ends ``status: unknown``
  with a suggestion, and the record keeps saying so.
* **Coalescing** (``@tool(coalesce=True)``, read-only tools): identical calls
  in flight share one execution through the same record and waiters; the
  record is deleted when the call ends, so nothing is cached.

All keys share the ``{idem}`` hash tag so that each script's keys sit in one
Redis Cluster slot; the price is that idempotency records live on one shard.
"""

from toolexec.idempotency.layer import IdempotencyLayer, as_unknown
from toolexec.idempotency.records import (
    Claim,
    Finished,
    Lease,
    Message,
    Mode,
    call_mode,
    record_id,
)
from toolexec.idempotency.renewer import LeaseKeeper
from toolexec.idempotency.store import IdempotencyStore
from toolexec.idempotency.sweeper import LeaseSweeper

__all__ = [
    "Claim",
    "Finished",
    "IdempotencyLayer",
    "IdempotencyStore",
    "Lease",
    "LeaseKeeper",
    "LeaseSweeper",
    "Message",
    "Mode",
    "as_unknown",
    "call_mode",
    "record_id",
]
