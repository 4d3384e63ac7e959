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

* **One record per key**, a Redis hash changed only by the Lua scripts below.
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
  finishes the call delivers the outcome to every waiter's reply list. A
  worker that polled the record would sit on a slot for the whole call; a
  joiner here costs one script call. A duplicate after completion gets the
  stored result at once, with ``replayed: true``; the same key with other
  arguments is ``idempotency_mismatch``.
* **Leases of seconds, renewed while the body runs** (one renewer thread per
  call). A worker that dies stops renewing; every worker runs a sweeper that
  finds expired leases (an index sorted by lease end) and publishes the call's
  message again, so another worker takes it over within ``lease_s`` plus one
  sweep, instead of after the broker's visibility timeout (``max_timeout`` +
  60 s; lowering that would redeliver every long call and every countdown,
  docs/background.md, Celery). Each new holder gets a **fencing token** from a counter that
  only grows; storing an outcome requires the holder's owner id and token, so
  a worker that wakes up after a takeover (a GC pause, SIGSTOP, a partition)
  cannot overwrite the outcome of the one that took over.
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

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, Protocol

import redis
import redis.exceptions
from pydantic_core import to_jsonable_python
from redis.commands.core import Script

from toolexec.classify import classify_exception
from toolexec.clock import Clock, SystemClock
from toolexec.context import CallContext
from toolexec.errors import (
    ErrorType,
    IdempotencyMismatchError,
    ToolException,
    UnavailableError,
    WorkerLostError,
)
from toolexec.execution import (
    Final,
    NoReply,
    Retry,
    Verdict,
    error_info,
    error_result,
    restamped,
)
from toolexec.keys import Keys
from toolexec.layers import Attempt, Outcome, Proceed
from toolexec.normalize import arguments_hash
from toolexec.registry import ToolSpec
from toolexec.replies import deliver
from toolexec.results import ToolResult
from toolexec.runner import Runner

__all__ = [
    "REQUEUE_LEASES",
    "UNCERTAIN_TYPES",
    "Claim",
    "IdempotencyLayer",
    "IdempotencyStore",
    "Lease",
    "LeaseRenewer",
    "LeaseSweeper",
    "Message",
    "Mode",
    "call_mode",
    "record_id",
]

log = logging.getLogger(__name__)

Mode = Literal["idempotent", "coalesce"]
ClaimKind = Literal["acquired", "joined", "duplicate", "replay", "mismatch"]
FinalState = Literal["succeeded", "failed", "unknown", "released"]

#: Failures after which a write may or may not have happened: the request may
#: have reached the service before the time ran out or the connection broke.
UNCERTAIN_TYPES = frozenset({ErrorType.TIMEOUT, ErrorType.CONNECTION_ERROR})

#: How many leases a call handed to another worker may wait in the queue before
#: a sweeper hands it over again.
REQUEUE_LEASES = 3

#: What Redis being away looks like; a script error is a bug and raises.
_UNREACHABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
)

_UNKNOWN_SUGGESTION = (
    "The action may or may not have taken effect and this tool cannot check which. "
    "Verify the target state before doing it again; repeating the call with the same "
    "idempotency key returns this same answer."
)


def call_mode(spec: ToolSpec, ctx: CallContext) -> Mode | None:
    """How a call is deduplicated: a caller's key or side effects make it idempotent."""
    if ctx.idempotency_key or spec.policy.side_effects:
        return "idempotent"
    return "coalesce" if spec.policy.coalesce else None


def record_id(mode: Mode, args_hash: str, ctx: CallContext) -> str:
    """The record a call belongs to; ``args_hash`` is :func:`arguments_hash` of the call.

    A caller's key names it alone (as at Stripe: the same key with another tool
    or other arguments is a mismatch). Otherwise the run id, the tool and the
    normalised arguments; a call without a run id is scoped to its own call id,
    which still protects it against redelivery and retries. Coalesced reads are
    shared by everyone: tool and arguments only.
    """
    if ctx.idempotency_key:
        basis = f"key\0{ctx.idempotency_key}"
    elif mode == "coalesce":
        basis = f"coalesce\0{args_hash}"
    else:
        scope = f"run\0{ctx.run_id}" if ctx.run_id else f"call\0{ctx.call_id}"
        basis = f"{scope}\0{args_hash}"
    return hashlib.sha256(basis.encode()).hexdigest()[:40]


