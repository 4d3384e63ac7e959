"""``toolexec faults``: inject failures into a tool at run time, and take them out again.

Attach with ``cli.add_command(faults)``. ``set`` refuses unless
``TOOLEXEC_FAULTS_ENABLED=true`` is set where it runs, and workers apply a
config only when started with the same setting, so a production deployment
(where it is unset) can neither be given faults by a typo nor apply them.
"""

from __future__ import annotations

import json
from typing import Any

import click

from toolexec.errors import ConfigurationError, ErrorType
from toolexec.layers.faults import INJECTABLE, FaultConfig, FaultStore
from toolexec.ops.cli_support import reported as _reported

__all__ = ["faults"]

_OFF = (
    "fault injection is off: set TOOLEXEC_FAULTS_ENABLED=true here and on the workers "
    "that should apply it (test and staging setups only, never production)"
)


def _store() -> tuple[FaultStore, bool]:
    """The fault store on the configured Redis, and whether faults are enabled here."""
    from toolexec.connection import redis_client, redis_url
    from toolexec.keys import Keys
    from toolexec.settings import Settings

    settings = Settings.from_env()
    client = redis_client(redis_url(settings))
    return FaultStore(client, Keys(settings.key_prefix)), settings.faults_enabled


def _outcome(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--outcome") from exc


@click.group(
    invoke_without_command=True,
    short_help="Inject failures into tool calls on test workers; list, set, clear.",
)
@click.pass_context
def faults(ctx: click.Context) -> None:
    """Inject failures into tool calls, to test what breakers, retries and fallbacks do.

    Changes what workers started with TOOLEXEC_FAULTS_ENABLED=true do with a
    tool's calls (errors, replaced outcomes, added latency); others ignore it.
    Without a subcommand, lists the configs set in Redis (JSON: tool -> config).
    """
    if ctx.invoked_subcommand is None:
        with _reported():
            store, enabled = _store()
            configs = {tool: config.to_json() for tool, config in store.all().items()}
        click.echo(json.dumps(configs, indent=2, sort_keys=True))
        if configs and not enabled:
            click.echo(f"note: {_OFF}", err=True)


@faults.command("set")
@click.argument("tool")
@click.option(
    "--rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    help="Share of attempts that fail (or get --outcome).",
)
@click.option(
    "--error",
    type=click.Choice(sorted(str(t) for t in INJECTABLE)),
    default=None,
    help="Error type injected at --rate (default: unavailable).",
)
@click.option("--outcome", default=None, help="JSON returned instead of running the tool.")
@click.option(
    "--latency", type=click.FloatRange(min=0), default=0.0, help="Seconds added before the tool."
)
@click.option(
    "--latency-rate",
    type=click.FloatRange(0, 1),
    default=1.0,
    help="Share of attempts slowed by --latency.",
)
@click.option("--seed", type=int, default=0, help="Same seed, same sequence of faults.")
def set_fault(
    tool: str,
    rate: float,
    error: str | None,
    outcome: str | None,
    latency: float,
    latency_rate: float,
    seed: int,
) -> None:
    """Inject faults into TOOL's attempts, from its next attempt on (replaces its config)."""
    with _reported():
        store, enabled = _store()
        if not enabled:
            raise ConfigurationError(_OFF)
        config = FaultConfig(
            rate=rate,
            error=None if error is None else ErrorType(error),
            outcome=_outcome(outcome),
            latency=latency,
            latency_rate=latency_rate,
            seed=seed,
        )
        store.set(tool, config)
    click.echo(json.dumps({tool: config.to_json()}, indent=2, sort_keys=True))


@faults.command("clear")
@click.argument("tool", required=False)
def clear(tool: str | None) -> None:
    """Remove TOOL's fault config, or every config."""
    with _reported():
        store, _ = _store()
        cleared = store.clear(tool)
    click.echo(f"cleared: {', '.join(cleared)}" if cleared else "no fault configs")
