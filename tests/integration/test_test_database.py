"""``make test-redis``'s claim of a database: only an empty one, left empty, data never flushed.

Runs against a Valkey of its own (it puts "someone's data" in a database),
never against the server the suite itself uses.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from database_support import CLAIM_KEY, claim_database, release_database
from servers import free_port, valkey_binary

pytestmark = pytest.mark.integration


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [
            valkey_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        end = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError), redis.Redis.from_url(url) as c:
                c.ping()
                break
            assert time.monotonic() < end, "the private Valkey did not start"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def test_a_database_with_data_is_skipped_and_the_claimed_one_left_empty(
    private_server: str,
) -> None:
    """Given data in databases 1 and 2, the run claims 3, and at the end 1 and 2 are intact."""
    base = private_server.rsplit("/", 1)[0]
    for db in (1, 2):
        with redis.Redis.from_url(f"{base}/{db}") as client:
            client.set("someones:data", "precious")
    run = uuid.uuid4().hex

    claimed = claim_database(private_server, run)
    with redis.Redis.from_url(claimed) as client:
        client.set("t-run:key", "written by the tests")
    release_database(claimed, run)

    assert claimed == f"{base}/3"
    for db in (1, 2):
        with redis.Redis.from_url(f"{base}/{db}") as client:
            assert client.keys("*") == [b"someones:data"]
            assert client.get(CLAIM_KEY) is None
    with redis.Redis.from_url(claimed) as client:
        assert client.dbsize() == 0
    with redis.Redis.from_url(f"{base}/0") as client:
        assert client.dbsize() == 0  # nothing written outside the claimed database


def test_a_claim_another_run_holds_is_not_released_by_this_one(private_server: str) -> None:
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    mine = claim_database(private_server, first)
    theirs = claim_database(private_server, second)
    with redis.Redis.from_url(mine) as client:
        client.set("t-first:key", "1")

    release_database(mine, second)  # not the holder: nothing happens

    assert mine != theirs
    with redis.Redis.from_url(mine) as client:
        assert client.get("t-first:key") == b"1"