# --- Lua --------------------------------------------------------------------
# KEYS = {record hash, waiters zset, lease index zset, token counter}; ARGV[1] =
# now ('' = Redis TIME), ARGV[2] = the record id (its member in the index).
# Numbers go back as '%.17g' strings; Lua's tostring would lose precision.

_PRELUDE = r"""
local REC, WAIT, LEASES, TOKENS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[2]

local function fmt(x) return string.format('%.17g', x) end
local function get(f) return redis.call('HGET', REC, f) end

local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local now = clock(ARGV[1])

local function keep(ttl_s)
  local ms = math.ceil(tonumber(ttl_s) * 1000)
  redis.call('PEXPIRE', REC, ms)
  if redis.call('EXISTS', WAIT) == 1 then redis.call('PEXPIRE', WAIT, ms) end
end

local function hold(until_)
  redis.call('HSET', REC, 'lease_until', fmt(until_), 'updated_at', fmt(now))
  redis.call('ZADD', LEASES, fmt(until_), id)
end

-- whether (owner, token) still holds the call: the fencing check
local function holds(owner, token)
  return get('state') == 'in_progress' and owner ~= '' and get('owner') == owner
    and get('token') == token
end

local function fenced()
  if redis.call('EXISTS', REC) == 1 then redis.call('HINCRBY', REC, 'fenced', 1) end
  return {'fenced', {}}
end
"""

# ARGV: now, id, args hash, call id, ctx json, owner, lease_s, deadline, has_check,
#       mode, task, queue, arguments json, attempt, retention_s
_BEGIN = r"""
local args, call, ctx, owner = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local lease_s, deadline, has_check, mode = tonumber(ARGV[7]), ARGV[8], ARGV[9] == '1', ARGV[10]

local function take(prior)
  local token = redis.call('INCR', TOKENS)
  redis.call('HSET', REC, 'state', 'in_progress', 'phase', 'running', 'owner', owner,
    'token', token, 'call', call, 'ctx', ctx, 'deadline', deadline, 'task', ARGV[11],
    'queue', ARGV[12], 'arguments', ARGV[13], 'attempt', ARGV[14])
  if mode == 'idempotent' then redis.call('HSET', REC, 'uncertain', '1') end
  redis.call('HINCRBY', REC, 'runs', 1)
  hold(now + lease_s)
  keep(ARGV[15])
  return {'acquired', tostring(token), prior, ''}
end

local state = get('state')
if not state then
  redis.call('HSET', REC, 'mode', mode, 'args', args, 'created_at', fmt(now),
    'takeovers', 0, 'fenced', 0, 'runs', 0, 'uncertain', '0')
  return take('0')
end
if get('args') ~= args then return {'mismatch', '', '', ''} end
if state ~= 'in_progress' then
  if state == 'unknown' and has_check then return take('1') end
  return {'replay', '', state, get('result')}
end
local prior = get('uncertain') or '0'
local same = get('call') == call
if now < tonumber(get('lease_until')) then
  if same and get('phase') ~= 'running' then return take(prior) end
  if same then return {'duplicate', '', '', ''} end
  redis.call('ZADD', WAIT, deadline, ctx)
  keep(ARGV[15])
  return {'joined', '', '', get('lease_until')}
end
-- the lease ran out: whoever held it is gone or stopped; this run takes over
if not same then redis.call('ZADD', WAIT, get('deadline'), get('ctx')) end
redis.call('HINCRBY', REC, 'takeovers', 1)
return take(prior)
"""

# ARGV: now, id, owner, token, lease_s
_RENEW = r"""
if not holds(ARGV[3], ARGV[4]) then return {'lost', ''} end
hold(now + tonumber(ARGV[5]))
return {'ok', get('lease_until')}
"""

# ARGV: now, id, owner, token, hold_s, uncertain, ctx json, next attempt, retention_s
# Between attempts: nobody runs the call, the retry message will take it up.
_PARK = r"""
if not holds(ARGV[3], ARGV[4]) then return fenced() end
redis.call('HSET', REC, 'phase', 'retry_wait', 'owner', '', 'uncertain', ARGV[6],
  'ctx', ARGV[7], 'attempt', ARGV[8])
hold(now + tonumber(ARGV[5]))
keep(ARGV[9])
return {'ok', {}}
"""

