"""The idempotency layer inside a real Executor: real Redis, ManualClock, tools that count runs.

Each test drives ``Executor.attempt`` as a worker would for one message and
looks at the verdict, the tool's run count and the record; nothing sleeps.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from typing import Any

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.connection import fail_fast_client
from toolexec.context import CallContext
from toolexec.errors import ErrorType, NotFoundError, ToolTimeoutError, UnavailableError
from toolexec.idempotency import IdempotencyLayer, IdempotencyStore, Message, call_mode, record_id
from toolexec.keys import Keys
from toolexec.layers.batch import Batch
from toolexec.normalize import arguments_hash
from toolexec.pipeline.execution import Executor, Final, NoReply, Retry, Verdict
from toolexec.pipeline.runner import Runner
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.results import ToolResult

LEASE_S = 5.0


class Ledger:
    """A pretend service: the writes it received, by order id."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def has(self, order_id: str) -> bool:
        return order_id in self.writes


@pytest.fixture
def store(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> IdempotencyStore:
    return IdempotencyStore(rdb, keys, clock=clock, lease_s=LEASE_S)


@pytest.fixture
def executor(store: IdempotencyStore, clock: ManualClock) -> Executor:
    layer = IdempotencyLayer(store, runner=Runner(), clock=clock)
    return Executor(runner=Runner(), clock=clock, rng=random.Random(7), layers=[layer])


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


def ctx_of(
    clock: ManualClock,
    spec: ToolSpec,
    call_id: str = "c1",
    *,
    run_id: str | None = "run-1",
    **kw: Any,
) -> CallContext:
    return CallContext(
        call_id=call_id,
        tool=spec.name,
        deadline=clock.now() + 60.0,
        submitted_at=clock.now(),
        reply_to=f"reply-{call_id}",
        run_id=run_id,
        **kw,
    )


def register(registry: Registry, func: Callable[..., Any], **policy: Any) -> ToolSpec:
    tool(registry=registry, breaker=None, **policy)(func)
    spec = registry.get(func.__name__)
    assert spec is not None
    return spec


def final(verdict: Verdict) -> ToolResult:
    assert isinstance(verdict, Final), verdict
    return verdict.result


def order_tool(
    registry: Registry, ledger: Ledger, *, fail: Exception | None = None, with_check: bool = True
) -> ToolSpec:
    """A side-effecting tool: records the write, then (optionally) fails as a network would."""

    def place_order(order_id: str, amount: float) -> dict[str, Any]:
        ledger.writes.append(order_id)
        if fail is not None:
            raise fail
        return {"order": order_id, "amount": amount}

    def order_exists(order_id: str, amount: float) -> dict[str, Any] | bool:
        return {"order": order_id, "found": True} if ledger.has(order_id) else False

    check = order_exists if with_check else None
    return register(registry, place_order, side_effects=True, check=check, max_attempts=3)


ORDER = {"order_id": "o-1", "amount": 9.5}


def test_a_repeat_after_completion_replays_the_stored_result_without_running(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    spec = order_tool(registry, ledger)
    first = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c1"), 1))
    clock.advance(30.0)
    again = final(
        executor.attempt(spec, {"amount": 9.50, "order_id": "o-1"}, ctx_of(clock, spec, "c2"), 1)
    )

    assert ledger.writes == ["o-1"]
    assert first.ok and not first.replayed and first.attempts == 1
    assert again.ok and again.replayed and again.attempts == 0
    assert again.data == first.data and again.call_id == "c2"
    assert again.for_model() == {"status": "ok", "data": first.data, "replayed": True}


def test_the_same_caller_key_with_other_arguments_is_refused_as_a_mismatch(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    spec = order_tool(registry, ledger)
    key = {"idempotency_key": "charge-42"}
    final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c1", **key), 1))
    other = {"order_id": "o-1", "amount": 10.0}
    refused = final(executor.attempt(spec, other, ctx_of(clock, spec, "c2", **key), 1))

    assert ledger.writes == ["o-1"]
    assert refused.status == "error" and refused.attempts == 0
    assert refused.error is not None and refused.error.type is ErrorType.IDEMPOTENCY_MISMATCH
    assert "charge-42" in refused.error.message and not refused.error.retryable


def test_a_caller_key_spans_runs_and_a_derived_key_does_not(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    spec = order_tool(registry, ledger)
    final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c1", run_id="r1"), 1))
    other_run = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c2", run_id="r2"), 1))
    keyed = {"idempotency_key": "k-1"}
    final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c3", run_id="r3", **keyed), 1))
    replay = final(
        executor.attempt(spec, ORDER, ctx_of(clock, spec, "c4", run_id="r4", **keyed), 1)
    )

    assert not other_run.replayed and replay.replayed
    assert ledger.writes == ["o-1", "o-1", "o-1"]


def test_without_a_run_id_only_copies_of_the_same_call_are_deduplicated(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    spec = order_tool(registry, ledger)
    ctx = ctx_of(clock, spec, "c1", run_id=None)
    final(executor.attempt(spec, ORDER, ctx, 1))
    redelivered = final(executor.attempt(spec, ORDER, ctx, 1))
    another = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c2", run_id=None), 1))
    assert redelivered.replayed and not another.replayed
    assert ledger.writes == ["o-1", "o-1"]


def test_a_duplicate_in_flight_joins_and_is_handed_to_the_final_verdict(
    executor: Executor,
    registry: Registry,
    clock: ManualClock,
    rdb: redis.Redis,
    keys: Keys,
) -> None:
    """The duplicate arrives while the first call's body runs; its task ends at once.

    The layer delivers nothing itself: the final verdict names the joined call,
    and the worker's one delivery answers it (tests/integration/test_fallback.py).
    """
    joined: list[Verdict] = []

    def send_email(to: str) -> str:
        joined.append(executor.attempt(spec, {"to": to}, ctx_of(clock, spec, "c2"), 1))
        return f"sent to {to}"

    spec = register(registry, send_email, side_effects=True)
    verdict = executor.attempt(spec, {"to": "a@b.c"}, ctx_of(clock, spec, "c1"), 1)

    assert isinstance(joined[0], NoReply)
    assert isinstance(verdict, Final) and verdict.result.data == "sent to a@b.c"
    assert [(j.call_id, j.reply_to) for j in verdict.joined] == [("c2", "reply-c2")]
    assert rdb.llen(keys.reply("reply-c2")) == 0 and rdb.llen(keys.reply("reply-c1")) == 0


def test_a_write_that_timed_out_without_a_check_ends_unknown_instead_of_retrying(
    executor: Executor,
    registry: Registry,
    clock: ManualClock,
    ledger: Ledger,
    store: IdempotencyStore,
) -> None:
    spec = order_tool(registry, ledger, fail=ToolTimeoutError("no answer in 5 s"), with_check=False)
    result = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c1"), 1))

    assert ledger.writes == ["o-1"]
    assert result.status == "unknown" and result.attempts == 1
    assert result.error is not None and result.error.type is ErrorType.TIMEOUT
    assert not result.error.retryable and "may or may not" in (result.error.suggestion or "")
    again = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c2"), 1))
    assert again.status == "unknown" and again.replayed
    assert ledger.writes == ["o-1"]


def test_the_retry_of_an_uncertain_write_checks_first_and_does_not_write_again(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    spec = order_tool(registry, ledger, fail=ToolTimeoutError("no answer in 5 s"))
    ctx = ctx_of(clock, spec, "c1")
    retry = executor.attempt(spec, ORDER, ctx, 1)
    assert isinstance(retry, Retry)
    clock.advance(retry.delay)

    result = final(executor.attempt(spec, ORDER, retry.context, 2))

    assert ledger.writes == ["o-1"]
    assert result.ok and result.source == "check"
    assert result.data == {"order": "o-1", "found": True}
    assert result.attempts == 1  # the body ran once, in attempt 1


def test_the_retry_writes_again_when_the_check_finds_nothing(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    calls: list[str] = []

    def pay(invoice: str) -> str:
        calls.append(invoice)
        if len(calls) == 1:
            raise ToolTimeoutError("connection dropped before the request was sent")
        return "paid"

    def paid(invoice: str) -> bool:
        return False

    spec = register(registry, pay, side_effects=True, check=paid)
    retry = executor.attempt(spec, {"invoice": "i-1"}, ctx_of(clock, spec), 1)
    assert isinstance(retry, Retry)
    result = final(executor.attempt(spec, {"invoice": "i-1"}, retry.context, 2))
    assert result.ok and result.data == "paid" and result.source is None
    assert calls == ["i-1", "i-1"]


def test_a_call_taken_over_from_a_dead_worker_without_a_check_ends_unknown(
    executor: Executor,
    registry: Registry,
    clock: ManualClock,
    ledger: Ledger,
    store: IdempotencyStore,
) -> None:
    spec = order_tool(registry, ledger, with_check=False)
    ctx = ctx_of(clock, spec, "c1")
    dead = store.begin(
        record_id("idempotent", _args_hash(spec, ORDER), ctx),
        args_hash=_args_hash(spec, ORDER),
        ctx=ctx,
        mode="idempotent",
        has_check=False,
        message=Message(spec.task_name, "tools", ORDER, ctx.to_json(), 1),
    )
    assert dead.kind == "acquired"
    clock.advance(LEASE_S)

    result = final(executor.attempt(spec, ORDER, ctx, 2))

    assert ledger.writes == []  # never written twice: not even once more here
    assert result.status == "unknown"
    assert result.error is not None and result.error.type is ErrorType.WORKER_LOST


def test_a_taken_over_call_whose_check_finds_the_effect_succeeds_without_writing(
    executor: Executor,
    registry: Registry,
    clock: ManualClock,
    ledger: Ledger,
    store: IdempotencyStore,
) -> None:
    spec = order_tool(registry, ledger)
    ctx = ctx_of(clock, spec, "c1")
    _hold_as_dead_worker(store, spec, ctx)
    ledger.writes.append("o-1")  # the dead worker's write reached the service
    clock.advance(LEASE_S)

    result = final(executor.attempt(spec, ORDER, ctx, 2))

    assert result.ok and result.source == "check" and ledger.writes == ["o-1"]


def test_a_zombies_outcome_is_dropped_once_another_worker_took_the_call_over(
    executor: Executor, registry: Registry, clock: ManualClock, store: IdempotencyStore
) -> None:
    """The body outlives its lease (paused worker); a taker ran it meanwhile."""
    verdicts: list[Verdict] = []

    def slow_send(to: str) -> str:
        clock.advance(LEASE_S + 1)  # paused past its lease; nobody renewed it
        verdicts.append(executor.attempt(spec, {"to": to}, ctx, 2))  # the taker
        return "zombie's"

    spec = register(registry, slow_send, side_effects=True)
    ctx = ctx_of(clock, spec, "c1")
    zombie = executor.attempt(spec, {"to": "x"}, ctx, 1)
    assert isinstance(zombie, NoReply) and "fenced" in zombie.reason
    record = store.snapshot(record_id("idempotent", _args_hash(spec, {"to": "x"}), ctx))
    assert record["fenced"] == "1" and record["state"] == "unknown"
    assert isinstance(verdicts[0], Final)


def test_a_permanent_failure_is_stored_and_replayed(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    spec = order_tool(registry, ledger, fail=NotFoundError("no such customer"))
    first = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c1"), 1))
    again = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c2"), 1))
    assert first.error is not None and first.error.type is ErrorType.NOT_FOUND
    assert again.replayed and again.error == first.error and ledger.writes == ["o-1"]


def test_a_transient_failure_that_used_up_the_attempts_frees_the_key(
    executor: Executor, registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    """A 503 means the write did not happen: a later call may simply try again."""
    spec = order_tool(registry, ledger, fail=UnavailableError("503"))
    last = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c1"), 3))
    later = final(executor.attempt(spec, ORDER, ctx_of(clock, spec, "c2"), 3))
    assert last.error is not None and last.error.type is ErrorType.UNAVAILABLE
    assert not later.replayed and ledger.writes == ["o-1", "o-1"]


def test_coalesced_reads_in_flight_share_one_run_and_nothing_is_cached(
    executor: Executor, registry: Registry, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    runs: list[str] = []
    joined: list[Verdict] = []

    def lookup(city: str) -> str:
        runs.append(city)
        if len(runs) == 1:
            joined.append(
                executor.attempt(spec, {"city": city}, ctx_of(clock, spec, "c2", run_id="other"), 1)
            )
        return f"sunny in {city}"

    spec = register(registry, lookup, coalesce=True)
    first = executor.attempt(spec, {"city": "Oslo"}, ctx_of(clock, spec, "c1"), 1)
    later = executor.attempt(spec, {"city": "Oslo"}, ctx_of(clock, spec, "c3"), 1)

    assert isinstance(joined[0], NoReply)
    assert isinstance(first, Final) and first.result.data == "sunny in Oslo"
    assert [j.call_id for j in first.joined] == ["c2"]
    assert isinstance(later, Final) and not later.result.replayed and not later.joined
    assert runs == ["Oslo", "Oslo"]


def test_side_effects_or_a_key_make_a_call_idempotent_and_every_other_call_holds_a_lease(
    registry: Registry, clock: ManualClock
) -> None:
    def plain(x: int) -> int:
        return x

    def write(x: int) -> int:
        return x

    def read(x: int) -> int:
        return x

    specs = [
        register(registry, plain),
        register(registry, write, side_effects=True),
        register(registry, read, coalesce=True),
    ]
    modes = [call_mode(spec, ctx_of(clock, spec)) for spec in specs]
    assert modes == ["lease", "idempotent", "coalesce"]
    keyed = ctx_of(clock, specs[0], idempotency_key="k")
    assert call_mode(specs[0], keyed) == "idempotent"


def test_record_ids_follow_the_normalised_arguments(clock: ManualClock, registry: Registry) -> None:
    def write(path: str, ratio: float) -> None:
        return None

    spec = register(registry, write, side_effects=True)
    ctx = ctx_of(clock, spec)
    a = record_id("idempotent", _args_hash(spec, {"path": "./data/a.csv", "ratio": 0.1}), ctx)
    b = record_id("idempotent", _args_hash(spec, {"ratio": 0.10, "path": "data//a.csv"}), ctx)
    c = record_id("idempotent", _args_hash(spec, {"ratio": 0.2, "path": "data//a.csv"}), ctx)
    assert a == b != c


def _args_hash(spec: ToolSpec, arguments: dict[str, Any]) -> str:
    return arguments_hash(spec.name, arguments)


def _hold_as_dead_worker(store: IdempotencyStore, spec: ToolSpec, ctx: CallContext) -> None:
    claim = store.begin(
        record_id("idempotent", _args_hash(spec, ORDER), ctx),
        args_hash=_args_hash(spec, ORDER),
        ctx=ctx,
        mode="idempotent",
        has_check=spec.check is not None,
        message=Message(spec.task_name, "tools", ORDER, ctx.to_json(), 1),
    )
    assert claim.kind == "acquired"


def test_without_redis_a_write_is_not_run_but_a_coalesced_read_is(
    registry: Registry, clock: ManualClock, ledger: Ledger
) -> None:
    """A write that cannot be deduplicated waits (transient); a read just runs unshared."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = IdempotencyStore(fail_fast_client(f"redis://127.0.0.1:{port}/0"), clock=clock)
    executor = Executor(clock=clock, layers=[IdempotencyLayer(store, clock=clock)])
    write = order_tool(registry, ledger)

    def lookup(city: str) -> str:
        return f"sunny in {city}"

    read = register(registry, lookup, coalesce=True)

    refused = executor.attempt(write, ORDER, ctx_of(clock, write), 1)
    answered = final(executor.attempt(read, {"city": "Oslo"}, ctx_of(clock, read), 1))

    assert isinstance(refused, Retry) and refused.error.error_type is ErrorType.UNAVAILABLE
    assert ledger.writes == []
    assert answered.ok and answered.data == "sunny in Oslo"


def test_a_read_only_call_holds_a_lease_while_it_runs_released_with_its_answer(
    executor: Executor, store: IdempotencyStore, registry: Registry, clock: ManualClock
) -> None:
    """Every call is leased, so a sweeper can hand a dead worker's read on (issue 12)."""
    seen: list[list[str]] = []

    def lookup(city: str) -> str:
        clock.advance(LEASE_S * 2)  # the lease has run out: as if this worker had died
        seen.append(store.due())
        return f"sunny in {city}"

    spec = register(registry, lookup)
    verdict = executor.attempt(spec, {"city": "Oslo"}, ctx_of(clock, spec, "r1"), 1)

    record = record_id("lease", _args_hash(spec, {"city": "Oslo"}), ctx_of(clock, spec, "r1"))
    assert isinstance(verdict, Final) and verdict.result.ok and seen == [[record]]
    # the lease is released with the delivery, in its round trip (WorkerRuntime.deliver)
    assert verdict.release is not None and verdict.release.record == record
    batch = Batch()
    store.release(verdict.release, batch)
    batch.execute()
    assert store.due() == [] and store.snapshot(record) == {}


def test_a_dead_workers_read_only_call_is_claimed_for_another_worker_once(
    store: IdempotencyStore, registry: Registry, clock: ManualClock
) -> None:
    def lookup(city: str) -> str:
        return city

    spec = register(registry, lookup)
    ctx = ctx_of(clock, spec, "r2")
    arguments = {"city": "Oslo"}
    record = record_id("lease", _args_hash(spec, arguments), ctx)
    claim = store.begin(
        record,
        args_hash=_args_hash(spec, arguments),
        ctx=ctx,
        mode="lease",
        has_check=False,
        message=Message(spec.task_name, "tools", arguments, ctx.to_json(), 1),
    )
    assert claim.kind == "acquired"

    clock.advance(LEASE_S + 0.1)
    [message] = store.claim(store.due())

    assert (message.call_id, message.task, message.arguments) == ("r2", spec.task_name, arguments)
    assert store.claim(store.due()) == []  # claimed once: held while its message waits
