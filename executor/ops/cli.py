"""The ``toolexec`` command: worker, call, tools, demo and the embedded server."""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import click

from toolexec.breaker.cli import breakers
from toolexec.errors import InfrastructureError, ToolexecError
from toolexec.ops.approvals_cli import approvals
from toolexec.ops.cli_support import EXIT_UNREACHABLE, Unreachable
from toolexec.ops.fairness_cli import fairness
from toolexec.ops.faults_cli import faults
from toolexec.ops.health import health
from toolexec.ops.mcp_cli import mcp
from toolexec.ops.pool_default import PoolChoice, choose_pool
from toolexec.ops.processes import ProcessPlan, Supervisor, plan_processes
from toolexec.ops.services_cli import flower, serve_embedded
from toolexec.ops.status import status
from toolexec.ops.traces_cli import trace, traces
from toolexec.settings import Settings

__all__ = ["main"]


def _module_of(spec: str) -> str:
    """A tool module's import name; a path (``./mytools.py``, ``lib/tools``) puts its folder first
    on ``sys.path``, so the worker's own imports (Celery's ``imports``) find it too."""
    if not (spec.endswith(".py") or os.sep in spec or "/" in spec):
        return spec
    path = Path(spec).expanduser().resolve()
    if path.is_dir() and (path / "__init__.py").exists():
        name = path.name
    elif path.suffix == ".py" and path.is_file():
        name = path.stem
    else:
        raise click.ClickException(
            f"--tools {spec}: no such Python file or package ({path}); pass a module name "
            "importable from here (--tools mytools) or the path of a .py file"
        )
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return name


def _import_tools(modules: list[str]) -> list[str]:
    """Import tool modules now, so a typo or a broken import fails here with a clear message."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    names = [_module_of(spec) for spec in modules]
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise _broken_import(name, exc) from exc
            raise click.ClickException(
                f"cannot find tool module {name!r} in the current directory ({os.getcwd()}) "
                "or on PYTHONPATH. Pass a module name importable from here "
                "(--tools mytools) or a path (--tools ./mytools.py)"
            ) from exc
        except Exception as exc:  # the module exists, its own code failed
            raise _broken_import(name, exc) from exc
    return names


def _broken_import(name: str, exc: BaseException) -> click.ClickException:
    """The module was found, but running it failed: say where, not "pass a module"."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}, line {exc.lineno})"
    return click.ClickException(
        f"tool module {name!r} was found, but importing it failed{where}: "
        f"{type(exc).__name__}: {exc}"
    )


def _autoscale_pool(pool: str | None, autoscale: str | None) -> str | None:
    """Autoscaling grows and shrinks processes: only prefork can (threads stays at MIN)."""
    if autoscale:
        from toolexec.worker.start import autoscale_bounds

        try:
            autoscale_bounds(autoscale)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--autoscale") from None
    if not autoscale or pool in (None, "prefork"):
        return "prefork" if autoscale else pool
    raise click.ClickException(
        f"--autoscale works with the prefork pool only, not {pool!r}: drop --pool, "
        "or use --concurrency with the threads pool"
    )


def _freeze_startup_heap() -> None:
    """Move everything imported so far out of the collector's reach, just before Celery starts.

    A worker's heap is mostly modules, classes and the app, alive until the process
    ends. Left tracked, every full collection walks them again, and the interpreter's
    collection at exit walks them once more: about 0.6 s of CPU at each stop of a
    worker with the test tools (os.waitid after SIGTERM, /proc CPU ticks: 0.7 s
    before, 0.15 s after), time a rolling restart waits on. Prefork children share
    these pages untouched too. Cycles made later are collected as before.
    """
    gc.freeze()


