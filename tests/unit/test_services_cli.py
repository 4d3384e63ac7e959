"""`toolexec flower` refuses to expose Flower without auth; `embedded serve` is broker-safe."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from toolexec.ops.cli import cli
from toolexec.ops.services_cli import basic_auth, is_loopback, valkey_args
from toolexec.settings import Settings


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_addresses_are_recognised(address: str) -> None:
    assert is_loopback(address)


@pytest.mark.parametrize("address", ["0.0.0.0", "", "::", "10.0.0.5", "flower.example.com"])
def test_wildcard_private_and_named_addresses_are_not_loopback(address: str) -> None:
    assert not is_loopback(address)


def test_basic_auth_needs_both_user_and_password() -> None:
    assert basic_auth(Settings(flower_user="admin", flower_password="s3cret")) == "admin:s3cret"
    assert basic_auth(Settings(flower_user="admin")) is None
    assert basic_auth(Settings(flower_password="s3cret")) is None
    assert basic_auth(Settings(flower_user="admin", flower_password="")) is None


def test_the_flower_password_never_shows_in_the_settings_repr() -> None:
    """Settings are printed in error messages and debug logs; the password must not be."""
    settings = Settings(flower_user="admin", flower_password="s3cret-pw")
    assert "s3cret-pw" not in repr(settings) and "s3cret-pw" not in str(settings.model_dump())


def test_flower_refuses_a_public_address_without_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given no credentials, when asked to listen on 0.0.0.0, then it exits before starting."""
    monkeypatch.delenv("TOOLEXEC_FLOWER_USER", raising=False)
    monkeypatch.delenv("TOOLEXEC_FLOWER_PASSWORD", raising=False)
    result = CliRunner().invoke(cli, ["flower", "--address", "0.0.0.0"])
    assert result.exit_code == 1
    assert "refusing to serve Flower on '0.0.0.0' without authentication" in result.output


def test_flower_refuses_an_address_from_settings_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLEXEC_FLOWER_ADDRESS", "0.0.0.0")
    monkeypatch.setenv("TOOLEXEC_FLOWER_USER", "admin")
    monkeypatch.delenv("TOOLEXEC_FLOWER_PASSWORD", raising=False)
    result = CliRunner().invoke(cli, ["flower"])
    assert result.exit_code == 1 and "TOOLEXEC_FLOWER_PASSWORD" in result.output


def test_embedded_serve_runs_a_broker_safe_valkey(tmp_path: Path) -> None:
    """No eviction (a broker must not drop messages) and an append-only file (restarts)."""
    args = valkey_args(Path("/bin/valkey-server"), 6390, tmp_path, "127.0.0.1")
    pairs = dict(zip(args[1::2], args[2::2], strict=True))
    assert pairs["--maxmemory-policy"] == "noeviction"
    assert pairs["--appendonly"] == "yes"
    assert pairs["--dir"] == str(tmp_path) and pairs["--port"] == "6390"


def test_autoscale_with_the_threads_pool_is_refused_before_anything_starts() -> None:
    """Threads cannot grow: the worker would silently serve one call at a time."""
    result = CliRunner().invoke(cli, ["worker", "--autoscale", "4,1", "--pool", "threads"])
    assert result.exit_code == 1
    assert "--autoscale works with the prefork pool only" in result.output


def test_autoscale_without_a_pool_picks_prefork() -> None:
    from toolexec.ops.cli import _autoscale_pool

    assert _autoscale_pool(None, "4,1") == "prefork"
    assert _autoscale_pool("prefork", "4,1") == "prefork"
    assert _autoscale_pool("gevent", None) == "gevent"
    assert _autoscale_pool(None, None) is None


def test_embedded_serve_defaults_to_a_port_of_its_own_as_the_procfile_does() -> None:
    """6379 is where a system Redis listens; serve would clash with it."""
    from toolexec.ops.services_cli import SERVE_PORT, serve_embedded

    port = next(p for p in serve_embedded.params if p.name == "port")
    assert port.default == SERVE_PORT != 6379
    assert f"VALKEY_PORT:-{SERVE_PORT}" in (Path(__file__).parents[2] / "Procfile").read_text()


@pytest.mark.parametrize("value", ["true", "1", "Yes"])
def test_flower_refuses_an_open_api_without_credentials(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """FLOWER_UNAUTHENTICATED_API on loopback would answer any web page (CORS *): refused,
    naming the way that works (credentials, even on loopback)."""
    monkeypatch.delenv("TOOLEXEC_FLOWER_USER", raising=False)
    monkeypatch.delenv("TOOLEXEC_FLOWER_PASSWORD", raising=False)
    monkeypatch.setenv("FLOWER_UNAUTHENTICATED_API", value)
    result = CliRunner().invoke(cli, ["flower", "--address", "127.0.0.1"])
    assert result.exit_code == 1
    assert "refusing FLOWER_UNAUTHENTICATED_API" in result.output
    assert "curl -u USER:PASSWORD" in result.output



@pytest.mark.parametrize(
    ("given", "bounds"), [("10,3", (10, 3)), ("3,10", (10, 3)), ("5", (5, 0)), (" 4 , 1 ", (4, 1))]
)
def test_autoscale_reads_max_and_min_as_celery_worker_does(
    given: str, bounds: tuple[int, int]
) -> None:
    from toolexec.worker.start import autoscale_bounds

    assert autoscale_bounds(given) == bounds


@pytest.mark.parametrize("given", [",", "4,1,2", "four", "4,-1", "4,"])
def test_an_autoscale_that_is_not_max_min_is_refused_before_anything_starts(given: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "--autoscale", given])

    assert result.exit_code == 2
    assert "--autoscale takes MAX,MIN or MAX" in result.output


def test_a_log_level_celery_does_not_know_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(cli, ["worker", "--loglevel", "LOUD"])

    assert result.exit_code == 2
    assert "'LOUD' is not one of" in result.output
