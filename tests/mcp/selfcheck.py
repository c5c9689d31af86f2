"""Checks tests/mcp/server.py with the SDK's own clients, over stdio and streamable HTTP.

    $PES_PYVENV/bin/python tests/mcp/selfcheck.py

Exits non-zero on the first failed check. Not run by the Rust tests: it proves the peer
server does what they assume (tools, isError, _meta and headers, list_changed, the READY line,
SIGKILL then restart on the same port, SIGTERM).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import ToolListChangedNotification

SERVER = str(Path(__file__).with_name("server.py"))
COUNT_FILE = os.path.join(tempfile.mkdtemp(), "count")


def text(result) -> str:
    return "".join(block.text for block in result.content)


async def exercise(session: ClientSession, changed: anyio.Event, label: str) -> dict:
    init = await session.initialize()
    assert init.capabilities.tools is not None and init.capabilities.tools.list_changed, init.capabilities
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"echo", "add", "fail", "slow", "whoami", "count", "add_tool", "crash"}, tools
    assert tools["echo"].input_schema["additionalProperties"] is False

    assert text(await session.call_tool("echo", {"text": "hi"})) == "echo: hi"
    added = await session.call_tool("add", {"a": 2, "b": 3})
    assert text(added) == "5" and added.structured_content == {"sum": 5}, added
    failed = await session.call_tool("fail", {"message": "boom"})
    assert failed.is_error and text(failed) == "boom", failed
    assert text(await session.call_tool("slow", {"seconds": 0.1})) == "slept 0.1"

    who = json.loads(text(await session.call_tool("whoami", {}, meta={"pes/idempotencyKey": f"key-{label}"})))
    assert who["meta"]["pes/idempotencyKey"] == f"key-{label}", who

    first = int(text(await session.call_tool("count", {})))
    assert int(text(await session.call_tool("count", {}))) == first + 1

    name = f"dyn_{label}"
    assert text(await session.call_tool("add_tool", {"name": name})) == f"added {name}"
    with anyio.fail_after(5):
        await changed.wait()
    assert name in {t.name for t in (await session.list_tools()).tools}
    assert json.loads(text(await session.call_tool(name, {"x": 1}))) == {"x": 1}
    return who


def on_list_changed(changed: anyio.Event):
    async def handle(message) -> None:
        if isinstance(message, ToolListChangedNotification):
            changed.set()

    return handle


async def check_stdio() -> None:
    params = StdioServerParameters(command=sys.executable, args=[SERVER, "stdio"], env={"MCP_COUNT_FILE": COUNT_FILE})
    changed = anyio.Event()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=on_list_changed(changed)) as session:
            who = await exercise(session, changed, "stdio")
    assert who["headers"] == {}, who
    print("stdio ok; whoami:", json.dumps(who))


async def check_http(url: str) -> int:
    changed = anyio.Event()
    headers = {"Authorization": "Bearer selfcheck", "X-Pes-Test": "1"}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, message_handler=on_list_changed(changed)) as session:
                who = await exercise(session, changed, "http")
    assert who["headers"]["authorization"] == "Bearer selfcheck", who
    assert who["headers"]["x-pes-test"] == "1", who
    print("http ok; whoami:", json.dumps(who))
    return who["pid"]


def start_http(port: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "MCP_COUNT_FILE": COUNT_FILE}
    proc = subprocess.Popen(
        [sys.executable, SERVER, "http", "--port", str(port)], stdout=subprocess.PIPE, text=True, env=env
    )
    line = proc.stdout.readline().strip()
    assert line.startswith("READY http://127.0.0.1:") and line.endswith("/mcp"), line
    return proc, line.split(" ", 1)[1]


def main() -> None:
    anyio.run(check_stdio)

    started = time.monotonic()
    proc, url = start_http(0)
    print(f"READY after {time.monotonic() - started:.2f}s: {url}")
    assert anyio.run(check_http, url) == proc.pid

    proc.kill()  # a dead server; then it comes back on the same port
    proc.wait()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    proc, again = start_http(port)
    assert again == url, (again, url)
    assert anyio.run(check_http, url) == proc.pid
    print("restarted on the same port after SIGKILL: ok")

    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=10)
    assert code == 0, code
    print("SIGTERM: exit 0")
    print("all checks passed")


if __name__ == "__main__":
    main()
