"""How every ``toolexec`` subcommand reports a failure, so they all read and exit alike.

An operator scripts around exit codes, and a new user compares messages: an
unreachable Redis or broker must look the same whether ``call``, ``status``,
``breakers`` or ``faults`` met it. Exit codes: 0 done, 1 the command ran and
says no (a failed call, a refused name), 2 a usage error (click's own), 3 the
server toolexec runs on cannot be reached (nothing was changed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click
import redis

from toolexec.errors import InfrastructureError, ToolexecError

__all__ = ["EXIT_UNREACHABLE", "Unreachable", "reported"]

EXIT_UNREACHABLE = 3


class Unreachable(click.ClickException):
    """Redis or the broker does not answer: one line, ``toolexec:`` first, exit code 3."""

    exit_code = EXIT_UNREACHABLE

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"toolexec: {self.format_message()}", err=True, file=file)


@contextmanager
def reported() -> Iterator[None]:
    """toolexec's own errors as one line and an exit status, not a traceback."""
    try:
        yield
    except InfrastructureError as exc:
        raise Unreachable(str(exc)) from exc
    except redis.RedisError as exc:
        raise Unreachable(
            f"cannot reach Redis ({type(exc).__name__}: {exc}); nothing was changed. Check "
            "that the server is running and TOOLEXEC_REDIS_URL is right (unset it to use "
            "the embedded server)."
        ) from exc
    except ToolexecError as exc:
        raise click.ClickException(str(exc)) from exc
