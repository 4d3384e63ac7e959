"""Operators' commands: ``toolexec flower`` and ``toolexec embedded serve``.

``toolexec flower`` is ``celery -A toolexec.worker.app flower`` for the configured
broker, with basic auth from settings: the credentials travel to Flower in its
own ``FLOWER_BASIC_AUTH`` environment variable, so they never show in ``ps``,
in a Procfile or in a log line. Flower's REST API and task pages reveal
every call's arguments (secrets redacted) and can revoke tasks, so it refuses
to listen beyond loopback without auth. Without credentials Flower's API
answers nothing ("FLOWER_UNAUTHENTICATED_API environment variable is
required"); that variable would open it with ``Access-Control-Allow-Origin: *``,
to any web page the operator's browser opens, so toolexec refuses it and the
way in is credentials, on loopback too.

Flower splits ``FLOWER_BASIC_AUTH`` on commas into a list of accepted
``user:password`` pairs: a password ``a,b`` would let ``a`` and ``b`` in and
refuse itself, and a trailing comma adds the empty pair, which an empty
``Authorization: Basic`` header matches. So a user or password Flower cannot
carry is refused before Flower starts, and so is a non-ASCII one (Flower's
``hmac.compare_digest`` raises on it: every request would be a 500). Options
passed through to Flower may not set where it listens, its authentication or
a config file (which can set either): those go through toolexec's own options
and settings, or the loopback guard would be one ``-- --address=0.0.0.0`` away.

Flower also reads options from a ``flowerconfig.py`` in the working directory
(Python, run as it starts: ``basic_auth = []`` turns auth off) and from any
variable ``FLOWER_<name>``, the name in any case (``FLOWER_Conf`` names another
config file). So toolexec passes its own config file, ``flower_config.py``
beside this module, and removes every ``FLOWER_*`` variable, in any case, but
the few in :data:`FLOWER_ENV_KEPT`; ``FLOWER_UNAUTHENTICATED_API``, which opens
the API to any web page, makes it refuse to start.

``toolexec embedded serve`` runs the bundled Valkey in the foreground, with
persistence and ``noeviction``, for process managers (the Procfile) that
expect each service to stay in the foreground.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import redis

from toolexec.settings import Settings

__all__ = [
    "FLOWER_CONFIG",
    "FLOWER_ENV_KEPT",
    "SERVE_PORT",
    "basic_auth",
    "credential_problem",
    "flower",
    "flower_environment",
    "is_loopback",
    "refused_passthrough",
    "register_published_tools",
    "serve_embedded",
    "valkey_args",
]

#: Flower options that decide where it listens or who gets in: set only by toolexec.
_GUARDED_OPTIONS = frozenset(
    {
        "address", "port", "unix-socket", "basic-auth", "conf", "auth", "auth-provider",
    }
)  # fmt: skip

#: toolexec's own Flower config file, always passed as ``--conf``: without it Flower
#: reads ``flowerconfig.py`` from the working directory, Python that can set anything.
FLOWER_CONFIG = Path(__file__).with_name("flower_config.py")

#: The ``FLOWER_*`` variables ``toolexec flower`` passes on, exactly so spelled: what
#: Flower keeps and shows, never where it listens or who gets in. Flower reads every
#: option from ``FLOWER_<name>`` with the name in any case (``FLOWER_Conf`` is
#: ``--conf``), so every other variable whose name starts with ``FLOWER_`` in any case
#: is removed from its environment.
FLOWER_ENV_KEPT = frozenset(
    {
        "FLOWER_PERSISTENT", "FLOWER_DB", "FLOWER_STATE_SAVE_INTERVAL", "FLOWER_MAX_TASKS",
        "FLOWER_MAX_WORKERS", "FLOWER_PURGE_OFFLINE_WORKERS", "FLOWER_NATURAL_TIME",
        "FLOWER_TASKS_COLUMNS", "FLOWER_READ_ONLY", "FLOWER_INSPECT_TIMEOUT",
    }
)  # fmt: skip

#: Opens Flower's API to every origin when no auth is configured: never passed on, and
#: refused outright rather than dropped, since whoever set it expects an open API.
_UNAUTHENTICATED_API = "FLOWER_UNAUTHENTICATED_API"


def is_loopback(address: str) -> bool:
    """Whether ``address`` only accepts connections from this machine."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name, "" or "0.0.0.0"-like wildcard spellings
        return False


