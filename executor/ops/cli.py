"""The ``toolexec`` command: worker, call, tools, demo and the embedded server."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

import click

from toolexec.breaker.cli import breakers
from toolexec.errors import ToolexecError
from toolexec.ops.faults_cli import faults
from toolexec.ops.services_cli import flower, serve_embedded
from toolexec.ops.status import status

__all__ = ["main"]


def _import_tools(modules: list[str]) -> None:
    """Import tool modules now, so a typo fails here with a clear message."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise click.ClickException(
                f"cannot import tool module {module!r}: {exc}. "
                "Pass a module importable from this directory, e.g. --tools mytools"
            ) from exc


def _autoscale_pool(pool: str | None, autoscale: str | None) -> str | None:
    """Autoscaling grows and shrinks processes: only prefork can (threads stays at MIN)."""
    if not autoscale or pool in (None, "prefork"):
        return "prefork" if autoscale else pool
    raise click.ClickException(
        f"--autoscale works with the prefork pool only, not {pool!r}: drop --pool, "
        "or use --concurrency with the threads pool"
    )


@click.group()
def cli() -> None:
    """A distributed executor for LLM agents' tool calls, on Celery and Redis."""


@cli.command()
@click.option("--tools", "tools", default="", help="Comma-separated modules that declare tools.")
@click.option("--queues", "-Q", default="", help="Queues to consume (default: every tool's queue).")
@click.option("--concurrency", "-c", type=int, default=None, help="Calls in parallel.")
@click.option("--pool", "-P", default=None, help="threads (default), prefork, gevent, solo.")
@click.option("--autoscale", default=None, help="MAX,MIN processes (implies the prefork pool).")
@click.option("--hostname", "-n", default=None, help="Worker name (default: unique per process).")
@click.option("--loglevel", "-l", default="INFO")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (default: TOOLEXEC_METRICS_PORT, else off).",
)
def worker(
    tools: str,
    queues: str,
    concurrency: int | None,
    pool: str | None,
    autoscale: str | None,
    hostname: str | None,
    loglevel: str,
    metrics_port: int | None,
) -> None:
    """Run a worker that executes tool calls."""
    pool = _autoscale_pool(pool, autoscale)
    if tools:
        os.environ["TOOLEXEC_TOOLS"] = tools
    from toolexec.app import app, settings_of
    from toolexec.registry import default_registry

    settings = settings_of(app)
    from toolexec.ops import telemetry

    metrics_port = metrics_port or settings.metrics_port
    telemetry.prepare(pool or settings.worker_pool, metrics_port)
    import toolexec.tasks  # noqa: F401  (binds every registered tool to a Celery task)

    _import_tools(settings.tools)
    wanted = queues or ",".join(
        sorted(
            {spec.policy.queue or settings.default_queue for spec in default_registry}
            | {settings.default_queue}
        )
    )
    argv = [
        "worker",
        f"--loglevel={loglevel}",
        "-Q",
        wanted,
        "-P",
        pool or settings.worker_pool,
        "-n",
        hostname or f"toolexec-{os.getpid()}@%h",
    ]
    if autoscale:
        argv += ["--autoscale", autoscale]
    else:
        argv += ["-c", str(concurrency or settings.worker_concurrency)]
    if settings.task_events:
        argv.append("-E")
    app.worker_main([*telemetry.start(settings, metrics_port), *argv])


@cli.command()
@click.argument("tool")
@click.argument("arguments", default="{}")
@click.option("--run-id", default=None, help="The agent run this call belongs to.")
@click.option("--timeout", type=float, default=None, help="Deadline in seconds.")
def call(tool: str, arguments: str, run_id: str | None, timeout: float | None) -> None:
    """Call TOOL with ARGUMENTS (a JSON object) and print the result as JSON."""
    from toolexec.client import ToolClient

    with ToolClient.from_env() as client:
        result = client.call(tool, arguments, run_id=run_id, timeout=timeout)
    click.echo(result.model_dump_json(indent=2))
    sys.exit(0 if result.ok else 1)


@cli.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["catalog", "openai", "anthropic"]),
    default="catalog",
    help="catalog (with policies) or a model API's tool list.",
)
def tools(fmt: str) -> None:
    """Print the tool catalog the workers have published, as JSON."""
    from toolexec.client import ToolClient

    with ToolClient.from_env() as client:
        out: Any = (
            client.catalog(refresh=True)
            if fmt == "catalog"
            else client.tool_definitions("openai" if fmt == "openai" else "anthropic")
        )
    click.echo(json.dumps(out, indent=2, sort_keys=True))


@cli.command()
@click.option("--keep-server", is_flag=True, help="Leave the embedded server running.")
def demo(keep_server: bool) -> None:
    """Run a scripted agent against a misbehaving local service."""
    from toolexec.ops.demo import run_demo

    sys.exit(run_demo(keep_server=keep_server))


@cli.group()
def embedded() -> None:
    """The embedded Valkey server used when TOOLEXEC_REDIS_URL is unset."""


@embedded.command("start")
def embedded_start() -> None:
    """Start it (or find it running) and print its URL."""
    from toolexec.embedded import ensure_embedded
    from toolexec.settings import Settings

    click.echo(ensure_embedded(Settings.from_env().data_dir).url)


@embedded.command("stop")
def embedded_stop() -> None:
    """Stop it."""
    from toolexec.embedded import stop_embedded
    from toolexec.settings import Settings

    stopped = stop_embedded(Settings.from_env().data_dir)
    click.echo("stopped" if stopped else "not running")


cli.add_command(breakers)
cli.add_command(faults)
cli.add_command(status)
cli.add_command(flower)
embedded.add_command(serve_embedded)


def main() -> None:
    try:
        cli()
    except ToolexecError as exc:
        click.echo(f"toolexec: {exc}", err=True)
        sys.exit(2)