def _supervise(
    plan: ProcessPlan,
    choice: PoolChoice,
    hostname: str | None,
    loglevel: str,
    queues: str,
    metrics_port: int | None,
    connect_wait: float,
    mcp_servers: tuple[str, ...],
) -> NoReturn:
    """Run ``plan.processes`` worker processes and watch them (``toolexec.ops.processes``)."""
    name = hostname or f"toolexec-{os.getpid()}@%h"
    click.echo(
        f"toolexec worker: {plan.reason}, each a {choice.pool} pool of {choice.concurrency} "
        f"slots, sharing the queues ({plan.processes * choice.concurrency} slots in all)",
        err=True,
    )
    argv = ["-P", choice.pool, "-c", str(choice.concurrency), "--loglevel", loglevel]
    argv += ["--connect-wait", repr(connect_wait)]
    argv += ["-Q", queues] if queues else []
    for server in mcp_servers:
        argv += ["--mcp-server", server]
    if metrics_port is not None:
        click.echo(f"toolexec worker: process i serves metrics on port {metrics_port} + i - 1")
    sys.exit(Supervisor(plan.processes, argv, name, metrics_port=metrics_port).run())


def _say_once_ready(reason: str) -> None:
    """Log the pool and why, through the worker's own log set-up (JSON lines stay JSON)."""
    from celery.signals import worker_ready

    def say(**_: Any) -> None:
        logging.getLogger("toolexec.worker").info("pool: %s", reason)

    worker_ready.connect(say, weak=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolexec", prog_name="toolexec", message="%(prog)s %(version)s")
def cli() -> None:
    """A distributed executor for LLM agents' tool calls, on Celery and Redis."""


def _tool_specs(tools: str) -> None:
    """Turn paths in --tools (or TOOLEXEC_TOOLS) into module names before Celery reads them."""
    raw = tools or os.environ.get("TOOLEXEC_TOOLS", "")
    specs = [spec.strip() for spec in raw.split(",") if spec.strip()]
    if specs:
        os.environ["TOOLEXEC_TOOLS"] = ",".join(_module_of(spec) for spec in specs)


def _check_servers(settings: Settings, connect_wait: float) -> None:
    """Exit with code 3, saying what and which setting, if Redis or the broker never answers."""
    from toolexec.connection import redis_url
    from toolexec.ops import worker_check

    for target in worker_check.targets(settings, redis_url(settings)):
        if not worker_check.wait_for(target, connect_wait, lambda line: click.echo(line, err=True)):
            sys.exit(EXIT_UNREACHABLE)


def _say_what_it_serves(modules: list[str]) -> None:
    if not modules:
        click.echo(
            "toolexec worker: no --tools given (nor TOOLEXEC_TOOLS): serving only the built-in "
            "tools (http_request). Pass --tools mytools to serve your own.",
            err=True,
        )


def _register_mcp_servers(given: tuple[str, ...], overrides: dict[str, Any]) -> set[str | None]:
    """Remote MCP servers from --mcp-server and from tools modules (toolexec.mcp.servers).

    Returns their queues: a server that cannot be listed yet still has its queue consumed,
    so its calls run as soon as its tools are registered.
    """
    if not given and "toolexec.mcp.servers" not in sys.modules:
        return set()
    try:
        from toolexec.mcp.remote import register_servers
        from toolexec.mcp.servers import RemoteServer, declared_servers
    except ImportError as exc:
        raise click.ClickException(
            f"--mcp-server needs the MCP SDK ({exc}); install it with: pip install 'toolexec[mcp]'"
        ) from exc
    servers = [*declared_servers(), *(RemoteServer.parse(spec) for spec in given)]
    return set(register_servers(servers, overrides).values())


def _tools_served(settings: Settings, mcp_servers: tuple[str, ...]) -> set[str | None]:
    """Import the tool modules and register remote MCP servers' tools; their queues."""
    from toolexec.registry import default_registry

    modules = _import_tools(settings.tools)
    if not mcp_servers:  # remote MCP tools are served too
        _say_what_it_serves(modules)
    return {spec.policy.queue for spec in default_registry} | _register_mcp_servers(
        mcp_servers, settings.mcp_servers
    )


@cli.command()
@click.option(
    "--tools",
    "tools",
    default="",
    help="Comma-separated modules (imported from the current directory or PYTHONPATH) or "
    ".py paths that declare tools (default: TOOLEXEC_TOOLS; none: only built-in tools).",
)
@click.option("--queues", "-Q", default="", help="Queues to consume (default: every tool's queue).")
@click.option("--concurrency", "-c", type=int, default=None, help="Calls in parallel.")
@click.option(
    "--pool", "-P", default=None, help="threads (default, says why), prefork, gevent, solo."
)
@click.option("--autoscale", default=None, help="MAX,MIN processes (implies the prefork pool).")
@click.option(
    "--processes",
    type=click.IntRange(1, 512),
    default=None,
    help="Worker processes, each with its own slots, sharing the queues (default: "
    "TOOLEXEC_WORKER_PROCESSES, else one per core with the default threads pool, else 1).",
)
@click.option("--hostname", "-n", default=None, help="Worker name (default: unique per process).")
@click.option(
    "--loglevel",
    "-l",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Log level of the worker: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (default: TOOLEXEC_METRICS_PORT, else off).",
)
@click.option(
    "--connect-wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to keep trying an unreachable Redis or broker at start before exiting "
    "with code 3.",
)
@click.option(
    "--mcp-server",
    "mcp_servers",
    multiple=True,
    metavar="NAME=URL|NAME=stdio:COMMAND",
    help="Run a remote MCP server's tools as NAME.tool (repeatable; needs toolexec[mcp]).",
)
def worker(
    tools: str,
    queues: str,
    concurrency: int | None,
    pool: str | None,
    autoscale: str | None,
    processes: int | None,
    hostname: str | None,
    loglevel: str,
    metrics_port: int | None,
    connect_wait: float,
    mcp_servers: tuple[str, ...],
) -> None:
    """Run a worker that executes tool calls: one process per core by default."""
    pool = _autoscale_pool(pool, autoscale)
    _tool_specs(tools)
    from toolexec.worker.app import app, settings_of
    from toolexec.worker.start import WorkerOptions, start_worker

    settings = settings_of(app)
    _check_servers(settings, connect_wait)
    from toolexec.ops import telemetry

    metrics_port = metrics_port or settings.metrics_port
    explicit = settings.model_fields_set
    choice = choose_pool(
        os.cpu_count() or 1,
        pool or (settings.worker_pool if "worker_pool" in explicit else None),
        concurrency or (settings.worker_concurrency if "worker_concurrency" in explicit else None),
        settings.worker_concurrency,
    )
    chosen = pool or concurrency or "worker_pool" in explicit or "worker_concurrency" in explicit
    processes = processes if processes is not None else settings.worker_processes
    plan = plan_processes(os.cpu_count() or 1, processes, bool(chosen or autoscale))
    if plan.processes > 1:
        _import_tools(settings.tools)  # a bad tools module fails here, once, not per process
        _supervise(
            plan, choice, hostname, loglevel, queues, metrics_port, connect_wait, mcp_servers
        )
    if not autoscale:
        _say_once_ready(choice.reason)
    telemetry.prepare(choice.pool, metrics_port)
    import toolexec.tasks  # noqa: F401  (binds every registered tool to a Celery task)

    served = _tools_served(settings, mcp_servers)
    wanted = queues or ",".join(
        sorted({queue or settings.default_queue for queue in served} | {settings.default_queue})
    )
    _freeze_startup_heap()
    options = WorkerOptions(
        queues=wanted,
        pool=choice.pool,
        hostname=hostname or f"toolexec-{os.getpid()}@%h",
        loglevel=loglevel,
        concurrency=choice.concurrency,
        autoscale=autoscale,
        task_events=settings.task_events,
        quiet=telemetry.start(settings, metrics_port),
    )
    start_worker(app, options)  # its exit code is dropped, as app.worker_main dropped it


@cli.command()
@click.argument("tool")
@click.argument("arguments", default="{}")
@click.option("--run-id", default=None, help="The agent run this call belongs to.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Deadline in seconds (default: TOOLEXEC_DEFAULT_TIMEOUT).",
)
@click.option(
    "--idempotency-key",
    default=None,
    help="Run a side-effecting call at most once per key: a repeat is answered from the "
    "first (replayed).",
)
@click.option(
    "--full", is_flag=True, help="Print the whole result record, not what the model reads."
)
def call(
    tool: str,
    arguments: str,
    run_id: str | None,
    timeout: float | None,
    idempotency_key: str | None,
    full: bool,
) -> None:
    """Call TOOL with ARGUMENTS (a JSON object) and print what the model would read.

    Exit code 0 when the call succeeded (degraded answers included), 1 otherwise.
    """
    from toolexec.client import ToolClient

    with ToolClient.from_env() as client:
        result = client.call(
            tool, arguments, run_id=run_id, timeout=timeout, idempotency_key=idempotency_key
        )
    click.echo(result.model_dump_json(indent=2) if full else result.content())
    sys.exit(0 if result.ok else 1)


#: ``toolexec tools`` found no catalog: no worker ever published one against this Redis.
EXIT_NO_CATALOG = 4


@cli.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["catalog", "openai", "anthropic"]),
    default="catalog",
    help="catalog (with policies) or a model API's tool list.",
)
def tools(fmt: str) -> None:
    """Print the tool catalog the workers have published, as JSON.

    Exits with code 4, saying so, when no worker has published one yet.
    """
    from toolexec.client import ToolClient

    with ToolClient.from_env() as client:
        catalog = client.catalog(refresh=True)
        out: Any = (
            catalog
            if fmt == "catalog"
            else client.tool_definitions("openai" if fmt == "openai" else "anthropic")
        )
    if not catalog:
        click.echo(
            "toolexec tools: no worker has published a catalog on this Redis yet; start one "
            "with `toolexec worker --tools <your module>` (with the same TOOLEXEC_REDIS_URL, "
            "or in the same project folder for the embedded server)",
            err=True,
        )
        sys.exit(EXIT_NO_CATALOG)
    click.echo(json.dumps(out, indent=2, sort_keys=True))