def credential_problem(user: str, password: str) -> str | None:
    """Why Flower's ``FLOWER_BASIC_AUTH`` cannot carry this pair as it is, or None.

    Never quotes the password: the answer is printed.
    """
    if "," in user or "," in password:
        return "Flower splits its basic-auth setting on commas, so neither may contain one"
    if ":" in user:
        return "a basic-auth user name cannot contain ':'"
    if not (user + password).isprintable():
        return "the user and password must be printable characters"
    if not (user + password).isascii():
        # Flower compares with hmac.compare_digest, which raises on non-ASCII text
        return "Flower fails every request (500) for a non-ASCII user or password; use ASCII"
    return None


def flower_environment(environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    """The ``FLOWER_*`` names to remove from Flower's environment, and why to refuse, or None.

    Names only, never values: the answer is printed.
    """
    flower = [name for name in environ if name.upper().startswith("FLOWER_")]
    if any(name.upper() == _UNAUTHENTICATED_API for name in flower):
        return [], (
            f"refusing {_UNAUTHENTICATED_API}: it opens Flower's API to any web page "
            "without authentication; unset it (toolexec flower's auth comes only from "
            "TOOLEXEC_FLOWER_USER and TOOLEXEC_FLOWER_PASSWORD; call the API with them: "
            "curl -u USER:PASSWORD http://127.0.0.1:5555/api/workers)"
        )
    return sorted(name for name in flower if name not in FLOWER_ENV_KEPT), None


def basic_auth(settings: Settings) -> str | None:
    """``user:password`` for Flower, or None when the settings give no complete pair.

    Raises :class:`click.ClickException` for a pair Flower would mangle.
    """
    password = settings.flower_password.get_secret_value() if settings.flower_password else ""
    if not settings.flower_user or not password:
        return None
    problem = credential_problem(settings.flower_user, password)
    if problem is not None:
        raise click.ClickException(
            f"refusing TOOLEXEC_FLOWER_USER/TOOLEXEC_FLOWER_PASSWORD: {problem}; "
            "choose another password"
        )
    return f"{settings.flower_user}:{password}"


def refused_passthrough(flower_args: tuple[str, ...]) -> str | None:
    """The first pass-through option that would change where Flower listens or who gets
    in, or None."""
    for arg in flower_args:
        name = arg.lstrip("-").split("=", 1)[0].replace("_", "-").lower()
        if arg.startswith("-") and name in _GUARDED_OPTIONS:
            return f"option --{name}"
    return None


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--address", default=None, help="Listen address (default TOOLEXEC_FLOWER_ADDRESS).")
@click.option("--port", type=int, default=None, help="Port (default TOOLEXEC_FLOWER_PORT).")
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
def flower(address: str | None, port: int | None, flower_args: tuple[str, ...]) -> None:
    """Start Flower for the configured broker, behind basic auth from settings.

    Credentials come from TOOLEXEC_FLOWER_USER and TOOLEXEC_FLOWER_PASSWORD.
    Without them Flower starts only on a loopback address. Other Flower
    options (e.g. --persistent=True) are passed through.
    """
    settings = Settings.from_env()
    refused = refused_passthrough(flower_args)
    if refused is not None:
        raise click.ClickException(
            f"refusing {refused}: where Flower listens and its authentication are set only "
            "with toolexec flower --address/--port and TOOLEXEC_FLOWER_* settings"
        )
    listen = settings.flower_address if address is None else address
    auth = basic_auth(settings)
    if auth is None and not is_loopback(listen):
        raise click.ClickException(
            f"refusing to serve Flower on {listen!r} without authentication: set "
            "TOOLEXEC_FLOWER_USER and TOOLEXEC_FLOWER_PASSWORD, or listen on 127.0.0.1"
        )
    _clean_environment()
    if auth is not None:
        os.environ["FLOWER_BASIC_AUTH"] = auth
    from toolexec.worker.app import app

    register_published_tools(app, settings)
    argv = [
        "flower",
        f"--conf={FLOWER_CONFIG}",
        f"--address={listen}",
        f"--port={settings.flower_port if port is None else port}",
        *flower_args,
    ]
    app.start(argv)


def _clean_environment() -> None:
    """Leave Flower only the ``FLOWER_*`` variables toolexec documents; refuse the API opener."""
    dropped, refusal = flower_environment(os.environ)
    if refusal is not None:
        raise click.ClickException(refusal)
    for name in dropped:
        os.environ.pop(name, None)
    if dropped:
        click.echo(
            f"toolexec flower: ignoring {', '.join(dropped)} (only TOOLEXEC_FLOWER_* settings "
            f"and {', '.join(sorted(FLOWER_ENV_KEPT))} reach Flower)",
            err=True,
        )


def register_published_tools(celery_app: Any, settings: Settings) -> list[str]:
    """Name every published tool as a task here, so Flower's start-up list shows them.

    Flower lists the tasks its own process registered; it runs none, and has
    none of the tools' code, so the names come from the catalog the workers
    published (a task that refuses to run), next to toolexec's own tasks.
    """
    import toolexec.tasks  # noqa: F401  (toolexec.fallback and the built-in tools)
    from toolexec.connection import redis_client, redis_url
    from toolexec.keys import Keys
    from toolexec.stores import catalog

    try:
        with contextlib.closing(redis_client(redis_url(settings), socket_timeout=5.0)) as client:
            names = sorted(catalog.read(client, Keys(settings.key_prefix)))
    except redis.RedisError:  # Flower itself will say the broker is unreachable
        return []
    added = []
    for name in names:
        task = f"tools.{name}"
        if task not in celery_app.tasks:
            celery_app.task(name=task, shared=False)(_runs_on_workers)
            added.append(task)
    return added


def _runs_on_workers(**_: Any) -> None:
    """A tool's name in Flower's process; its code and its calls live on the workers."""
    raise RuntimeError("tool calls run on toolexec workers, not in Flower")


def valkey_args(binary: Path, port: int, data_dir: Path, bind: str) -> list[str]:
    """A foreground Valkey fit to be a broker: no eviction, an append-only file."""
    return [
        str(binary),
        "--bind",
        bind,
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        # A broker must never silently drop messages to free memory (docs/background.md, Celery).
        "--maxmemory-policy",
        "noeviction",
    ]


#: A port of its own, beside a system Redis on 6379 (the Procfile's VALKEY_PORT default too).
SERVE_PORT = 6380


@click.command("serve")
@click.option(
    "--port",
    type=int,
    default=SERVE_PORT,
    show_default=True,
    help="Port to listen on (not 6379, which a system Redis may hold).",
)
@click.option("--bind", default="127.0.0.1", show_default=True)
@click.option(
    "--dir",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the append-only file lives (default: TOOLEXEC_DATA_DIR/valkey-serve).",
)
def serve_embedded(port: int, bind: str, data_dir: Path | None) -> None:
    """Run the bundled Valkey in the foreground (for honcho, foreman, systemd)."""
    from toolexec.embedded import _binary

    where = data_dir or Settings.from_env().data_dir / "valkey-serve"
    where.mkdir(parents=True, exist_ok=True)
    args = valkey_args(_binary(), port, where, bind)
    os.execv(args[0], args)
