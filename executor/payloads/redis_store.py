"""Payloads in toolexec's own Redis: nothing more to run, expiry by Redis itself.

Large values cost Redis memory until their TTL passes (``INFO memory`` shows
it), which is why the TTL is short by default and the other stores exist.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import redis
from redis.client import NEVER_DECODE

from toolexec.connection import redis_client
from toolexec.errors import PayloadMissingError, PayloadStoreUnavailableError
from toolexec.keys import Keys
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = ["RedisPayloadStore"]

#: Read a reply as the bytes Redis sent, whatever the client's ``decode_responses``.
_RAW = {NEVER_DECODE: True}


class RedisPayloadStore:
    """A :class:`~toolexec.payloads.store.PayloadStore` on Redis strings.

    ``client`` may be any toolexec client, decoding or not: reads ask Redis's
    reply parser not to decode (``NEVER_DECODE``), because payloads are bytes and
    decoding 10 MB to ``str`` only to encode it again wastes time. So a worker
    hands in its one client (``toolexec.tasks.runtime``) and opens no pool of its own.
    """

    kind = "redis"

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    @classmethod
    def connect(cls, url: str, keys: Keys) -> RedisPayloadStore:
        client = redis_client(url, decode_responses=False, socket_timeout=5.0)
        return cls(client, keys)

    def put(self, key: str, data: bytes, ttl_s: float) -> None:
        with _reachable():
            self.client.set(self.keys.payload(key), data, px=max(1, math.ceil(ttl_s * 1000)))

    def get(self, key: str) -> bytes:
        name = self.keys.payload(key)
        with _reachable():
            data = self.client.execute_command("GET", name, **_RAW)  # type: ignore[no-untyped-call]
        if data is None:
            raise _missing(name)
        return data if isinstance(data, bytes) else str(data).encode()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        name = self.keys.payload(key)
        with _reachable():
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(name)
            pipe.execute_command("GETRANGE", name, start, max(start, end) - 1, **_RAW)  # type: ignore[no-untyped-call]
            found, data = pipe.execute()
        if not found:
            raise _missing(name)
        return bytes(data) if end > start else b""

    def exists(self, key: str) -> bool:
        with _reachable():
            return bool(self.client.exists(self.keys.payload(key)))

    def delete(self, key: str) -> None:
        with _reachable():
            self.client.delete(self.keys.payload(key))


@contextlib.contextmanager
def _reachable() -> Iterator[None]:
    """Turns a Redis connection failure into :class:`PayloadStoreUnavailableError`."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise PayloadStoreUnavailableError(
            f"the Redis payload store does not answer ({type(exc).__name__}: {exc})"
        ) from exc


def _missing(name: str) -> PayloadMissingError:
    return PayloadMissingError(f"Redis has no key {name!r}")
