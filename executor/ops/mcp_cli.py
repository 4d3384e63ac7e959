"""``toolexec mcp``: serve the tool catalog to MCP clients over stdio or streamable HTTP;
``toolexec mcp login NAME``: sign in to a remote MCP server once, for the whole fleet.

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


@click.group("mcp", invoke_without_command=True)
@click.option(
    "--http",
    "listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio "
    "(beyond loopback only with TOOLEXEC_MCP_TOKEN).",
)
@click.pass_context
def mcp(ctx: click.Context, listen: str | None) -> None:
    """Serve the tool catalog to MCP clients; every tools/call is a toolexec call."""
    if ctx.invoked_subcommand is not None:
        return
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


@mcp.command("login")
@click.argument("name")
@click.option(
    "--tools",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Tools module declaring the server with mcp_server(..., oauth=OAuth(...)) "
    "(default: TOOLEXEC_TOOLS, as the workers).",
)
def login(name: str, modules: tuple[str, ...]) -> None:
    """Sign in to remote MCP server NAME (OAuth authorization code); the fleet uses the tokens.

    Prints the authorization URL; open it, sign in, and paste back the URL the browser
    lands on. Needs TOOLEXEC_MCP_TOKEN_KEY: the tokens are stored sealed in Redis.
    """
    try:
        from toolexec.mcp.login import login as sign_in
        from toolexec.mcp.servers import declared_servers
    except ImportError as exc:
        raise click.ClickException(
            f"toolexec mcp login needs the MCP SDK ({exc}); install: pip install 'toolexec[mcp]'"
        ) from exc
    from toolexec.ops.cli import _import_tools
    from toolexec.settings import Settings

    settings = Settings.from_env()
    _import_tools(list(modules) or settings.tools)
    found = {server.name: server for server in declared_servers()}
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise click.ClickException(f"no MCP server {name!r} is declared (declared: {known})")
    server = found[name].configured(settings.mcp_servers.get(name, {}))

    def ask(url: str) -> str:
        click.echo(f"Open this URL, sign in, then paste the address you are sent to:\n\n{url}\n")
        return str(click.prompt("redirect URL", hide_input=True, err=True))

    try:
        anyio.run(sign_in, server, ask, settings)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"signed in to {name}: the workers use these tokens from now on")
