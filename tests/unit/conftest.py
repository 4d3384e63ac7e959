"""Fixtures of the unit tests: a private tool registry and a clock that never moves by itself.

Unit tests need no worker and no sleep: tools go into a fresh
:class:`Registry` so that nothing leaks into the default one the worker
serves, and time is a :class:`ManualClock` the test advances by hand. Tests of
Lua scripts run on the session's real Redis, each under a key prefix of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from counting_support import Counted

from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.registry import Registry


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's real Redis, pooled widely enough for threaded tests."""
    client = redis_client(redis_url, max_connections=64)
    yield client
    client.close()


@pytest.fixture
def keys() -> Keys:
    """A key prefix of its own per test, so no state leaks between tests."""
    return Keys(f"t-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def counted(redis_url: str, rdb: redis.Redis) -> Counted:
    name = f"counted-{uuid.uuid4().hex[:10]}"
    return Counted(f"{redis_url}{'&' if '?' in redis_url else '?'}client_name={name}", name, rdb)
