"""``toolexec faults``: set, list and clear fault configs; refused unless enabled where it runs."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

from toolexec.connection import redis_client
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.layers.faults import FaultConfig, FaultStore
from toolexec.ops.cli import cli


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(redis_url: str, prefix: str) -> FaultStore:
    return FaultStore(redis_client(redis_url), Keys(prefix))


def invoke(redis_url: str, prefix: str, *args: str, enabled: bool = True) -> tuple[int, str]:
    env = {
        "TOOLEXEC_REDIS_URL": redis_url,
        "TOOLEXEC_KEY_PREFIX": prefix,
        "TOOLEXEC_FAULTS_ENABLED": "true" if enabled else "false",
    }
    done = CliRunner().invoke(cli, ["faults", *args], env=env)
    return done.exit_code, done.output


def test_set_stores_the_config_the_workers_read(
    redis_url: str, prefix: str, store: FaultStore
) -> None:
    code, out = invoke(
        redis_url,
        prefix,
        "set",
        "search",
        "--rate",
        "0.3",
        "--error",
        "unavailable",
        "--latency",
        "0.2",
        "--seed",
        "7",
    )
    assert code == 0, out
    expected = FaultConfig(rate=0.3, error=ErrorType.UNAVAILABLE, latency=0.2, seed=7)
    assert store.all() == {"search": expected}
    assert json.loads(out)["search"]["seed"] == 7


def test_set_is_refused_unless_faults_are_enabled_here(
    redis_url: str, prefix: str, store: FaultStore
) -> None:
    code, out = invoke(redis_url, prefix, "set", "search", "--rate", "1", enabled=False)
    assert code == 1
    assert "TOOLEXEC_FAULTS_ENABLED=true" in out and "never production" in out
    assert store.all() == {}


def test_a_replaced_outcome_is_given_as_json(
    redis_url: str, prefix: str, store: FaultStore
) -> None:
    code, out = invoke(redis_url, prefix, "set", "search", "--rate", "1", "--outcome", '{"x": 1}')
    assert code == 0, out
    assert store.all()["search"].outcome == {"x": 1}


def test_a_config_that_injects_nothing_is_an_error_not_a_traceback(
    redis_url: str, prefix: str
) -> None:
    code, out = invoke(redis_url, prefix, "set", "search")
    assert code == 1 and "injects nothing" in out


def test_listing_shows_every_config(redis_url: str, prefix: str, store: FaultStore) -> None:
    store.set("a", FaultConfig(rate=0.1))
    store.set("b", FaultConfig(latency=1.0))
    code, out = invoke(redis_url, prefix)
    assert code == 0
    assert sorted(json.loads(out)) == ["a", "b"]


def test_clear_removes_one_or_all(redis_url: str, prefix: str, store: FaultStore) -> None:
    store.set("a", FaultConfig(rate=0.1))
    store.set("b", FaultConfig(rate=0.1))
    assert invoke(redis_url, prefix, "clear", "a") == (0, "cleared: a\n")
    assert list(store.all()) == ["b"]
    assert invoke(redis_url, prefix, "clear", enabled=False) == (0, "cleared: b\n")
    assert store.all() == {}
