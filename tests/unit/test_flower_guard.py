"""What ``toolexec flower`` refuses before Flower starts: pairs it would split, guarded options."""

from __future__ import annotations

import click
import pytest

from toolexec.ops.services_cli import basic_auth, credential_problem, refused_passthrough
from toolexec.settings import Settings


@pytest.mark.parametrize(
    ("user", "password"),
    [("admin", "Fl0wer,pass"), ("admin", "Fl0wer-pass,"), ("ad,min", "pw"), ("ad:min", "pw"),
     ("admin", "pw\n")],
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
