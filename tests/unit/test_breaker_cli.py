"""``toolexec breakers trip/reset`` refuse names no tool or breaker uses, unless forced."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from toolexec.breaker import CircuitBreaker
from toolexec.breaker.cli import breakers
from toolexec.keys import Keys


def _env(redis_url: str, keys: Keys) -> dict[str, str]:
    return {"TOOLEXEC_REDIS_URL": redis_url, "TOOLEXEC_KEY_PREFIX": keys.prefix}


def _publish(rdb: redis.Redis, keys: Keys, *tools: str) -> None:
    """Catalog entries as a worker would publish them (only the names matter here)."""
    rdb.hset(keys.catalog(), mapping={tool: json.dumps({"policy": {}}) for tool in tools})


def test_trip_of_an_unknown_name_fails_lists_the_known_ones_and_creates_nothing(
    redis_url: str, keys: Keys, rdb: redis.Redis
) -> None:
    """Given tools get_weather and query_order, a typo is refused and no phantom appears."""
    _publish(rdb, keys, "get_weather", "query_order")
    runner = CliRunner()

    tripped = runner.invoke(breakers, ["trip", "nosuchbreaker"], env=_env(redis_url, keys))
    reset = runner.invoke(breakers, ["reset", "get_wether"], env=_env(redis_url, keys))

    for result, name in ((tripped, "nosuchbreaker"), (reset, "get_wether")):
        assert result.exit_code == 1, result.output
        assert f"no tool or breaker is named {name!r}" in result.output
        assert "known: get_weather, query_order" in result.output
        assert "--force" in result.output
    assert CircuitBreaker(rdb, keys).names() == []


def test_known_tools_and_seen_host_breakers_are_accepted(
    redis_url: str, keys: Keys, rdb: redis.Redis
) -> None:
    """Given a published tool, and a host breaker some call created, both can be switched."""
    _publish(rdb, keys, "get_weather")
    runner = CliRunner()
    env = _env(redis_url, keys)

    assert runner.invoke(breakers, ["trip", "get_weather", "--json"], env=env).exit_code == 0
    forced = runner.invoke(breakers, ["trip", "http_request@api.example.com", "--force"], env=env)
    assert forced.exit_code == 0, forced.output
    # once used, the host breaker is known without --force
    reset = runner.invoke(breakers, ["reset", "http_request@api.example.com", "--json"], env=env)
    assert reset.exit_code == 0, reset.output
    assert json.loads(reset.output)[0]["state"] == "closed"


def test_breakers_list_is_the_same_listing_as_the_bare_command(
    redis_url: str, keys: Keys, rdb: redis.Redis
) -> None:
    _publish(rdb, keys, "get_weather")
    runner = CliRunner()
    env = _env(redis_url, keys)
    assert runner.invoke(breakers, ["trip", "get_weather"], env=env).exit_code == 0

    bare = runner.invoke(breakers, ["--json"], env=env)
    listed = runner.invoke(breakers, ["list", "--json"], env=env)
    outer = runner.invoke(breakers, ["--json", "list"], env=env)

    assert listed.exit_code == 0 == outer.exit_code, listed.output
    names = [view["name"] for view in json.loads(listed.output)]
    assert names == ["get_weather"] == [v["name"] for v in json.loads(bare.output)]
    assert [v["state"] for v in json.loads(outer.output)] == ["open"]  # JSON, from --json first
