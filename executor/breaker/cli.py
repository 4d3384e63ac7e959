"""``toolexec breakers``: every circuit breaker at a glance, and the operator's switches.

Attach with ``cli.add_command(breakers)``. Times come from Redis ``TIME`` (no
clock is injected here), so open-until reads the same from any host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from toolexec.breaker.store import CircuitBreaker
from toolexec.breaker.views import BreakerView
from toolexec.errors import ToolexecError

__all__ = ["breakers"]

F = TypeVar("F", bound=Callable[..., Any])

_COLUMNS = ("NAME", "STATE", "FAILED", "RATE", "SLOW", "CONSEC", "PROBES", "OPEN UNTIL")


def _json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


def _breaker() -> CircuitBreaker:
    """A breaker store on the configured Redis, built when a command runs."""
    from toolexec.connection import redis_client, redis_url
    from toolexec.keys import Keys
    from toolexec.settings import Settings

    settings = Settings.from_env()
    return CircuitBreaker(redis_client(redis_url(settings)), Keys(settings.key_prefix))


@contextmanager
def _reported() -> Iterator[None]:
    """toolexec's own errors as a one-line message and exit status 1, not a traceback."""
    try:
        yield
    except ToolexecError as exc:
        raise click.ClickException(str(exc)) from exc


def _until(view: BreakerView) -> str:
    if view.isolated:
        return "isolated until reset"
    if view.open_until is None:
        return "-"
    stamp = time.strftime("%H:%M:%S", time.gmtime(view.open_until)) + "Z"
    left = view.open_until - (view.at or view.open_until)
    if left <= 0:
        return f"{stamp} (passed; next call probes)"
    return f"{stamp} (in {left:.1f} s)"


def _row(view: BreakerView) -> tuple[str, ...]:
    rate = view.failure_rate
    return (
        view.name,
        str(view.state),
        f"{view.failures}/{view.calls}",
        "-" if rate is None else f"{rate:.0%}",
        str(view.slow),
        str(view.consecutive),
        f"{view.probes_in_flight} ({view.probe_successes} ok)",
        _until(view),
    )


def _table(views: list[BreakerView]) -> str:
    rows = [_COLUMNS, *(_row(v) for v in views)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _show(views: list[BreakerView], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([v.to_json() for v in views], indent=2, sort_keys=True))
    elif views:
        click.echo(_table(views))
    else:
        click.echo("no circuit breakers yet (one appears with its first recorded call)")


@click.group(invoke_without_command=True)
@_json_option
@click.pass_context
def breakers(ctx: click.Context, as_json: bool) -> None:
    """List every circuit breaker: state, failure rate, window, probes, open-until."""
    if ctx.invoked_subcommand is None:
        with _reported():
            _show(_breaker().snapshot_all(), as_json)


@breakers.command()
@click.argument("name")
@click.option(
    "--for",
    "seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Open for this many seconds, then probe as usual (default: until reset).",
)
@_json_option
def trip(name: str, seconds: float | None, as_json: bool) -> None:
    """Force NAME open: calls fail fast with circuit_open (an operator's isolate switch)."""
    with _reported():
        _show([_breaker().trip(name, seconds)], as_json)


@breakers.command()
@click.argument("name")
@_json_option
def reset(name: str, as_json: bool) -> None:
    """Force NAME closed with an empty window; ends an isolation."""
    with _reported():
        _show([_breaker().reset(name)], as_json)