@cli.command()
@click.option("--keep-server", is_flag=True, help="Leave the embedded server running.")
def demo(keep_server: bool) -> None:
    """Run a scripted agent against a misbehaving local service."""
    from toolexec.ops.demo import run_demo

    sys.exit(run_demo(keep_server=keep_server))


@cli.group()
def embedded() -> None:
    """The embedded Valkey server used when TOOLEXEC_REDIS_URL is unset.

    One per project (TOOLEXEC_DATA_DIR, by default a folder per project under
    ~/.local/share/toolexec/projects); it keeps running in the background until stopped.
    """


@embedded.command("start")
def embedded_start() -> None:
    """Start it (or find it running) and print its URL."""
    from toolexec.embedded import ensure_embedded

    click.echo(ensure_embedded(Settings.from_env().data_dir).url)


@embedded.command("status")
def embedded_status() -> None:
    """Say whether this project's embedded server runs, where, and its files.

    Exits 1 when none runs.
    """
    from toolexec.embedded import embedded_status as find

    data_dir = Settings.from_env().data_dir
    server = find(data_dir)
    if server is None:
        click.echo(
            f"no embedded server runs for this project (data folder {data_dir}); the first "
            "toolexec command that needs Redis starts one, unless TOOLEXEC_REDIS_URL is set"
        )
        sys.exit(1)
    click.echo(f"running at {server.url}, pid {server.pid}, files in {data_dir / 'valkey'}")


@embedded.command("stop")
def embedded_stop() -> None:
    """Stop it."""
    from toolexec.embedded import stop_embedded

    stopped = stop_embedded(Settings.from_env().data_dir)
    click.echo("stopped" if stopped else "not running")


cli.add_command(breakers)
cli.add_command(fairness)
cli.add_command(faults)
cli.add_command(approvals)
cli.add_command(status)
cli.add_command(health)
cli.add_command(flower)
cli.add_command(trace)
cli.add_command(traces)
cli.add_command(mcp)
embedded.add_command(serve_embedded)


def main() -> None:
    # Library warnings on the way to an error (e.g. the shared clock unreadable when Redis
    # is down) must not print before the one line that says what is wrong: without a
    # handler, Python's last-resort one would. A worker's logging (Celery's) still gets them.
    logging.getLogger("toolexec").addHandler(logging.NullHandler())
    try:
        cli()
    except InfrastructureError as exc:  # from call and tools: the same line as every command's
        Unreachable(str(exc)).show()
        sys.exit(EXIT_UNREACHABLE)
    except ToolexecError as exc:
        click.echo(f"toolexec: {exc}", err=True)
        sys.exit(2)
