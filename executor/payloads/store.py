"""The narrow interface every payload store offers, and the choice among them.

A store keeps opaque bytes under a key for a time to live. Callers (the
worker's layer, the client) use only these five operations, so Redis, a
directory and S3 swap by one setting, ``TOOLEXEC_PAYLOAD_STORE``:

- ``redis`` (default): toolexec's own Redis; expiry is Redis's own TTL.
- ``file:///path``: a directory, for one host or a volume shared by workers
  and clients; a file's modification time is its expiry.
- ``s3://bucket/prefix``: S3 or any S3-compatible service (MinIO, moto),
  with ``TOOLEXEC_PAYLOAD_S3_ENDPOINT_URL``; the expiry is object metadata.

A store that cannot find a key raises :class:`PayloadMissingError`; one that
cannot be reached raises :class:`PayloadStoreUnavailableError`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

from toolexec.clock import Clock
from toolexec.errors import ConfigurationError, UsageError
from toolexec.keys import Keys
from toolexec.settings import Settings

if TYPE_CHECKING:
    import redis

__all__ = ["KEY_PATTERN", "PayloadStore", "check_key", "open_store"]

#: What a payload key may be: an id the offloader made (hex) and its ``.index``. A
#: model can name a key (``read_payload``), so it must never be a path (no '/'),
#: a hidden file, another Redis key's tail (no ':'), or end in a newline, which
#: ``$`` would let through: hence ``fullmatch``.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,200}")


def check_key(key: str) -> str:
    """``key`` when it is a payload key; :class:`UsageError` otherwise."""
    if not isinstance(key, str) or KEY_PATTERN.fullmatch(key) is None:
        raise UsageError(f"{key!r:.80} is not a payload key (letters, digits, '.', '_', '-')")
    return key


class PayloadStore(Protocol):
    """Bytes under keys, each for a time to live."""

    #: The kind of store, written into every reference: redis, file or s3.
    kind: str

    def put(self, key: str, data: bytes, ttl_s: float) -> None:
        """Store ``data`` under ``key`` until ``ttl_s`` seconds from now."""
        ...

    def get(self, key: str) -> bytes:
        """All of the bytes under ``key``."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` (inclusive) to ``end`` (exclusive) under ``key``."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Forget ``key``; a key that is already gone is no error."""
        ...


def open_store(
    settings: Settings, redis_url: str, clock: Clock, *, client: redis.Redis | None = None
) -> PayloadStore:
    """The store ``settings.payload_store`` names; the Redis one lives at ``redis_url``.

    A worker passes its one ``client``, so the Redis store adds no pool to the
    process; a client process without one gets a client of the store's own.
    """
    where = settings.payload_store
    if where == "redis":
        from toolexec.payloads.redis_store import RedisPayloadStore

        keys = Keys(settings.key_prefix)
        if client is not None:
            return RedisPayloadStore(client, keys)
        return RedisPayloadStore.connect(redis_url, keys)
    if where.startswith("file://"):
        from toolexec.payloads.file_store import FilePayloadStore

        return FilePayloadStore(where.removeprefix("file://"), clock)
    if where.startswith("s3://"):
        from toolexec.payloads.s3_store import S3PayloadStore

        bucket, _, prefix = where.removeprefix("s3://").partition("/")
        return S3PayloadStore.connect(
            bucket,
            prefix,
            endpoint_url=settings.payload_s3_endpoint_url,
            region=settings.payload_s3_region,
            clock=clock,
        )
    raise ConfigurationError(f"unknown payload store {where!r}")
