"""``toolexec fairness``: fairness keys' weights and ``max_in_flight``, fleet-wide.

Attach with ``cli.add_command(fairness)``. Settings live on the Redis broker,
beside the lanes whose script reads them (:mod:`toolexec.stores.fairness_store`); the
next call taken uses them. On RabbitMQ with ``TOOLEXEC_RABBITMQ_FAIRNESS=true`` the
weights live in toolexec's Redis, where clients read them to pick a key's number of
queues, and caps, which each worker reads to stop consuming a key's queues while
that many of its calls run (:mod:`toolexec.worker.amqp_caps`;
docs/guides/fairness.md, "RabbitMQ").
"""

from __future__ import annotations

import json

import click

from toolexec.errors import UsageError
from toolexec.ops.cli_support import reported
from toolexec.stores.fairness_store import FairnessStore

__all__ = ["fairness"]


def _store() -> FairnessStore:
    from toolexec.connection import redis_client, redis_url
    from toolexec.fairness import is_amqp
    from toolexec.keys import BrokerKeys
    from toolexec.settings import Settings

    settings = Settings.from_env()
    broker = settings.broker_url or redis_url(settings)
    keys = BrokerKeys(settings.key_prefix)
    if not is_amqp(broker):
        return FairnessStore(redis_client(broker, socket_timeout=5.0), keys)
    if not settings.rabbitmq_fairness:
        raise click.ClickException(
            "the broker is RabbitMQ without TOOLEXEC_RABBITMQ_FAIRNESS=true: calls are "
            "ordered by priority there, and fairness keys have no weights "
            "(docs/guides/fairness.md)"
        )
    return FairnessStore(redis_client(redis_url(settings), socket_timeout=5.0), keys)


@click.group()
def fairness() -> None:
    """Weights and in-flight caps of fairness keys (a call's fairness_key=)."""


@fairness.command("set")
@click.argument("key")
@click.argument("weight", required=False)
@click.option(
    "--max-in-flight", type=int, default=None, help="Most calls of KEY running at once, fleet-wide."
)
def set_(key: str, weight: str | None, max_in_flight: int | None) -> None:
    """Give KEY a WEIGHT (its share against weight-1 keys; default 1) and/or a cap."""
    if weight is None and max_in_flight is None:
        raise click.UsageError("give a WEIGHT, --max-in-flight, or both")
    with reported():
        try:
            store = _store()
            store.set(key, None if weight is None else float(weight), max_in_flight)
        except (UsageError, ValueError) as exc:
            raise click.BadParameter(str(exc)) from exc
    click.echo(f"{key}: " + ", ".join(_said(weight, max_in_flight)))


def _said(weight: str | None, cap: int | None) -> list[str]:
    return [
        *([] if weight is None else [f"weight {float(weight):g}"]),
        *([] if cap is None else [f"at most {cap} in flight"]),
    ]


@fairness.command("clear")
@click.argument("key")
def clear(key: str) -> None:
    """Back to weight 1 and no cap."""
    with reported():
        _store().clear(key)
    click.echo(f"{key}: weight 1, no cap")


@fairness.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def show(as_json: bool) -> None:
    """Every key with a weight or a cap; the others have weight 1 and no cap."""
    with reported():
        config = _store().config()
    if as_json:
        click.echo(json.dumps(config, indent=2))
        return
    if not config:
        click.echo("no fairness key has a setting: every key has weight 1 and no cap")
    for key, values in config.items():
        weight = values.get("weight", 1.0)
        cap = values.get("max_in_flight")
        click.echo(f"{key}\tweight {weight:g}\t" + ("no cap" if cap is None else f"max {cap}"))
