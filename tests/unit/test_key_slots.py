"""Every Lua script's keys fall in one Redis Cluster slot; fleet-wide indexes spread over many.

A cluster refuses a script whose keys span slots (``make test-cluster`` runs the
stores against a real one); this checks the key builders themselves, for any name.
"""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from toolexec.keys import SHARD_BUCKETS, Keys, bucket_of

NAMES = ["a", "order:42", "http_request@api.example.com", "{braces}", "x" * 200]


def _slots(*keys: str) -> set[int]:
    return {key_slot(k.encode()) for k in keys}


@pytest.mark.parametrize("name", NAMES)
def test_the_keys_one_script_touches_share_a_slot(name: str) -> None:
    keys = Keys("p")
    idempotency = (
        keys.idempotency(name),
        keys.idempotency_waiters(name),
        keys.idempotency_leases_of(name),
        keys.idempotency_tokens(name),
    )
    assert len(_slots(*idempotency)) == 1
    assert len(_slots(keys.breaker(name), keys.breaker_probes(name))) == 1
    assert len(_slots(keys.budget(name), keys.budget_retries(name))) == 1
    assert len(_slots(keys.catalog(), keys.workers(), keys.queue_workers(name))) == 1


def test_fleet_wide_indexes_spread_over_every_shard_of_a_three_master_cluster() -> None:
    """redis-cli --cluster create splits the 16 384 slots into three equal ranges."""
    keys = Keys("p")
    thirds = [(0, 5461), (5461, 10923), (10923, 16384)]
    for build in (keys.idempotency_leases, keys.in_flight, keys.stats):
        slots = [key_slot(build(b).encode()) for b in range(SHARD_BUCKETS)]
        per_shard = [sum(lo <= s < hi for s in slots) for lo, hi in thirds]
        assert len(set(slots)) == SHARD_BUCKETS
        assert min(per_shard) >= 3, per_shard


def test_a_name_keeps_its_bucket_across_processes() -> None:
    """crc32, not hash(): a record indexed by one worker is found by another's sweeper."""
    assert bucket_of("order:42") == 11  # zlib.crc32(b"order:42") % 16
    assert {bucket_of(str(i)) for i in range(1000)} == set(range(SHARD_BUCKETS))
