"""``toolexec mcp``: serve the tool catalog to MCP clients over stdio or streamable HTTP.

The SDK is imported when the command runs, so ``toolexec`` works without the
``mcp`` extra installed and says how to get it when this command is used.
"""

from __future__ import annotations

import logging
import sys

import anyio
import click

from toolexec.errors import ConfigurationError

__all__ = ["mcp"]


@click.command("mcp")
@click.option(
    "--http",
    "listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio "
    "(beyond loopback only with TOOLEXEC_MCP_TOKEN).",
)
def mcp(listen: str | None) -> None:
    """Serve the tool catalog to MCP clients; every tools/call is a toolexec call."""
    try:
        from toolexec.mcp.server import McpFront
        from toolexec.mcp.transports import check_bind, parse_listen, serve_http, serve_stdio
    except ImportError as exc:  # the extra is missing
        raise click.ClickException(
            f"toolexec mcp needs the MCP SDK ({exc}); install it with: pip install 'toolexec[mcp]'"
        ) from exc
    from toolexec.client import ToolClient
    from toolexec.settings import Settings

    # stdout carries the protocol over stdio: every log line goes to stderr
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
    settings = Settings.from_env()
    host, port = "", 0
    if listen is not None:  # refused before anything connects anywhere
        try:
            host, port = parse_listen(listen)
            check_bind(host, settings)
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from exc
    with ToolClient(settings) as client:
        front = McpFront(client)
        if listen is None:
            anyio.run(serve_stdio, front)
            return
        click.echo(f"toolexec mcp: serving http://{listen}/mcp", err=True)
        anyio.run(serve_http, front, host, port)
