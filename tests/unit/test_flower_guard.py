"""What ``toolexec flower`` refuses before Flower starts: pairs it would split, guarded options."""

from __future__ import annotations

import click
import pytest

from toolexec.ops.services_cli import (
    FLOWER_CONFIG,
    basic_auth,
    credential_problem,
    flower_environment,
    refused_passthrough,
)
from toolexec.settings import Settings


@pytest.mark.parametrize(
    ("user", "password"),
    [("admin", "Fl0wer,pass"), ("admin", "Fl0wer-pass,"), ("ad,min", "pw"), ("ad:min", "pw"),
     ("admin", "pw\n"), ("admin", "pässwort"), ("ädmin", "pw")],
)  # fmt: skip
def test_pairs_flower_cannot_carry_are_refused_without_quoting_the_password(
    user: str, password: str
) -> None:
    problem = credential_problem(user, password)
    assert problem is not None
    assert password.strip() not in problem
    with pytest.raises(click.ClickException) as refused:
        basic_auth(Settings(flower_user=user, flower_password=password))
    assert password.strip() not in refused.value.message


def test_an_ordinary_pair_passes() -> None:
    assert credential_problem("admin", "Fl0wer-pass:with:colons") is None


@pytest.mark.parametrize(
    "args",
    [("--address=0.0.0.0",), ("--address", "0.0.0.0"), ("--basic_auth=a:b",), ("--BASIC-AUTH=,",),
     ("--conf=x.py",), ("--port=1",), ("--unix_socket=/tmp/s",), ("--persistent=True", "--port=9")],
)  # fmt: skip
def test_options_that_set_where_flower_listens_or_who_gets_in_are_refused(
    args: tuple[str, ...],
) -> None:
    assert refused_passthrough(args) is not None


def test_other_options_pass_through() -> None:
    assert refused_passthrough(("--persistent=True", "--max_tasks=100", "0.0.0.0")) is None


def test_every_flower_variable_in_any_case_is_dropped_but_the_documented_ones() -> None:
    environ = {
        "FLOWER_Conf": "/tmp/evil.py",
        "flower_basic_auth": "a:b,",
        "FLOWER_ADDRESS": "0.0.0.0",
        "Flower_Auth": ".*",
        "FLOWER_PERSISTENT": "True",
        "FLOWER_persistent": "True",  # documented only as spelled
        "FLOWERS": "roses",
        "PATH": "/usr/bin",
    }
    dropped, refusal = flower_environment(environ)
    assert refusal is None
    assert dropped == sorted(
        ["FLOWER_Conf", "flower_basic_auth", "FLOWER_ADDRESS", "Flower_Auth", "FLOWER_persistent"]
    )


@pytest.mark.parametrize("name", ["FLOWER_UNAUTHENTICATED_API", "flower_Unauthenticated_Api"])
def test_the_api_opener_is_refused_in_any_case(name: str) -> None:
    _, refusal = flower_environment({name: "true"})
    assert refusal is not None and "FLOWER_UNAUTHENTICATED_API" in refusal


def test_toolexecs_own_config_file_sets_no_basic_auth_and_no_way_around_it() -> None:
    """Flower applies the file after its environment: a basic_auth here would replace ours."""
    names: dict[str, object] = {}
    exec(FLOWER_CONFIG.read_text(), names)  # what Flower's parse_config_file does
    assert "basic_auth" not in names and "conf" not in names
    assert names["auth"] == "" and names["debug"] is False
