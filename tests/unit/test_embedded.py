"""The embedded Valkey: started once per data directory, found again, stopped cleanly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from toolexec.embedded import embedded_status, ensure_embedded, stop_embedded


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


def test_two_data_folders_are_two_servers_with_two_catalogs(tmp_path: Path) -> None:
    """Two projects on one host: each has its own server, so neither sees the other's
    catalog or state; the start is announced once per server, in one line."""
    from toolexec.keys import Keys
    from toolexec.stores import catalog

    shop, blog = tmp_path / "shop", tmp_path / "blog"
    said: list[str] = []
    try:
        first = ensure_embedded(shop, notify=said.append)
        again = ensure_embedded(shop, notify=said.append)
        other = ensure_embedded(blog, notify=said.append)
        keys = Keys("toolexec")  # the default prefix in both
        with contextlib.closing(redis.Redis.from_url(first.url, decode_responses=True)) as c:
            c.hset(keys.catalog(), "place_order", '{"policy": {}}')
        with contextlib.closing(redis.Redis.from_url(other.url, decode_responses=True)) as c:
            assert catalog.read(c, keys) == {}
        with contextlib.closing(redis.Redis.from_url(first.url, decode_responses=True)) as c:
            assert list(catalog.read(c, keys)) == ["place_order"]
    finally:
        stop_embedded(shop)
        stop_embedded(blog)

    assert first.url == again.url != other.url
    assert len(said) == 2 and all("\n" not in line for line in said)
    assert first.url in said[0] and str(shop / "valkey") in said[0]
    assert "toolexec embedded status" in said[0] and "toolexec embedded stop" in said[0]


def test_status_finds_a_running_server_and_never_starts_one(data_dir: Path) -> None:
    assert embedded_status(data_dir) is None
    assert not (data_dir / "valkey" / "valkey.pid").exists()
    server = ensure_embedded(data_dir, notify=None)
    found = embedded_status(data_dir)
    assert found is not None and (found.url, found.pid) == (server.url, server.pid)


def test_the_cli_announces_the_start_once_and_status_and_stop_find_it(data_dir: Path) -> None:
    from click.testing import CliRunner

    from toolexec.ops.cli import cli

    env = {"TOOLEXEC_DATA_DIR": str(data_dir), "TOOLEXEC_REDIS_URL": ""}
    runner = CliRunner()
    first = runner.invoke(cli, ["embedded", "start"], env=env)
    second = runner.invoke(cli, ["embedded", "start"], env=env)
    status = runner.invoke(cli, ["embedded", "status"], env=env)
    stop = runner.invoke(cli, ["embedded", "stop"], env=env)
    after = runner.invoke(cli, ["embedded", "status"], env=env)

    assert first.stdout.strip() == second.stdout.strip()
    assert first.stderr.count("started an embedded Valkey server") == 1
    assert second.stderr == ""
    assert status.exit_code == 0 and first.stdout.strip() in status.stdout
    assert stop.stdout.strip() == "stopped"
    assert after.exit_code == 1 and "no embedded server runs for this project" in after.stdout
