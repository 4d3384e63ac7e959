"""Issue 18, item 9: read_payload and the file store under a hostile directory or key.

Each test plants what an attacker with write access to the payload directory,
or a model choosing the key of ``read_payload``, could plant, and shows that
the read refuses rather than returning, following or deleting something.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

import pytest

from toolexec.clock import ManualClock
from toolexec.errors import (
    PayloadExpiredError,
    PayloadIntegrityError,
    PayloadMissingError,
    PayloadUnavailableError,
    UsageError,
)
from toolexec.payloads import FilePayloadStore, Offloader, PayloadReader
from toolexec.payloads.encoding import Index, segment_bounds, segment_digest
from toolexec.payloads.reader import INDEX_SUFFIX
from toolexec.payloads.store import check_key

TTL_S = 600.0
TEXT = "".join(f"line {i:06d} of a long log\n" for i in range(20_000))  # ~560 KB, many marks


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> FilePayloadStore:
    return FilePayloadStore(tmp_path / "payloads", clock)


def _flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] = ord("X") if data[at] != ord("X") else ord("Y")
    mtime = path.stat().st_mtime
    path.write_bytes(bytes(data))
    os.utime(path, (mtime, mtime))  # keep its expiry


def test_a_page_of_a_changed_body_is_refused(store: FilePayloadStore, clock: ManualClock) -> None:
    """Before: a page read returned whatever bytes the store held; only load() hashed."""
    ref = Offloader(store, clock).put(TEXT, TTL_S)
    reader = PayloadReader(store, clock)
    assert reader.read(ref, 15_000, 3).entries[0] == "line 015000 of a long log"

    _flip_byte(store.directory / ref.key, len(TEXT.encode()) * 3 // 4)

    with pytest.raises(PayloadIntegrityError):
        reader.read(ref, 15_000, 3)
    with pytest.raises(PayloadIntegrityError):
        reader.read(ref.key, 15_000, 3)  # the bare key a model passes: checked by the index
    assert reader.read(ref, 0, 2).entries[0] == "line 000000 of a long log"  # untouched part


def test_a_body_and_index_replaced_together_are_refused_with_the_reference(
    store: FilePayloadStore, clock: ManualClock
) -> None:
    """An attacker who rewrites the index to match a forged body still fails the reference."""
    ref = Offloader(store, clock).put(TEXT, TTL_S)
    forged = TEXT.replace("long log", "LONG LOG").encode()
    index = Index.from_bytes((store.directory / (ref.key + INDEX_SUFFIX)).read_bytes())
    bounds = segment_bounds(index.marks, len(forged))
    forged_index = Index(
        unit=index.unit,
        count=index.count,
        size_bytes=len(forged),
        content_type=index.content_type,
        sha256=ref.sha256,  # claims to be the original
        marks=index.marks,
        segments=[segment_digest(forged[a:b]) for a, b in itertools.pairwise(bounds)],
    )
    store.put(ref.key, forged, TTL_S)
    store.put(ref.key + INDEX_SUFFIX, forged_index.to_bytes(), TTL_S)

    with pytest.raises(PayloadIntegrityError, match="index"):
        PayloadReader(store, clock).read(ref, 100, 5)


def test_an_index_of_another_value_is_refused(store: FilePayloadStore, clock: ManualClock) -> None:
    first = Offloader(store, clock).put(TEXT, TTL_S)
    second = Offloader(store, clock).put(TEXT.upper(), TTL_S)
    other = (store.directory / (second.key + INDEX_SUFFIX)).read_bytes()
    store.put(first.key + INDEX_SUFFIX, other, TTL_S)

    with pytest.raises(PayloadIntegrityError):
        PayloadReader(store, clock).read(first, 0, 5)


def test_a_symbolic_link_in_the_directory_is_not_followed(
    store: FilePayloadStore, clock: ManualClock, tmp_path: Path
) -> None:
    """Before: a link named like a payload read any file the process could read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CANARY\n")
    os.utime(secret, (clock.now() + TTL_S, clock.now() + TTL_S))  # looks unexpired
    link = store.directory / ("a" * 32)
    link.symlink_to(secret)
    index_link = store.directory / ("a" * 32 + INDEX_SUFFIX)
    index_link.symlink_to(secret)

    with pytest.raises(PayloadMissingError, match="symbolic link"):
        store.get(link.name)
    with pytest.raises(PayloadUnavailableError):
        PayloadReader(store, clock).read(link.name)
    assert not store.exists(link.name)


def test_an_expired_read_deletes_nothing(store: FilePayloadStore, clock: ManualClock) -> None:
    """Before: fetching any expired file deleted it, whoever had put it there."""
    victim = store.directory / "operator-notes.txt"
    victim.write_text("keep me")
    os.utime(victim, (clock.now() - 10, clock.now() - 10))
    ref = Offloader(store, clock).put(TEXT, TTL_S)
    clock.advance(TTL_S + 1)

    with pytest.raises(PayloadExpiredError):
        store.get(victim.name)
    with pytest.raises(PayloadExpiredError):
        PayloadReader(store, clock).load(ref)

    assert victim.read_text() == "keep me"
    assert (store.directory / ref.key).exists()


def test_purging_removes_only_expired_payload_files_never_through_a_link(
    store: FilePayloadStore, clock: ManualClock, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not a payload")
    os.utime(outside, (clock.now() - 10, clock.now() - 10))
    (store.directory / ("b" * 32)).symlink_to(outside)
    ref = Offloader(store, clock).put(TEXT, TTL_S)
    clock.advance(TTL_S + 1)

    assert store.purge_expired() == 2  # the body and its index
    assert outside.read_text() == "not a payload"
    assert not (store.directory / ref.key).exists()


@pytest.mark.parametrize(
    "key", ["abc\n", "abc\r\n", "../etc/passwd", ".hidden", "a/b", "x:y", "", "a" * 300]
)
def test_a_key_that_is_not_a_payload_key_is_refused(
    store: FilePayloadStore, clock: ManualClock, key: str
) -> None:
    """Before: ``^...$`` with ``match`` let a trailing newline through."""
    with pytest.raises(UsageError):
        check_key(key)
    with pytest.raises(UsageError):
        store.get(key)
    with pytest.raises(UsageError):
        PayloadReader(store, clock).read(key)


def test_a_pre_existing_reference_without_page_digests_is_still_verified(
    store: FilePayloadStore, clock: ManualClock
) -> None:
    """An index written before pages were verified: the page comes from the checked body."""
    ref = Offloader(store, clock).put(TEXT, TTL_S)
    index_path = store.directory / (ref.key + INDEX_SUFFIX)
    fields = json.loads(index_path.read_bytes())
    del fields["segments"]
    store.put(ref.key + INDEX_SUFFIX, json.dumps(fields).encode(), TTL_S)
    legacy = ref.model_copy(update={"index_sha256": None})
    reader = PayloadReader(store, clock)
    assert reader.read(legacy, 10, 1).entries == ["line 000010 of a long log"]

    _flip_byte(store.directory / ref.key, 5)

    with pytest.raises(PayloadIntegrityError):
        reader.read(legacy, 10, 1)
    assert hashlib.sha256(TEXT.encode()).hexdigest() == ref.sha256
