"""A remote MCP server for the proxy tests, made with the official SDK, failing on command.

Run as ``python mcp_remote_server.py PORT``; it serves streamable HTTP at
``http://127.0.0.1:PORT/mcp``. ``--stdio`` instead of a port serves stdio (without
control); ``PORT --token T`` makes requests need ``Authorization: Bearer T``.
``POST /control`` with ``{"fail": [503, 503]}`` makes the next ``tools/call``
requests answer those HTTP statuses (with ``"retry_after"`` as a Retry-After
header); ``GET /control`` returns what it saw: calls per tool and writes per key.
``add_tool`` in a control request registers one more tool and sends
``tools/list_changed``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections import Counter, deque
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

calls: Counter[str] = Counter()
writes: Counter[str] = Counter()
failures: deque[tuple[int, str | None]] = deque()
lock = threading.Lock()

server = MCPServer("remote-test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str, times: int = 1) -> dict[str, Any]:
    """Echo the text back, times times."""
    calls["echo"] += 1
    return {"echo": text * times}


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
async def write(key: str, delay: float = 0.0) -> dict[str, Any]:
    """Record a write of key (counted when it arrives), after delay seconds."""
    calls["write"] += 1
    writes[key] += 1
    await asyncio.sleep(delay)
    return {"written": key}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def refuse(reason: str) -> str:
    """Fails inside the tool: the SDK answers isError."""
    calls["refuse"] += 1
    raise ValueError(f"refused: {reason}")


class Name(BaseModel):
    name: str


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def greet(ctx: Context) -> str:
    """Asks its client for a name (elicitation) and greets it."""
    calls["greet"] += 1
    answer = await ctx.elicit("What is your name?", Name)
    if answer.action != "accept":
        return f"no name: {answer.action}"
    return f"hello {answer.data.name}"


class FailOnCommand:
    """Answers queued HTTP statuses to tools/call requests, before the MCP app sees them.

    With a token, a request to /mcp without ``Authorization: Bearer <token>`` gets 401.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp" and self.token:
            given = dict(scope["headers"]).get(b"authorization", b"").decode()
            if given != f"Bearer {self.token}":
                await Response("unauthorized", status_code=401)(scope, receive, send)
                return
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/mcp":
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        failure = None
        if b'"tools/call"' in body:
            with lock:
                failure = failures.popleft() if failures else None
        if failure is not None:
            status, retry_after = failure
            headers = {"retry-after": retry_after} if retry_after else {}
            await Response("failing on command", status_code=status, headers=headers)(
                scope, receive, send
            )
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def control(request: Request) -> Response:
    if request.method == "POST":
        order = json.loads(await request.body())
        with lock:
            if order.get("clear"):
                failures.clear()
            for status in order.get("fail", []):
                failures.append((int(status), order.get("retry_after")))
        if order.get("add_tool"):
            name = order["add_tool"]
            server.add_tool(lambda: name, name=name, description=f"added at run time: {name}")
            for session in list(sessions):
                await session.send_tool_list_changed()
    with lock:
        return JSONResponse(
            {"calls": dict(calls), "writes": dict(writes), "pending_failures": len(failures)}
        )


sessions: set[Any] = set()


def main() -> None:
    if sys.argv[1] == "--stdio":
        server.run("stdio")
        return
    port = int(sys.argv[1])
    token = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--token" else None
    low = server._lowlevel_server
    original = low.get_request_handler("tools/list")
    assert original is not None

    async def list_tools(ctx: Any, params: Any) -> Any:
        sessions.add(ctx.session)
        return await original.handler(ctx, params)

    low.add_request_handler("tools/list", original.params_type, list_tools)
    app = server.streamable_http_app()
    app.router.routes.append(Route("/control", control, methods=["GET", "POST"]))
    uvicorn.run(FailOnCommand(app, token), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
