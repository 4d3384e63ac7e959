"""The embedded Valkey: started once per data directory, found again, stopped cleanly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from toolexec.embedded import ensure_embedded, stop_embedded


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory whose server, if any, is stopped even when a test fails."""
    yield tmp_path
    stop_embedded(tmp_path)


def _config(url: str, name: str) -> str:
    client = redis.Redis.from_url(url, decode_responses=True)
    with contextlib.closing(client):
        value: dict[str, str] = client.config_get(name)  # type: ignore[assignment]
        return value[name]


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    with contextlib.closing(client):
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False


def test_a_second_ensure_finds_the_server_the_first_started(data_dir: Path) -> None:
    first = ensure_embedded(data_dir)
    second = ensure_embedded(data_dir)
    assert first.started_here and not second.started_here
    assert (second.url, second.pid) == (first.url, first.pid)
    assert _answers(first.url)


def test_the_server_never_evicts_keys(data_dir: Path) -> None:
    """A broker that drops messages to free memory loses calls silently."""
    server = ensure_embedded(data_dir)
    assert _config(server.url, "maxmemory-policy") == "noeviction"


def test_stop_ends_the_server_and_the_next_ensure_starts_a_fresh_one(data_dir: Path) -> None:
    old = ensure_embedded(data_dir)
    assert stop_embedded(data_dir) is True
    assert not _answers(old.url)
    fresh = ensure_embedded(data_dir)
    assert fresh.started_here
    assert fresh.pid != old.pid
    assert _answers(fresh.url)


def test_stop_without_a_server_says_so(data_dir: Path) -> None:
    assert stop_embedded(data_dir) is False


def test_a_stale_url_file_is_not_trusted(data_dir: Path) -> None:
    """After a crash the URL file may name a dead port: a new server is started instead."""
    url_file = data_dir / "valkey" / "url"
    url_file.parent.mkdir(parents=True)
    url_file.write_text("redis://127.0.0.1:1/0")
    server = ensure_embedded(data_dir)
    assert server.started_here and server.url != "redis://127.0.0.1:1/0"
    assert url_file.read_text() == server.url
