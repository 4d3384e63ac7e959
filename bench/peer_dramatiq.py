"""The same no-op on Dramatiq (extra ``[bench]``), for ``bench/overhead.py --peers``.

As a user writes it: a Redis broker and the Redis results backend, a worker
started as ``dramatiq peer_dramatiq --processes 1 --threads 8``. The URL comes
from ``PEER_REDIS_URL`` so the peer has a server of its own.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0")
broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=RedisBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def noop() -> None:
    """Does nothing: a call's whole round trip is overhead."""
