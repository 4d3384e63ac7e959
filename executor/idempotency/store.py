"""The idempotency records in Redis: every change is one Lua script call.

The scripts are ``executor/lua/idempotency_*.lua``, each joined after the
shared ``prelude.lua`` and ``idempotency_record.lua`` (the record's keys, the
lease and the fencing check). A script's keys (the record, its waiters, its
bucket of the lease index and that bucket's token counter) share the bucket's
hash tag (``Keys.idempotency_bucket``), so each script touches one Redis Cluster
slot while the fleet's records spread over ``Keys.buckets`` slots.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.commands.core import Script

from toolexec.clock import Clock
from toolexec.context import CallContext
from toolexec.idempotency.records import (
    REQUEUE_LEASES,
    Claim,
    FinalState,
    Finished,
    Lease,
    Message,
    Mode,
)
from toolexec.keys import Keys
from toolexec.layers.batch import Batch
from toolexec.lua import register, script_source
from toolexec.results import ToolResult

__all__ = ["IdempotencyStore"]


def _record_script(client: redis.Redis, name: str) -> Script:
    """``name``'s script, after the prelude and the record's shared definitions."""
    return register(client, script_source("idempotency_record", name))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self._begin = register(client, script_source("idempotency_record", "idempotency_begin"))
        self._renew = register(client, script_source("idempotency_record", "idempotency_renew"))
        self._park = _record_script(client, "idempotency_park")
        self._finish = register(client, script_source("idempotency_record", "idempotency_finish"))
        self._claim = register(client, script_source("idempotency_record", "idempotency_claim"))
        self._due = register(client, script_source("idempotency_due"))

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
        claims: list[Claim] = []
        batch = Batch()
        self.begin_into(
            batch,
            record,
            args_hash=args_hash,
            ctx=ctx,
            mode=mode,
            has_check=has_check,
            message=message,
            on_claim=claims.append,
        )
        batch.execute()
        return claims[0]

    def begin_into(
        self,
        batch: Batch,
        record: str,
        *,
        args_hash: str,
        ctx: CallContext,
        mode: Mode,
        has_check: bool,
        message: Message,
        on_claim: Callable[[Claim], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """:meth:`begin` queued on ``batch``: ``on_claim`` gets the claim when it runs."""
        owner = uuid.uuid4().hex
        args = [
            self._now_arg(),
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
            self._retention(mode, ctx),
        ]
        batch.script(
            self.redis,
            self._begin,
            self._keys(record),
            args,
            lambda raw: on_claim(_claim(record, owner, raw)),
            on_error,
        )

    def _retention(self, mode: Mode, ctx: CallContext) -> float:
        """How long a record may outlive its last write (``Keys.idempotency``).

        Only an idempotent record keeps an outcome to replay; a coalesced or
        leased one is deleted when its call ends, and expires a minute after
        the call's whole time budget if nobody ends it.
        """
        if mode == "idempotent":
            return self.retention_s
        return min(self.retention_s, max(0.0, ctx.deadline - ctx.submitted_at) + 60.0)

    def renew(self, lease: Lease) -> bool:
        """Extend the lease by ``lease_s``; False once someone else holds the call."""
        raw = self._run(self._renew, lease.record, lease.owner, lease.token, self.lease_s)
        return _text(raw[0]) == "ok"

    def renew_many(self, leases: Sequence[Lease]) -> list[bool]:
        """:meth:`renew` for many leases in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for lease in leases:
            args: list[str | int | float] = [
                self._now_arg(),
                lease.record,
                lease.owner,
                lease.token,
                self.lease_s,
            ]
            self._renew(keys=self._keys(lease.record), args=args, client=pipe)
        return [_text(raw[0]) == "ok" for raw in pipe.execute()]

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

    def release(self, lease: Lease, batch: Batch | None = None) -> None:
        """Delete a leased call's record if ``lease`` still holds it.

        With ``batch``, the script is only queued there: the worker releases a
        read-only call's lease in the round trip that delivers its answer.
        """
        args: list[str | int] = [
            self._now_arg(),
            lease.record,
            lease.owner,
            lease.token,
            "released",
            "",
            0,
        ]
        own = Batch() if batch is None else batch
        own.script(self.redis, self._finish, self._keys(lease.record), args)
        if batch is None:
            own.execute()

    def due(self, limit: int = 100, buckets: Sequence[int] | None = None) -> list[str]:
        """Records whose lease has ended, by the index (a hint; :meth:`claim` decides).

        ``buckets`` of the index are asked (all by default) in one pipeline (on a
        cluster, one round trip per shard), each for at most ``limit``; at most
        ``limit`` are returned.
        """
        pipe = self.redis.pipeline(transaction=False)
        for bucket in range(self.keys.buckets) if buckets is None else buckets:
            self._due(
                keys=[self.keys.idempotency_leases(bucket)],
                args=[self._now_arg(), limit],
                client=pipe,
            )
        found = [_text(r) for raw in pipe.execute() for r in raw]
        return found[:limit]

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
            k.idempotency_leases_of(record),
            k.idempotency_tokens(record),
        ]

    def _now_arg(self) -> str:
        return "" if self.clock is None else repr(float(self.clock.now()))

    def _run(self, script: Script, record: str, *args: Any) -> Any:
        return script(keys=self._keys(record), args=[self._now_arg(), record, *args])


def _claim(record: str, owner: str, raw: Sequence[Any]) -> Claim:
    kind = _text(raw[0])
    if kind == "acquired":
        lease = Lease(record, owner, int(_text(raw[1])))
        return Claim("acquired", lease=lease, uncertain=_text(raw[2]) == "1")
    if kind == "replay":
        stored = ToolResult.model_validate_json(_text(raw[3]))
        return Claim("replay", state=_text(raw[2]), stored=stored)
    return Claim(kind)  # type: ignore[arg-type]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _message(raw: Sequence[Any]) -> Message | None:
    if _text(raw[0]) != "requeue":
        return None
    task, queue, arguments, context, attempt = (_text(v) for v in raw[1:6])
    return Message(task, queue, json.loads(arguments), json.loads(context), int(attempt))
