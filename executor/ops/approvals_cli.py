"""``toolexec approvals``: the calls waiting for a person's approval; approve or deny one.

Attach with ``cli.add_command(approvals)``. A call of a tool declared with
``@tool(approval=...)`` waits, parked in the queue, until someone decides
(``toolexec.layers.approvals``); an operator decides here, an MCP client's user by
answering the question the front puts to them. The first decision stands.
"""

from __future__ import annotations

import json
import time

import click

from toolexec.layers.approvals import ApprovalStore, Decision

__all__ = ["approvals"]


def _store() -> ApprovalStore:
    from toolexec.connection import redis_client, redis_url
    from toolexec.keys import Keys
    from toolexec.settings import Settings

    settings = Settings.from_env()
    return ApprovalStore(redis_client(redis_url(settings)), Keys(settings.key_prefix))


@click.group(short_help="Calls waiting for approval: list, approve, deny.")
def approvals() -> None:
    """The calls of tools declared with approval=..., waiting for a person's decision."""


@approvals.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_(as_json: bool) -> None:
    """The calls waiting now, oldest first."""
    waiting = _store().pending(time.time())
    if not waiting:
        click.echo("no call waits for approval")
    for entry in waiting:
        if as_json:
            click.echo(json.dumps(entry.to_json(), sort_keys=True))
            continue
        left = max(0.0, entry.expires_at - time.time())
        click.echo(f"{entry.call_id}  {entry.tool}  run={entry.run_id}  {left:.0f} s left")
        click.echo(f"    {entry.prompt}")


def _decide(call_id: str, decision: Decision, reason: str | None) -> None:
    store = _store()
    if not store.is_waiting(call_id):
        raise click.ClickException(f"no call {call_id} waits for approval (see: approvals list)")
    if not store.decide(call_id, decision, "operator", reason):
        raise click.ClickException(f"call {call_id} was decided already; the first decision stands")
    click.echo(f"call {call_id}: {decision}")


@approvals.command()
@click.argument("call_id")
@click.option("--reason", default=None, help="Why, for the record.")
def approve(call_id: str, reason: str | None) -> None:
    """Let the call run (once)."""
    _decide(call_id, "approved", reason)


@approvals.command()
@click.argument("call_id")
@click.option("--reason", default=None, help="Why: the model reads it.")
def deny(call_id: str, reason: str | None) -> None:
    """End the call with approval_denied; it does not run."""
    _decide(call_id, "denied", reason)