# ARGV: now, id, owner, token, state, result json, retention_s
_FINISH = r"""
if not holds(ARGV[3], ARGV[4]) then return fenced() end
local waiters = redis.call('ZRANGE', WAIT, 0, -1)
redis.call('DEL', WAIT)
redis.call('ZREM', LEASES, id)
if ARGV[5] == 'released' then
  redis.call('DEL', REC)
else
  local uncertain = '0'
  if ARGV[5] == 'unknown' then uncertain = '1' end
  redis.call('HSET', REC, 'state', ARGV[5], 'result', ARGV[6], 'owner', '',
    'finished_at', fmt(now), 'updated_at', fmt(now), 'uncertain', uncertain)
  redis.call('HDEL', REC, 'arguments', 'phase', 'lease_until')
  keep(ARGV[7])
end
return {'ok', waiters}
"""

# ARGV: now, id, hold_s, retention_s
# An expired lease found by a sweeper: hand the call's message back to be published.
_CLAIM = r"""
if get('state') ~= 'in_progress' then
  redis.call('ZREM', LEASES, id)
  return {'done'}
end
local lease_until = tonumber(get('lease_until'))
if now < lease_until then
  redis.call('ZADD', LEASES, fmt(lease_until), id)
  return {'live'}
end
if tonumber(get('deadline')) <= now then
  -- its caller gave up; the waiter with the most time left inherits the call
  redis.call('ZREMRANGEBYSCORE', WAIT, '-inf', fmt(now))
  local heir = redis.call('ZRANGE', WAIT, -1, -1, 'WITHSCORES')
  if #heir == 0 then
    redis.call('ZREM', LEASES, id)
    return {'expired'}
  end
  redis.call('ZREM', WAIT, heir[1])
  redis.call('HSET', REC, 'ctx', heir[1], 'deadline', heir[2],
    'call', cjson.decode(heir[1])['call_id'])
end
redis.call('HSET', REC, 'phase', 'requeued', 'owner', '')
redis.call('HINCRBY', REC, 'takeovers', 1)
hold(now + tonumber(ARGV[3]))
keep(ARGV[4])
return {'requeue', get('task'), get('queue'), get('arguments'), get('ctx'), get('attempt')}
"""

# KEYS = {lease index}; ARGV: now, limit
_DUE = r"""
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = string.format('%.17g', tonumber(t[1]) + tonumber(t[2]) / 1000000)
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Lease:
    """The right to run one call and store its outcome; ``token`` only ever grows."""

    record: str
    owner: str
    token: int


@dataclass(frozen=True)
class Message:
    """What a sweeper publishes to hand a call whose holder died to another worker."""

    task: str
    queue: str
    arguments: dict[str, Any]
    context: dict[str, Any]
    attempt: int

    @property
    def call_id(self) -> str:
        return str(self.context["call_id"])

    def kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments, as the client sends them."""
        return {"arguments": self.arguments, "context": self.context}


@dataclass(frozen=True)
class Claim:
    """What :meth:`IdempotencyStore.begin` found.

    ``acquired``: this run holds the lease (``uncertain``: an earlier run may
    have written already); ``joined``: another call is running it and will
    answer this one too; ``duplicate``: another copy of this very call is
    running; ``replay``: it is over and ``stored`` is the result;
    ``mismatch``: the key was used with other arguments.
    """

    kind: ClaimKind
    lease: Lease | None = None
    uncertain: bool = False
    state: str | None = None
    stored: ToolResult | None = None


@dataclass(frozen=True)
class Finished:
    """Whether the outcome was stored, and the calls that joined and wait for it."""

    stored: bool
    waiters: list[CallContext]


