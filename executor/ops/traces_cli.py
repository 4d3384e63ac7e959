"""``toolexec trace CALL_ID`` and ``toolexec traces receive``: one call's trace, no backend needed.

``receive`` listens for OTLP/HTTP on loopback and appends every span to a
JSON-lines file; point workers and agents at it with
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces``. ``trace``
prints the tree of the trace that holds a call id from that file.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

__all__ = ["trace", "traces"]

_DEFAULT_FILE = "toolexec-spans.jsonl"


@click.command()
@click.argument("call_id")
@click.option(
    "--spans",
    "spans_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=_DEFAULT_FILE,
    show_default=True,
    help="The JSON lines `toolexec traces receive` wrote.",
)
def trace(call_id: str, spans_file: Path) -> None:
    """Print the trace of CALL_ID as a tree: client, queue hop, attempts, HTTP calls."""
    from toolexec.ops.traces import load_spans, render_call, trace_of_call

    spans = load_spans(spans_file)
    click.echo(render_call(spans, call_id))
    if not trace_of_call(spans, call_id):
        raise SystemExit(1)


@click.group()
def traces() -> None:
    """Receive spans locally (OTLP/HTTP) without a tracing backend."""


@traces.command()
@click.option("--port", type=int, default=4318, show_default=True, help="Loopback port.")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=_DEFAULT_FILE,
    show_default=True,
)
def receive(port: int, path: Path) -> None:
    """Listen on 127.0.0.1:PORT for OTLP/HTTP spans and append them to FILE."""
    from toolexec.ops.traces import OtlpReceiver

    with OtlpReceiver(port, path) as receiver:
        click.echo(f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={receiver.endpoint}; spans go to {path}")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return
