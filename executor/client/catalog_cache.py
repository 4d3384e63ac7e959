"""The catalog as a client last read it: validation and routing need no Redis read per call.

Re-read after ``TOOLEXEC_CATALOG_CACHE_S``, and at once when a call names a tool
the cached copy does not know (a worker with it may have started just now).
"""

from __future__ import annotations

import threading
import time

import redis

from toolexec.connection import unavailable
from toolexec.keys import Keys
from toolexec.stores import catalog

__all__ = ["CatalogCache"]


class CatalogCache:
    """One client's copy of the published catalog; safe to share between threads."""

    def __init__(self, client: redis.Redis, keys: Keys, url: str, ttl_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.url = url
        self.ttl_s = ttl_s
        self._catalog: catalog.Catalog = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def get(self, refresh: bool = False) -> catalog.Catalog:
        """Every tool the workers have published: description, schema, policy."""
        with self._lock:
            fresh = time.monotonic() - self._read_at < self.ttl_s
            if refresh or not fresh or not self._catalog:
                try:
                    self._catalog = catalog.read(self.redis, self.keys)
                except redis.RedisError as exc:
                    raise unavailable(self.url, exc) from exc
                self._read_at = time.monotonic()
            return self._catalog

    def entry(self, tool: str) -> catalog.CatalogEntry | None:
        """``tool``'s entry, re-reading the catalog once if the cached copy lacks it."""
        found = self.get().get(tool)
        return found if found is not None else self.get(refresh=True).get(tool)
