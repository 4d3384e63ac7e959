"""One contract for every payload store: Redis, a directory and S3 behave the same.

Redis is the suite's real server; S3 is moto's server mode on 127.0.0.1,
started here (boto3 talks HTTP to it as it would to AWS). Expiry is driven by
a ManualClock for the directory and S3, and by a 1 ms Redis TTL for Redis.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from payload_support import FAKE_AWS, free_port, moto_s3

from toolexec.clock import ManualClock
from toolexec.errors import (
    PayloadExpiredError,
    PayloadIntegrityError,
    PayloadMissingError,
    PayloadStoreUnavailableError,
    PayloadUnavailableError,
)
from toolexec.keys import Keys
from toolexec.payloads import (
    FilePayloadStore,
    Offloader,
    PayloadReader,
    PayloadStore,
    RedisPayloadStore,
    open_store,
)
from toolexec.settings import Settings

TTL_S = 60.0


@dataclass
class Harness:
    """A store, the clock it reads, and how to make its TTL run out."""

    store: PayloadStore
    clock: ManualClock
    expire: Callable[[str], None]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 in server mode on a free local port, with fake credentials."""
    with moto_s3() as endpoint:
        yield endpoint


def _s3(endpoint: str, clock: ManualClock, bucket: str) -> PayloadStore:
    settings = Settings(
        payload_store=f"s3://{bucket}/toolexec/payloads",
        payload_s3_endpoint_url=endpoint,
        payload_s3_region="us-east-1",
    )
    store = open_store(settings, "redis://unused", clock)
    store.client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    return store


def _expire_redis(client: redis.Redis, keys: Keys) -> Callable[[str], None]:
    def expire(key: str) -> None:
        for name in (keys.payload(key), keys.payload(key) + ".index"):
            client.pexpire(name, 1)
        while client.exists(keys.payload(key)):
            time.sleep(0.002)

    return expire


@pytest.fixture(params=["redis", "file", "s3"])
def harness(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path, clock: ManualClock
) -> Iterator[Harness]:
    if request.param == "redis":
        keys = Keys(f"payload-test-{os.getpid()}-{time.monotonic_ns()}")
        store = RedisPayloadStore.connect(redis_url, keys)
        raw = redis.Redis.from_url(redis_url)
        yield Harness(store, clock, _expire_redis(raw, keys))
        raw.close()
        return
    if request.param == "file":
        yield Harness(FilePayloadStore(tmp_path / "payloads", clock), clock, _advance(clock))
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"b{time.monotonic_ns()}"
    yield Harness(_s3(endpoint, clock, bucket), clock, _advance(clock))


def _advance(clock: ManualClock) -> Callable[[str], None]:
    return lambda _key: clock.advance(TTL_S + 1)


# -- the store contract -----------------------------------------------------


def test_put_then_get_returns_the_same_bytes(harness: Harness) -> None:
    data = bytes(range(256)) * 1000
    harness.store.put("k1", data, TTL_S)
    assert harness.store.get("k1") == data
    assert harness.store.exists("k1")


def test_get_range_returns_the_bytes_between_start_and_end(harness: Harness) -> None:
    data = b"0123456789" * 10
    harness.store.put("k2", data, TTL_S)
    assert harness.store.get_range("k2", 5, 17) == data[5:17]
    assert harness.store.get_range("k2", 95, 100) == data[95:]
    assert harness.store.get_range("k2", 7, 7) == b""


def test_a_missing_key_is_payload_missing(harness: Harness) -> None:
    with pytest.raises(PayloadMissingError):
        harness.store.get("nothing-here")
    with pytest.raises(PayloadMissingError):
        harness.store.get_range("nothing-here", 0, 10)
    assert not harness.store.exists("nothing-here")


