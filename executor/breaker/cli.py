"""``toolexec breakers``: every circuit breaker at a glance, and the operator's switches.

Attach with ``cli.add_command(breakers)``. Times come from Redis ``TIME`` (no
clock is injected here), so open-until reads the same from any host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from toolexec.breaker.store import CircuitBreaker
from toolexec.breaker.views import BreakerView
from toolexec.ops.cli_support import reported as _reported

__all__ = ["breakers", "known_names"]

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


def known_names(store: CircuitBreaker) -> list[str]:
    """Names a breaker can have: every published tool, and every breaker already used."""
    from toolexec.stores import catalog

    return sorted(set(catalog.read(store.redis, store.keys)) | set(store.names()))


def _checked(store: CircuitBreaker, name: str, force: bool) -> CircuitBreaker:
    """Refuse a name no tool or host breaker uses: a typo must not make a phantom breaker."""
    if force:
        return store
    known = known_names(store)
    if name not in known:
        store.snapshot(name)  # a malformed name is refused as such first
        raise click.ClickException(
            f"no tool or breaker is named {name!r}; known: {', '.join(known) or 'none yet'}. "
            "A per-host breaker (http_request@api.example.com) appears with its first call; "
            "pass --force to use a name not seen yet."
        )
    return store


def _force_option(func: F) -> F:
    return click.option(
        "--force", is_flag=True, help="Accept a name no tool or breaker has used yet."
    )(func)


def _until(view: BreakerView) -> str:
    if view.isolated:
        return "isolated until reset"
    if view.open_until is None:
        return "-"
    try:
        stamp = time.strftime("%H:%M:%S", time.gmtime(view.open_until)) + "Z"
    except (OverflowError, OSError, ValueError):  # a state written before open times were capped
        return f"far in the future ({view.open_until:.3g}); reset it"
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


@click.group(
    invoke_without_command=True,
    short_help="Trip, reset or list circuit breakers (fail a tool's calls fast).",
)
@_json_option
@click.pass_context
def breakers(ctx: click.Context, as_json: bool) -> None:
    """Circuit breakers: list them, or force one open (trip) or closed (reset).

    Tripping or resetting changes how every client and worker answers that
    tool's calls at once: an open breaker fails them fast with circuit_open.
    Without a subcommand, lists every breaker: state, failure rate, window,
    probes, open-until.
    """
    if ctx.invoked_subcommand is None:
        with _reported():
            _show(_breaker().snapshot_all(), as_json)


@breakers.command("list")
@_json_option
@click.pass_context
def list_breakers(ctx: click.Context, as_json: bool) -> None:
    """List every breaker (the same as ``toolexec breakers``)."""
    with _reported():
        outer = ctx.parent.params.get("as_json", False) if ctx.parent else False
        _show(_breaker().snapshot_all(), as_json or bool(outer))


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
@_force_option
def trip(name: str, seconds: float | None, as_json: bool, force: bool) -> None:
    """Force NAME open: calls fail fast with circuit_open (an operator's isolate switch)."""
    with _reported():
        _show([_checked(_breaker(), name, force).trip(name, seconds)], as_json)


@breakers.command()
@click.argument("name")
@_json_option
@_force_option
def reset(name: str, as_json: bool, force: bool) -> None:
    """Force NAME closed with an empty window; ends an isolation."""
    with _reported():
        _show([_checked(_breaker(), name, force).reset(name)], as_json)
