"""Settings come from ``TOOLEXEC_*`` variables when built, are frozen, and refuse nonsense."""

from __future__ import annotations

import os
from pathlib import Path

import pydantic
import pytest

from toolexec.settings import Settings, project_data_dir, project_root


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Settings of the machine running the tests must not leak into them."""
    for name in list(os.environ):
        if name.startswith("TOOLEXEC_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_need_no_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("XDG_DATA_HOME", "/srv/data")
    settings = Settings.from_env()
    assert settings.redis_url is None and settings.broker_url is None
    assert settings.tools == []
    assert settings.key_prefix == "toolexec"
    assert settings.data_dir.parent == Path("/srv/data/toolexec/projects")
    assert settings.data_dir == Settings.from_env().data_dir  # the same project, the same one


def test_the_default_data_dir_is_one_per_project(tmp_path: Path) -> None:
    """Two checkouts get two folders; a subfolder of one belongs to it."""
    for name in ("shop", "blog"):
        (tmp_path / name / "src").mkdir(parents=True)
        (tmp_path / name / "pyproject.toml").write_text("")
    shop, blog = (project_root(tmp_path / n / "src") for n in ("shop", "blog"))
    assert (shop, blog) == (tmp_path / "shop", tmp_path / "blog")
    base = Path("/srv/data")
    shop_dir, blog_dir = project_data_dir(base, shop), project_data_dir(base, blog)
    assert shop_dir != blog_dir and shop_dir.name.startswith("shop-")
    assert project_data_dir(base, shop) == shop_dir  # stable
    bare = tmp_path / "loose"
    bare.mkdir()
    assert project_root(bare) in (bare, *bare.parents)


def test_variables_are_read_when_settings_are_built_not_at_import(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("TOOLEXEC_REDIS_URL", "redis://cache:6379/2")
    clean_env.setenv("TOOLEXEC_DEFAULT_TIMEOUT", "12.5")
    clean_env.setenv("TOOLEXEC_WORKER_POOL", "prefork")
    clean_env.setenv("TOOLEXEC_TASK_EVENTS", "false")
    settings = Settings.from_env()
    assert settings.redis_url == "redis://cache:6379/2"
    assert settings.default_timeout == 12.5
    assert settings.worker_pool == "prefork"
    assert settings.task_events is False


@pytest.mark.parametrize(
    ("raw", "modules"),
    [
        ("myapp.tools", ["myapp.tools"]),
        ("myapp.tools,other.tools", ["myapp.tools", "other.tools"]),
        (" a.b , c.d ,, ", ["a.b", "c.d"]),
        ("", []),
    ],
)
def test_tools_is_a_comma_separated_list_of_modules(
    clean_env: pytest.MonkeyPatch, raw: str, modules: list[str]
) -> None:
    clean_env.setenv("TOOLEXEC_TOOLS", raw)
    assert Settings.from_env().tools == modules


def test_explicit_overrides_win_over_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLEXEC_KEY_PREFIX", "from-env")
    clean_env.setenv("TOOLEXEC_TOOLS", "a,b")
    settings = Settings.from_env(key_prefix="explicit", tools=["c"])
    assert settings.key_prefix == "explicit"
    assert settings.tools == ["c"]


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(pydantic.ValidationError):
        settings.key_prefix = "other"


@pytest.mark.parametrize("max_timeout", [1.0, 60.0, 900.0, 3600.5])
def test_the_visibility_timeout_outlasts_the_longest_call(max_timeout: float) -> None:
    """A message held no longer than a call may live must never be redelivered."""
    visibility = Settings(max_timeout=max_timeout).visibility_timeout
    assert isinstance(visibility, int)
    assert visibility > max_timeout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TOOLEXEC_DEFAULT_TIMEOUT", "0"),
        ("TOOLEXEC_DEFAULT_TIMEOUT", "soon"),
        ("TOOLEXEC_MAX_TIMEOUT", "-5"),
        ("TOOLEXEC_REPLY_GRACE", "-1"),
        ("TOOLEXEC_WORKER_POOL", "fibers"),
        ("TOOLEXEC_WORKER_CONCURRENCY", "0"),
        ("TOOLEXEC_WORKER_CONCURRENCY", "many"),
        ("TOOLEXEC_WORKER_PROCESSES", "0"),
        ("TOOLEXEC_WORKER_PROCESSES", "513"),
        ("TOOLEXEC_MAX_ARGUMENT_BYTES", "-1"),
        ("TOOLEXEC_CATALOG_CACHE_S", "-0.5"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)
    field = variable.removeprefix("TOOLEXEC_").lower()
    with pytest.raises(pydantic.ValidationError, match=field):
        Settings.from_env()


def test_a_cluster_needs_a_broker_of_its_own(clean_env: pytest.MonkeyPatch) -> None:
    """kombu cannot use a Redis Cluster: refused at start, not at the first publish."""
    clean_env.setenv("TOOLEXEC_REDIS_URL", "redis+cluster://127.0.0.1:7000")
    with pytest.raises(pydantic.ValidationError, match="set TOOLEXEC_BROKER_URL"):
        Settings.from_env()

    clean_env.setenv("TOOLEXEC_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    assert Settings.from_env().broker_url == "amqp://guest:guest@127.0.0.1:5672//"


def test_a_cluster_url_as_the_broker_is_refused(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLEXEC_BROKER_URL", "rediss+cluster://127.0.0.1:7000")
    with pytest.raises(pydantic.ValidationError, match="cannot use a cluster as its broker"):
        Settings.from_env()


@pytest.mark.parametrize("blank", ["", " ", "\t\n "])
@pytest.mark.parametrize("name", ["MCP_TOKEN", "PAYLOAD_SECRET", "FLOWER_USER", "FLOWER_PASSWORD"])
def test_a_blank_secret_is_unset(clean_env: pytest.MonkeyPatch, name: str, blank: str) -> None:
    """Every reader sees None, from the environment and from an explicit value alike."""
    clean_env.setenv(f"TOOLEXEC_{name}", blank)
    field = name.lower()

    assert getattr(Settings.from_env(), field) is None
    assert getattr(Settings(**{field: blank}), field) is None


def test_a_secret_with_spaces_around_it_is_kept_as_given() -> None:
    token = Settings(mcp_token=" t0ken ").mcp_token
    assert token is not None and token.get_secret_value() == " t0ken "