class IdempotencyStore:
    """The records in one Redis; every change is one Lua script call (one round trip).

    Time comes from the injected clock when there is one (tests: exact), else
    from Redis ``TIME``, so that clock skew between workers cannot shorten or
    lengthen a lease.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys | None = None,
        *,
        clock: Clock | None = None,
        lease_s: float = 5.0,
        retention_s: float = 86_400.0,
    ) -> None:
        self.redis = client
        self.keys = keys or Keys()
        self.clock = clock
        self.lease_s = lease_s
        self.retention_s = retention_s
        self._begin = client.register_script(_PRELUDE + _BEGIN)
        self._renew = client.register_script(_PRELUDE + _RENEW)
        self._park = client.register_script(_PRELUDE + _PARK)
        self._finish = client.register_script(_PRELUDE + _FINISH)
        self._claim = client.register_script(_PRELUDE + _CLAIM)
        self._due = client.register_script(_DUE)

    def begin(
        self,
        record: str,
        *,
        args_hash: str,
        ctx: CallContext,
        mode: Mode,
        has_check: bool,
        message: Message,
    ) -> Claim:
        """Take the call, join it, or find it done: one atomic step."""
        owner = uuid.uuid4().hex
        raw = self._run(
            self._begin,
            record,
            args_hash,
            ctx.call_id,
            _dumps(ctx.to_json()),
            owner,
            self.lease_s,
            repr(float(ctx.deadline)),
            "1" if has_check else "0",
            mode,
            message.task,
            message.queue,
            _dumps(message.arguments),
            message.attempt,
            self.retention_s,
        )
        kind = _text(raw[0])
        if kind == "acquired":
            lease = Lease(record, owner, int(_text(raw[1])))
            return Claim("acquired", lease=lease, uncertain=_text(raw[2]) == "1")
        if kind == "replay":
            stored = ToolResult.model_validate_json(_text(raw[3]))
            return Claim("replay", state=_text(raw[2]), stored=stored)
        return Claim(kind)  # type: ignore[arg-type]

    def renew(self, lease: Lease) -> bool:
        """Extend the lease by ``lease_s``; False once someone else holds the call."""
        raw = self._run(self._renew, lease.record, lease.owner, lease.token, self.lease_s)
        return _text(raw[0]) == "ok"

    def park(
        self, lease: Lease, *, hold_s: float, uncertain: bool, ctx: CallContext, attempt: int
    ) -> bool:
        """Between attempts: keep the call for its retry for ``hold_s``; False if fenced."""
        raw = self._run(
            self._park,
            lease.record,
            lease.owner,
            lease.token,
            max(hold_s, 0.001),
            "1" if uncertain else "0",
            _dumps(ctx.to_json()),
            attempt,
            self.retention_s,
        )
        return _text(raw[0]) == "ok"

    def finish(self, lease: Lease, state: FinalState, result: ToolResult) -> Finished:
        """Store the outcome (or release the key) if ``lease`` still holds the call."""
        raw = self._run(
            self._finish,
            lease.record,
            lease.owner,
            lease.token,
            state,
            result.model_dump_json(),
            self.retention_s,
        )
        waiters = [CallContext.from_json(json.loads(_text(w))) for w in raw[1]]
        return Finished(_text(raw[0]) == "ok", waiters)

    def due(self, limit: int = 100) -> list[str]:
        """Records whose lease has ended, by the index (a hint; :meth:`claim` decides)."""
        raw = self._due(keys=[self.keys.idempotency_leases()], args=[self._now_arg(), limit])
        return [_text(r) for r in raw]

    def claim(self, records: Sequence[str]) -> list[Message]:
        """The messages to publish again for these expired leases, in one round trip.

        A claimed call is held for :data:`REQUEUE_LEASES` leases: its message may
        wait in a busy queue, and publishing it again sooner would only add
        copies (which the record would turn away).
        """
        hold_s = self.lease_s * REQUEUE_LEASES
        pipe = self.redis.pipeline(transaction=False)
        for record in records:
            self._claim(
                keys=self._keys(record),
                args=[self._now_arg(), record, hold_s, self.retention_s],
                client=pipe,
            )
        return [m for m in (_message(raw) for raw in pipe.execute()) if m is not None]

    def snapshot(self, record: str) -> dict[str, str]:
        """The record's fields as stored (for operators and tests)."""
        raw = self.redis.hgetall(self.keys.idempotency(record))
        return {_text(k): _text(v) for k, v in raw.items()}

    def waiting(self, record: str) -> list[str]:
        """Call ids of the calls joined to ``record``."""
        raw = self.redis.zrange(self.keys.idempotency_waiters(record), 0, -1)
        return [str(json.loads(_text(w))["call_id"]) for w in raw]

    def _keys(self, record: str) -> list[str]:
        k = self.keys
        return [
            k.idempotency(record),
            k.idempotency_waiters(record),
            k.idempotency_leases(),
            k.idempotency_tokens(),
        ]

    def _now_arg(self) -> str:
        return "" if self.clock is None else repr(float(self.clock.now()))

    def _run(self, script: Script, record: str, *args: Any) -> Any:
        return script(keys=self._keys(record), args=[self._now_arg(), record, *args])


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _message(raw: Sequence[Any]) -> Message | None:
    if _text(raw[0]) != "requeue":
        return None
    task, queue, arguments, context, attempt = (_text(v) for v in raw[1:6])
    return Message(task, queue, json.loads(arguments), json.loads(context), int(attempt))


