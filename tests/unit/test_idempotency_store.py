"""The idempotency record's Lua scripts on a real Redis, driven by a ManualClock: no sleeping."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from toolexec.clock import ManualClock
from toolexec.context import CallContext
from toolexec.idempotency import Claim, IdempotencyStore, Lease, LeaseKeeper, Message
from toolexec.keys import Keys
from toolexec.results import ToolResult

LEASE_S = 5.0
RETENTION_S = 3600.0
RECORD = "r" * 40
ARGS = "args-hash-1"


@pytest.fixture
def store(rdb: redis.Redis, keys: Keys, clock: ManualClock) -> IdempotencyStore:
    return IdempotencyStore(rdb, keys, clock=clock, lease_s=LEASE_S, retention_s=RETENTION_S)


def ctx_of(clock: ManualClock, call_id: str, *, deadline_in: float = 60.0) -> CallContext:
    return CallContext(
        call_id=call_id,
        tool="send_email",
        deadline=clock.now() + deadline_in,
        submitted_at=clock.now(),
        reply_to=f"reply-{call_id}",
        run_id="run-1",
    )


def begin(
    store: IdempotencyStore,
    ctx: CallContext,
    *,
    args: str = ARGS,
    has_check: bool = False,
    mode: Any = "idempotent",
) -> Claim:
    message = Message("tools.send_email", "tools", {"to": "a@b.c"}, ctx.to_json(), 1)
    return store.begin(
        RECORD, args_hash=args, ctx=ctx, mode=mode, has_check=has_check, message=message
    )


def held(claim: Claim) -> Lease:
    assert claim.kind == "acquired" and claim.lease is not None, claim
    return claim.lease


def result_of(ctx: CallContext, status: Any = "ok", data: Any = "sent") -> ToolResult:
    return ToolResult(status=status, tool=ctx.tool, call_id=ctx.call_id, data=data, attempts=1)


def test_the_first_call_acquires_a_lease_that_the_index_lists_by_its_end(
    store: IdempotencyStore, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    lease = held(begin(store, ctx_of(clock, "c1")))
    record = store.snapshot(RECORD)
    assert record["state"] == "in_progress" and record["phase"] == "running"
    assert (record["owner"], record["token"]) == (lease.owner, str(lease.token))
    assert float(record["lease_until"]) == clock.now() + LEASE_S
    assert rdb.zscore(keys.idempotency_leases_of(RECORD), RECORD) == clock.now() + LEASE_S
    assert 0 < rdb.pttl(keys.idempotency(RECORD)) <= RETENTION_S * 1000


def test_a_duplicate_while_the_lease_is_live_joins_and_is_listed_as_a_waiter(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    held(begin(store, ctx_of(clock, "c1")))
    clock.advance(LEASE_S - 0.001)
    claim = begin(store, ctx_of(clock, "c2"))
    assert claim.kind == "joined" and claim.lease is None
    assert store.waiting(RECORD) == ["c2"]


def test_a_second_copy_of_the_running_call_itself_is_dropped_not_joined(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    ctx = ctx_of(clock, "c1")
    held(begin(store, ctx))
    assert begin(store, ctx).kind == "duplicate"
    assert store.waiting(RECORD) == []


def test_the_same_key_with_other_arguments_is_a_mismatch_whatever_the_state(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    lease = held(begin(store, ctx_of(clock, "c1")))
    assert begin(store, ctx_of(clock, "c2"), args="other").kind == "mismatch"
    store.finish(lease, "succeeded", result_of(ctx_of(clock, "c1")))
    assert begin(store, ctx_of(clock, "c3"), args="other").kind == "mismatch"


def test_finishing_stores_the_result_for_replay_and_hands_back_the_waiters(
    store: IdempotencyStore, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    first = ctx_of(clock, "c1")
    lease = held(begin(store, first))
    begin(store, ctx_of(clock, "c2"))
    begin(store, ctx_of(clock, "c3", deadline_in=90.0))

    finished = store.finish(lease, "succeeded", result_of(first))

    assert finished.stored
    assert [w.call_id for w in finished.waiters] == ["c2", "c3"]  # by deadline
    assert finished.waiters[0] == ctx_of(clock, "c2")
    assert rdb.zscore(keys.idempotency_leases_of(RECORD), RECORD) is None
    replay = begin(store, ctx_of(clock, "c4"))
    assert replay.kind == "replay" and replay.state == "succeeded"
    assert replay.stored is not None and replay.stored.data == "sent"
    assert replay.stored.call_id == "c1"
    assert "arguments" not in store.snapshot(RECORD)  # the message is no longer needed


def test_finished_records_live_for_the_retention_period(
    store: IdempotencyStore, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    lease = held(begin(store, ctx_of(clock, "c1")))
    store.finish(lease, "failed", result_of(ctx_of(clock, "c1"), "error", None))
    ttl_ms = rdb.pttl(keys.idempotency(RECORD))
    assert RETENTION_S * 1000 - 5000 < ttl_ms <= RETENTION_S * 1000
    assert begin(store, ctx_of(clock, "c2")).state == "failed"


def test_releasing_deletes_the_record_so_the_next_call_runs_afresh(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    first = held(begin(store, ctx_of(clock, "c1")))
    begin(store, ctx_of(clock, "c2"))
    finished = store.finish(first, "released", result_of(ctx_of(clock, "c1"), "error", None))
    assert [w.call_id for w in finished.waiters] == ["c2"]
    assert store.snapshot(RECORD) == {}
    again = held(begin(store, ctx_of(clock, "c3"), args="new arguments are fine now"))
    assert again.token > first.token  # tokens never go back, even across a release


def test_renewal_moves_the_lease_end_forward(
    store: IdempotencyStore, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    lease = held(begin(store, ctx_of(clock, "c1")))
    clock.advance(4.0)
    assert store.renew(lease)
    assert float(store.snapshot(RECORD)["lease_until"]) == clock.now() + LEASE_S
    assert rdb.zscore(keys.idempotency_leases_of(RECORD), RECORD) == clock.now() + LEASE_S
    clock.advance(4.0)  # past the first lease end, within the renewed one
    assert begin(store, ctx_of(clock, "c2")).kind == "joined"


def test_an_expired_lease_is_taken_over_with_a_higher_token_and_the_write_uncertain(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    """The first holder died mid-call: its write may have happened."""
    dead = held(begin(store, ctx_of(clock, "c1")))
    clock.advance(LEASE_S)
    claim = begin(store, ctx_of(clock, "c2"))
    taker = held(claim)
    assert taker.token > dead.token and taker.owner != dead.owner
    assert claim.uncertain
    record = store.snapshot(RECORD)
    assert (record["takeovers"], record["runs"], record["call"]) == ("1", "2", "c2")
    assert store.waiting(RECORD) == ["c1"]  # the dead holder's caller still gets the answer


def test_a_zombie_holder_can_neither_renew_nor_overwrite_the_takers_outcome(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    zombie = held(begin(store, ctx_of(clock, "c1")))
    clock.advance(LEASE_S + 1.0)  # the zombie was paused (GC, SIGSTOP) past its lease
    taker = held(begin(store, ctx_of(clock, "c1")))
    assert store.finish(taker, "succeeded", result_of(ctx_of(clock, "c1"), data="taker's")).stored

    assert not store.renew(zombie)
    late = store.finish(zombie, "succeeded", result_of(ctx_of(clock, "c1"), data="zombie's"))

    assert not late.stored and late.waiters == []
    record = store.snapshot(RECORD)
    assert record["fenced"] == "1"
    assert ToolResult.model_validate_json(record["result"]).data == "taker's"


def test_a_zombie_cannot_finish_a_call_the_taker_still_runs(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    zombie = held(begin(store, ctx_of(clock, "c1")))
    clock.advance(LEASE_S)
    taker = held(begin(store, ctx_of(clock, "c1")))
    assert not store.finish(zombie, "succeeded", result_of(ctx_of(clock, "c1"))).stored
    assert store.snapshot(RECORD)["state"] == "in_progress"
    assert store.renew(taker)


def test_a_parked_call_is_taken_up_by_its_own_retry_and_joined_by_others(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    ctx = ctx_of(clock, "c1")
    lease = held(begin(store, ctx))
    assert store.park(lease, hold_s=2.0 + LEASE_S, uncertain=True, ctx=ctx, attempt=2)
    record = store.snapshot(RECORD)
    assert (record["phase"], record["owner"], record["attempt"]) == ("retry_wait", "", "2")
    assert not store.renew(lease)  # parked: nobody runs it until the retry comes

    assert begin(store, ctx_of(clock, "c2")).kind == "joined"
    clock.advance(2.0)
    retry = begin(store, ctx)
    assert held(retry).token > lease.token and retry.uncertain


def test_an_unknown_outcome_is_replayed_without_a_check_and_retaken_with_one(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    lease = held(begin(store, ctx_of(clock, "c1")))
    store.finish(lease, "unknown", result_of(ctx_of(clock, "c1"), "unknown", None))
    blind = begin(store, ctx_of(clock, "c2"))
    assert blind.kind == "replay" and blind.state == "unknown"
    checked = begin(store, ctx_of(clock, "c3"), has_check=True)
    assert held(checked) and checked.uncertain


def test_a_sweep_claims_an_expired_lease_once_and_returns_the_calls_message(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    ctx = ctx_of(clock, "c1")
    held(begin(store, ctx))
    assert store.due() == []
    clock.advance(LEASE_S)
    assert store.due() == [RECORD]

    messages = store.claim(store.due())

    assert messages == [Message("tools.send_email", "tools", {"to": "a@b.c"}, ctx.to_json(), 1)]
    assert store.due() == []  # the claim moved the lease on: no second sweeper publishes it
    record = store.snapshot(RECORD)
    assert record["phase"] == "requeued" and record["owner"] == ""
    assert held(begin(store, ctx)).token > 1  # the published copy takes it up


def test_a_sweep_skips_a_lease_renewed_since_the_index_said_it_was_due(
    store: IdempotencyStore, clock: ManualClock, rdb: redis.Redis, keys: Keys
) -> None:
    lease = held(begin(store, ctx_of(clock, "c1")))
    rdb.zadd(keys.idempotency_leases_of(RECORD), {RECORD: clock.now() - 1})  # a stale index entry
    assert store.claim(store.due()) == []
    assert rdb.zscore(keys.idempotency_leases_of(RECORD), RECORD) == clock.now() + LEASE_S
    assert store.renew(lease)


def test_a_call_past_its_deadline_is_not_published_again_but_stays_uncertain(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    held(begin(store, ctx_of(clock, "c1", deadline_in=3.0)))
    clock.advance(LEASE_S)
    assert store.claim(store.due()) == []
    assert store.due() == []
    later = begin(store, ctx_of(clock, "c2"))  # an agent repeats the call an hour later
    assert held(later) and later.uncertain


def test_a_dead_callers_call_is_handed_to_the_waiter_with_the_most_time_left(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    held(begin(store, ctx_of(clock, "c1", deadline_in=3.0)))
    begin(store, ctx_of(clock, "c2", deadline_in=4.0))
    begin(store, ctx_of(clock, "c3", deadline_in=60.0))
    clock.advance(LEASE_S)

    [message] = store.claim(store.due())

    assert message.call_id == "c3"
    assert store.snapshot(RECORD)["call"] == "c3"
    assert store.waiting(RECORD) == []  # c2's deadline passed too; c3 is now the owner


def test_coalesced_reads_share_a_record_that_vanishes_when_the_call_ends(
    store: IdempotencyStore, clock: ManualClock
) -> None:
    first = held(begin(store, ctx_of(clock, "c1"), mode="coalesce"))
    assert begin(store, ctx_of(clock, "c2"), mode="coalesce").kind == "joined"
    assert store.snapshot(RECORD)["uncertain"] == "0"  # reads are never uncertain
    store.finish(first, "released", result_of(ctx_of(clock, "c1")))
    assert store.snapshot(RECORD) == {}


def test_without_a_clock_the_scripts_use_redis_time(rdb: redis.Redis, keys: Keys) -> None:
    store = IdempotencyStore(rdb, keys, lease_s=LEASE_S)
    ctx = CallContext("c1", "send_email", time.time() + 60, time.time(), "r1")
    before = time.time()
    held(begin(store, ctx))
    lease_until = float(store.snapshot(RECORD)["lease_until"])
    assert before + LEASE_S - 1 < lease_until < time.time() + LEASE_S + 1
    assert store.due() == []


def test_the_lease_keeper_renews_only_leases_held_for_an_interval_and_drops_lost_ones(
    rdb: redis.Redis, keys: Keys
) -> None:
    """One round trip renews every due lease; a call that ends within an interval costs none."""
    clock = ManualClock()
    store = IdempotencyStore(rdb, keys, clock=clock, lease_s=3.0)
    ticks = ManualClock(0.0)
    keeper = LeaseKeeper(store, 1.0, monotonic=ticks.now)
    leases = [_acquired(store, clock, f"k{i}") for i in range(3)]
    keeper.hold(leases[0])
    ticks.advance(0.6)
    keeper.hold(leases[1])
    keeper.hold(leases[2])
    keeper.drop(leases[2])  # its call ended at once

    ticks.advance(0.5)
    clock.advance(2.0)
    assert keeper.renew_due() == []  # only the first was due; it is renewed
    assert float(store.snapshot(leases[0].record)["lease_until"]) == clock.now() + 3.0
    assert float(store.snapshot(leases[1].record)["lease_until"]) == clock.now() + 1.0

    clock.advance(1.5)  # the second's lease ran out: a sweeper hands it on
    assert store.claim(store.due()) != []
    ticks.advance(0.6)
    assert keeper.renew_due() == [leases[1]]
    assert keeper.held() == [leases[0]]


def _acquired(store: IdempotencyStore, clock: ManualClock, record: str) -> Lease:
    ctx = ctx_of(clock, record)
    message = Message("tools.lookup", "tools", {"city": record}, ctx.to_json(), 1)
    return held(
        store.begin(record, args_hash=ARGS, ctx=ctx, mode="lease", has_check=False, message=message)
    )
