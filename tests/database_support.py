"""Which database of a shared server a test run may use (``make test-redis``).

A shared server may hold someone's data in any database, so a run takes only
a database it finds empty, marks it with a claim key inside it (no key is
written anywhere else), and leaves it empty again at the end.
"""

from __future__ import annotations

import contextlib

import redis

__all__ = ["CLAIM_KEY", "claim_database", "release_database"]

DB_LOCK_TTL_S = 3600  # a crashed run frees its database within the hour
#: The claim lives in the claimed database itself, so a run writes nothing anywhere else.
CLAIM_KEY = "toolexec-tests:claim"


def _database_url(base_url: str, db: int) -> str:
    url = base_url.rsplit("/", 1)[0] if base_url.count("/") > 2 else base_url
    return f"{url}/{db}"


def claim_database(base_url: str, run: str) -> str:
    """A database of the shared server that was empty and is now this run's alone.

    The claim is a key of its own written with NX into the database; if that
    key is not the only one there, someone else's data is in it and the claim is
    taken back at once. Only a database this run found empty is ever cleared.
    """
    for db in range(1, 16):
        url = _database_url(base_url, db)
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            if not client.set(CLAIM_KEY, run, nx=True, ex=DB_LOCK_TTL_S):
                continue  # another run holds it
            if client.dbsize() == 1:
                return url
            client.delete(CLAIM_KEY)  # not empty: not ours to use
    raise RuntimeError(
        f"no empty database among 1-15 of {base_url}: the tests use only an empty one, "
        "and never clear a database that holds data"
    )


def release_database(url: str, run: str) -> None:
    """Leave the claimed database as it was found: empty. Only while the claim is still ours."""
    with contextlib.closing(redis.Redis.from_url(url)) as client:
        if client.get(CLAIM_KEY) == run.encode():
            client.flushdb()  # everything in it was written by this run