def test_put_replaces_and_delete_forgets(harness: Harness) -> None:
    harness.store.put("k3", b"first", TTL_S)
    harness.store.put("k3", b"second", TTL_S)
    assert harness.store.get("k3") == b"second"
    harness.store.delete("k3")
    harness.store.delete("k3")  # deleting twice is no error
    assert not harness.store.exists("k3")


def test_a_payload_past_its_ttl_cannot_be_read(harness: Harness) -> None:
    harness.store.put("k4", b"soon gone", TTL_S)
    harness.expire("k4")
    with pytest.raises(PayloadUnavailableError):
        harness.store.get("k4")
    assert not harness.store.exists("k4")


def test_an_empty_payload_is_stored_and_read(harness: Harness) -> None:
    harness.store.put("k5", b"", TTL_S)
    assert harness.store.get("k5") == b""
    assert harness.store.exists("k5")


# -- reading references back (Offloader + PayloadReader over each store) -----


def test_a_stored_value_loads_and_pages_back(harness: Harness) -> None:
    text = "".join(f"line {i}\n" for i in range(30_000))
    ref = Offloader(harness.store, harness.clock).put(text, TTL_S)
    reader = PayloadReader(harness.store, harness.clock)

    assert ref.store == harness.store.kind
    assert ref.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert reader.load(ref) == text
    assert reader.read(ref, 29_998, 10).entries == ["line 29998", "line 29999"]
    assert reader.read(ref.key, 12_345, 2).entries == ["line 12345", "line 12346"]


def test_an_expired_reference_says_what_expired_and_what_to_do(harness: Harness) -> None:
    ref = Offloader(harness.store, harness.clock).put(["a"] * 50_000, TTL_S)
    reader = PayloadReader(harness.store, harness.clock)
    harness.expire(ref.key)
    harness.clock.advance(TTL_S + 1)  # the reader's clock is past expires_at too

    with pytest.raises(PayloadExpiredError) as lost:
        reader.load(ref)
    with pytest.raises(PayloadExpiredError):
        reader.read(ref, 0, 5)

    assert ref.key in str(lost.value)
    assert "expired" in str(lost.value) and "Call the tool again" in str(lost.value)


def test_altered_bytes_fail_the_sha256_check(harness: Harness) -> None:
    ref = Offloader(harness.store, harness.clock).put("x" * 100_000, TTL_S)
    harness.store.put(ref.key, b"y" * 100_000, TTL_S)
    with pytest.raises(PayloadIntegrityError, match="sha256"):
        PayloadReader(harness.store, harness.clock).load(ref)


# -- store-specific behaviour -------------------------------------------------


def test_the_file_store_refuses_keys_that_would_leave_its_directory(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = FilePayloadStore(tmp_path, clock)
    with pytest.raises(ValueError, match="not a payload key"):
        store.get("../etc/passwd")


def test_the_file_store_purges_only_expired_payloads(tmp_path: Path, clock: ManualClock) -> None:
    store = FilePayloadStore(tmp_path, clock)
    store.put("old", b"1", 10)
    store.put("new", b"2", 100)
    clock.advance(50)
    assert store.purge_expired() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_an_unwritable_directory_is_store_unavailable(tmp_path: Path, clock: ManualClock) -> None:
    store = FilePayloadStore(tmp_path / "gone", clock)
    (tmp_path / "gone").rmdir()
    (tmp_path / "gone").write_text("a file now")
    with pytest.raises(PayloadStoreUnavailableError, match="cannot write"):
        store.put("k", b"data", 10)


def test_an_s3_endpoint_that_does_not_answer_is_store_unavailable(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        payload_store="s3://bucket/p",
        payload_s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
        payload_s3_region="us-east-1",
    )
    store = open_store(settings, "redis://unused", clock)
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(PayloadStoreUnavailableError, match="cannot reach S3"):
        store.get("k")


@pytest.mark.parametrize("value", ["memcached://x", "file:/relative", ""])
def test_an_unknown_store_setting_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="TOOLEXEC_PAYLOAD_STORE"):
        Settings(payload_store=value)