class LeaseRenewer:
    """Keeps one call's lease alive while its body runs, on a thread of its own.

    It renews every third of the lease, so two renewals can fail before the
    lease runs out. When the lease is lost (another worker took the call over)
    it stops; the body cannot be stopped, but its outcome will be fenced off.
    """

    def __init__(self, store: IdempotencyStore, lease: Lease, interval_s: float) -> None:
        self.store = store
        self.lease = lease
        self.interval_s = interval_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"toolexec-lease-{lease.record[:8]}", daemon=True
        )

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def renew_once(self) -> bool:
        """One renewal; False when the lease is gone for good."""
        try:
            kept = self.store.renew(self.lease)
        except _UNREACHABLE as exc:
            log.warning("could not renew the lease of %s: %s", self.lease.record, exc)
            return True
        if not kept:
            self.lost = True
            log.warning(
                "lost the lease of %s (token %d): another worker took the call over",
                self.lease.record,
                self.lease.token,
            )
        return kept

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.renew_once():
                return


class LeaseSweeper:
    """Hands calls whose holder died to another worker: every worker runs one.

    Each tick asks for records whose lease ended (one round trip) and claims
    them (one more, only when some are due); a claim moves the lease forward
    by ``lease_s`` before the message is published, so two sweepers never
    publish the same call in the same lease period. ``publish`` is given by
    the Celery side (``toolexec.tasks.lease_sweeper``) and sends a batch at once;
    this module knows no Celery.
    """

    def __init__(
        self,
        store: IdempotencyStore,
        publish: Callable[[Sequence[Message]], object],
        interval_s: float,
        *,
        limit: int = 100,
    ) -> None:
        self.store = store
        self.publish = publish
        self.interval_s = interval_s
        self.limit = limit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> list[Message]:
        """Publish every call whose lease ended; returns what was published."""
        due = self.store.due(self.limit)
        if not due:
            return []
        messages = self.store.claim(due)
        if messages:
            self.publish(messages)
        for message in messages:
            log.warning(
                "call %s (%s): its worker stopped renewing the lease; handed to another",
                message.call_id,
                message.task,
            )
        return messages

    def start(self) -> LeaseSweeper:
        self._thread = threading.Thread(target=self._loop, name="toolexec-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep_once()
            except Exception as exc:  # a missed sweep must never stop the worker
                log.warning("lease sweep failed: %s: %s", type(exc).__name__, exc)


# --- the layer ----------------------------------------------------------------


@dataclass(frozen=True)
class _Replayed(Outcome):
    """The call is over: answer with the stored result."""

    stored: ToolResult | None = None


@dataclass(frozen=True)
class _Deferred(Outcome):
    """Another worker answers this call."""

    reason: str = ""


@dataclass(frozen=True)
class _Owned(Outcome):
    """An outcome of a run that held the lease, to be stored in :meth:`settle`."""

    lease: Lease | None = None
    mode: Mode = "idempotent"
    uncertain: bool = False  # whether the write may have happened
    confirmed: bool = False  # the check found the effect; the body did not run


def _owned(
    outcome: Outcome, lease: Lease, mode: Mode, *, uncertain: bool = False, confirmed: bool = False
) -> _Owned:
    base = {f.name: getattr(outcome, f.name) for f in fields(Outcome)}
    return _Owned(**base, lease=lease, mode=mode, uncertain=uncertain, confirmed=confirmed)


def _left_uncertain(outcome: Outcome, before: bool) -> bool:
    """Whether, after ``outcome``, the write may have happened."""
    if not outcome.ran:
        return before
    return outcome.failure is not None and outcome.failure.error_type in UNCERTAIN_TYPES


def _final_state(mode: Mode, result: ToolResult) -> FinalState:
    """What the record keeps: outcomes about the effect; a sure no-op frees the key."""
    if mode == "coalesce":
        return "released"
    if result.status == "ok":
        return "succeeded"
    if result.status == "unknown":
        return "unknown"
    return "released" if result.error is not None and result.error.retryable else "failed"


def as_unknown(result: ToolResult) -> ToolResult:
    """A failed result of a write that may have happened, told as such."""
    if result.error is None:
        return result
    message = f"the outcome is unknown: {result.error.message}"
    error = result.error.model_copy(
        update={"message": message, "suggestion": _UNKNOWN_SUGGESTION, "retryable": False}
    )
    return result.model_copy(update={"status": "unknown", "error": error})


class IdempotencyLayer:
    """The outermost layer: dedupes, joins, replays and takes over calls.

    Its work is split in two because what to store depends on the executor's
    verdict, which comes after the layers: :meth:`__call__` claims the record
    and runs the body under a renewed lease; :meth:`settle` stores the final
    result (or parks the call for its retry) under the fencing check and
    answers the calls that joined.
    """

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        default_queue: str = "tools",
        runner: Runner | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.default_queue = default_queue
        self.runner = runner or Runner()
        self.clock = clock or SystemClock()

    # -- before the body ---------------------------------------------------

    def __call__(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        mode = call_mode(attempt.spec, attempt.ctx)
        if mode is None:
            return proceed()
        try:
            claim = self._begin(attempt, mode)
        except _UNREACHABLE as exc:
            if mode == "coalesce":  # sharing reads is an optimisation: run it alone
                return proceed()
            return Outcome(failure=_store_down(exc), ran=False)
        if claim.kind == "mismatch":
            return Outcome(failure=_mismatch(attempt), ran=False)
        if claim.kind == "replay":
            return _Replayed(ran=False, stored=claim.stored)
        if claim.lease is None:
            return _Deferred(ran=False, reason=f"{claim.kind}: another worker answers it")
        return self._hold(attempt, proceed, claim.lease, mode, claim.uncertain)

    def _begin(self, attempt: Attempt, mode: Mode) -> Claim:
        spec, ctx = attempt.spec, attempt.ctx
        message = Message(
            task=spec.task_name,
            queue=spec.policy.queue or self.default_queue,
            arguments=attempt.arguments,
            context=ctx.to_json(),
            attempt=attempt.number,
        )
        args_hash = arguments_hash(spec.name, attempt.arguments)
        return self.store.begin(
            record_id(mode, args_hash, ctx),
            args_hash=args_hash,
            ctx=ctx,
            mode=mode,
            has_check=mode == "idempotent" and spec.check is not None,
            message=message,
        )

    def _hold(
        self, attempt: Attempt, proceed: Proceed, lease: Lease, mode: Mode, uncertain: bool
    ) -> Outcome:
        """Run under the lease, renewed on its own thread until the body is done."""
        renewer = LeaseRenewer(self.store, lease, self.store.lease_s / 3).start()
        try:
            if mode == "idempotent" and uncertain:
                return self._resolve(attempt, proceed, lease)
            outcome = proceed()
            uncertain = mode == "idempotent" and _left_uncertain(outcome, False)
            return _owned(outcome, lease, mode, uncertain=uncertain)
        finally:
            renewer.stop()

    def _resolve(self, attempt: Attempt, proceed: Proceed, lease: Lease) -> Outcome:
        """An earlier run may have written: check before writing again."""
        check = attempt.spec.check
        if check is None:
            return _owned(Outcome(failure=_lost(), ran=False), lease, "idempotent", uncertain=True)
        found, present = self._check(attempt, check)
        if found.failure is not None:  # cannot tell yet: still uncertain
            return _owned(found, lease, "idempotent", uncertain=True)
        if present:
            return _owned(found, lease, "idempotent", confirmed=True)
        outcome = proceed()
        return _owned(outcome, lease, "idempotent", uncertain=_left_uncertain(outcome, False))

    def _check(self, attempt: Attempt, check: Callable[..., Any]) -> tuple[Outcome, bool]:
        """The tool's check within the attempt's time, and whether it found the effect.

        A check may return the thing it found (the order, the message) instead
        of True: that becomes the result's data.
        """
        kwargs = _kwargs(attempt.spec, attempt.arguments)
        start = self.clock.now()
        try:
            found = self.runner.run(check, kwargs, attempt.limit)
        except Exception as exc:
            failure = classify_exception(exc, self.clock.now())
            return Outcome(failure=failure, ran=False, duration_s=self.clock.now() - start), False
        data = None if isinstance(found, bool) else to_jsonable_python(found)
        return Outcome(data=data, ran=False, duration_s=self.clock.now() - start), bool(found)

    # -- after the verdict ---------------------------------------------------

    def settle(self, attempt: Attempt, outcome: Outcome, verdict: Verdict) -> Verdict:
        """Store what the call came to, or answer from the record; see the class doc."""
        if isinstance(outcome, _Replayed) and outcome.stored is not None:
            now = self.clock.now()
            return Final(restamped(outcome.stored, attempt.ctx, now, replayed=True, attempts=0))
        if isinstance(outcome, _Deferred):
            return NoReply(outcome.reason)
        if not isinstance(outcome, _Owned) or outcome.lease is None:
            return verdict
        try:
            if isinstance(verdict, Final):
                return self._finish(attempt, outcome, verdict.result)
            if not isinstance(verdict, NoReply):
                # a retry, or a rate limit's deferral: the message comes back after a delay
                instead = self._park(attempt, outcome, verdict)
                return verdict if instead is None else instead
        except _UNREACHABLE as exc:
            # The lease runs out and a sweeper hands the call on; its caller still
            # gets this verdict now.
            log.warning("could not store the outcome of %s: %s", attempt.ctx.call_id, exc)
        return verdict

    def _park(self, attempt: Attempt, outcome: _Owned, verdict: _Later) -> Verdict | None:
        """Keep the call for the message that comes back after ``verdict.delay``.

        None: parked, the verdict stands. A write that may have happened is
        repeated only after its check; a tool without one ends here as
        ``unknown`` instead of retrying.
        """
        spec, now = attempt.spec, self.clock.now()
        if isinstance(verdict, Retry) and outcome.uncertain and spec.check is None:
            info = error_info(verdict.error)
            result = error_result(verdict.context, info, attempts=attempt.number, now=now)
            return self._finish(attempt, outcome, as_unknown(result))
        assert outcome.lease is not None
        parked = self.store.park(
            outcome.lease,
            hold_s=min(verdict.delay, attempt.ctx.deadline - now) + self.store.lease_s,
            uncertain=outcome.uncertain,
            ctx=verdict.context,
            attempt=attempt.number + 1 if isinstance(verdict, Retry) else attempt.number,
        )
        return None if parked else NoReply("fenced: another worker took the call over")

    def _finish(self, attempt: Attempt, outcome: _Owned, result: ToolResult) -> Verdict:
        if outcome.mode == "idempotent" and outcome.uncertain and result.status == "error":
            result = as_unknown(result)
        if outcome.confirmed:
            result = result.model_copy(update={"source": "check"})
        assert outcome.lease is not None
        finished = self.store.finish(outcome.lease, _final_state(outcome.mode, result), result)
        if not finished.stored:
            log.warning(
                "call %s: a newer holder owns it (this run's token %d is stale); outcome dropped",
                attempt.ctx.call_id,
                outcome.lease.token,
            )
            return NoReply("fenced: another worker took the call over")
        self._answer(finished.waiters, result)
        return Final(result)

    def _answer(self, waiters: Sequence[CallContext], result: ToolResult) -> None:
        """Deliver the outcome to every call that joined this one."""
        now = self.clock.now()
        for ctx in waiters:
            if ctx.call_id == result.call_id:
                continue  # the call itself gets its own answer
            joined = restamped(result, ctx, now, replayed=True, attempts=0)
            deliver(self.store.redis, self.store.keys, ctx.reply_to, joined, ctx.deadline - now)


class _Later(Protocol):
    """A verdict that sends the call's message again after ``delay`` seconds."""

    @property
    def delay(self) -> float: ...

    @property
    def context(self) -> CallContext: ...


def _kwargs(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    model = spec.arguments.model_validate(arguments)
    return {name: getattr(model, name) for name in type(model).model_fields}


def _store_down(exc: Exception) -> ToolException:
    return UnavailableError(
        f"the idempotency store (Redis) did not answer ({type(exc).__name__}: {exc}); "
        "the call was not made, since it could not be made safely",
        suggestion="Try again in a moment.",
    )


def _mismatch(attempt: Attempt) -> ToolException:
    return IdempotencyMismatchError(
        f"the idempotency key {attempt.ctx.idempotency_key!r} was already used for a call "
        f"with other arguments (or another tool than {attempt.tool!r})",
        suggestion="Use a new idempotency key for a different request, or repeat the "
        "original arguments exactly to get the original result.",
    )


def _lost() -> ToolException:
    return WorkerLostError(
        "the worker running this call stopped while the action may have been under way, "
        "and the tool declares no check to find out whether it took effect",
        suggestion=_UNKNOWN_SUGGESTION,
    )
