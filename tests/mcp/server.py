"""The MCP peer server the MCP client tests talk to, built on the official Python MCP SDK.

One server, two transports, chosen by argv:

    python tests/mcp/server.py stdio
    python tests/mcp/server.py http [--port N]

`stdio` serves on stdin/stdout (stdout carries only protocol messages; logs go to stderr).
`http` serves streamable HTTP with stateful sessions at http://127.0.0.1:PORT/mcp and prints
one line `READY http://127.0.0.1:PORT/mcp` once it accepts connections; `--port 0` (or no
port) binds a free port. The socket is bound here with SO_REUSEADDR, so a test that SIGKILLs
the server can restart it on the same port at once. SIGTERM shuts it down cleanly.

The tools are small probes for the client's behaviour: arguments and results (echo, add),
tool errors (fail), time-outs (slow), what a call carried (whoami), exactly-once calls
(count), list changes (add_tool) and a peer that dies mid-call (crash).
"""

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, TypedDict

import anyio
import uvicorn
from mcp.server.lowlevel import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, TextContent

# Handshake-era clients learn `tools.listChanged` from `initialize`; the SDK reads it from the
# notification options, which default to off. (2026-era clients see it because the server serves
# `subscriptions/listen`.)
LIST_CHANGED = NotificationOptions(tools_changed=True)

log = logging.getLogger("mcp-peer")


def number(x: float) -> int | float:
    """5.0 -> 5, 0.5 -> 0.5: JSON numbers as a person would write them."""
    return int(x) if float(x).is_integer() else x


async def echo(text: str) -> str:
    """Returns the text, prefixed with 'echo: '."""
    return f"echo: {text}"


class Sum(TypedDict):
    sum: float


async def add(a: float, b: float) -> Annotated[CallToolResult, Sum]:
    """Adds two numbers; the sum as text and as structured content {"sum": ...}."""
    total = number(a + b)
    return CallToolResult(content=[TextContent(type="text", text=str(total))], structured_content={"sum": total})


async def fail(message: str) -> CallToolResult:
    """Always fails: a tool result with isError true carrying the message."""
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


async def slow(seconds: float) -> str:
    """Sleeps for the given number of seconds, then answers 'slept <seconds>'."""
    await anyio.sleep(seconds)
    return f"slept {number(seconds)}"


async def whoami(ctx: Context) -> str:
    """Reports what this call carried: its _meta, the HTTP request headers, the server's pid and
    the names of the environment variables it was started with."""
    params = ctx.request_context.params or {}
    meta = params.get("_meta")  # the raw object the client sent: every key kept
    headers = ctx.headers
    return json.dumps(
        {
            "meta": meta,
            "headers": {k.lower(): v for k, v in headers.items()} if headers is not None else {},
            "pid": os.getpid(),
            "env": sorted(os.environ),
        }
    )


in_process_count = 0


async def count() -> str:
    """Appends a line to $MCP_COUNT_FILE and answers how many lines it now holds."""
    global in_process_count
    path = os.environ.get("MCP_COUNT_FILE")
    if not path:
        in_process_count += 1
        return str(in_process_count)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    with open(path, encoding="utf-8") as f:
        return str(sum(1 for _ in f))


async def add_tool(name: str, ctx: Context) -> str:
    """Registers a new tool <name> that echoes its arguments as JSON, and announces the change."""

    async def added(ctx: Context) -> str:
        params = ctx.request_context.params or {}
        return json.dumps(params.get("arguments") or {})

    ctx.mcp_server.add_tool(
        added,
        name=name,
        description="Echoes its arguments as JSON (added by add_tool).",
        structured_output=False,
    )
    # Handshake-era sessions get the notification on their stream; 2026-era clients on their
    # `subscriptions/listen` stream (the bus).
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    log.info("added tool %r", name)
    return f"added {name}"


async def crash() -> str:
    """Kills the server process at once, without answering."""
    os._exit(3)


def strict(tool: Tool) -> Tool:
    """The SDK's argument schemas leave extra properties open; these tools take none."""
    tool.parameters["additionalProperties"] = False
    return tool


def build() -> MCPServer:
    # Only `add` declares an output schema: a plain `-> str` would otherwise be published as
    # {"result": string} and echoed into structuredContent.
    tools = [
        strict(Tool.from_function(fn, structured_output=None if fn is add else False))
        for fn in (echo, add, fail, slow, whoami, count, add_tool, crash)
    ]
    server = MCPServer("pes-mcp-peer", version="1", tools=tools, log_level="INFO")
    low = server._lowlevel_server  # the HTTP session manager asks it for the initialize result
    default_options = low.create_initialization_options

    def with_list_changed(notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any):
        return default_options(notification_options or LIST_CHANGED, *args, **kwargs)

    low.create_initialization_options = with_list_changed
    return server


async def until_terminated(stop: Callable[[], Awaitable[None]]) -> None:
    """Waits for SIGTERM or SIGINT, then stops the server with `stop`."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: shutting down", signum)
            await stop()
            return


async def serve_stdio(server: MCPServer) -> None:
    async def stop() -> None:
        # The SDK reads stdin in a worker thread that no cancellation reaches: a peer with
        # nothing to save just leaves.
        os._exit(0)

    low = server._lowlevel_server
    async with anyio.create_task_group() as tg:
        tg.start_soon(until_terminated, stop)
        async with stdio_server() as (read, write):
            await low.run(read, write, low.create_initialization_options())
        tg.cancel_scope.cancel()  # stdin closed: stop watching for signals


class Uvicorn(uvicorn.Server):
    """uvicorn that leaves signals to `until_terminated`: its own handlers re-raise SIGTERM after
    shutting down, so the process would die by the signal instead of exiting 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(server: MCPServer, port: int) -> None:
    host = "127.0.0.1"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(host=host)
    uv = Uvicorn(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="on"))

    async def stop() -> None:
        # Open SSE streams and calls in flight would hold uvicorn's graceful shutdown: end the
        # sessions first (the SDK itself ends them only after the connections have closed).
        for transport in list(server.session_manager._server_instances.values()):
            await transport.terminate()
        uv.should_exit = True

    async def run() -> None:
        await uv.serve(sockets=[sock])
        tg.cancel_scope.cancel()  # stops the signal watcher

    async with anyio.create_task_group() as tg:
        tg.start_soon(until_terminated, stop)
        tg.start_soon(run)
        while not uv.started and not uv.should_exit:
            await anyio.sleep(0.01)
        if uv.started:
            print(f"READY http://{host}:{port}/mcp", flush=True)


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="mcp-peer %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="transport", required=True)
    sub.add_parser("stdio", help="serve on stdin/stdout")
    http = sub.add_parser("http", help="serve streamable HTTP on 127.0.0.1")
    http.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    args = parser.parse_args()

    server = build()
    if args.transport == "stdio":
        anyio.run(serve_stdio, server)
    else:
        anyio.run(serve_http, server, args.port)


if __name__ == "__main__":
    main()
