"""A small MCP client over the official Python MCP SDK (`mcp`), which the Rust black-box tests of
pes-server's own MCP server (`tests/api/mcp_server.rs`) run as a process:

    python tests/mcp/client.py list BASE [--key K] [--mode auto|legacy]
    python tests/mcp/client.py call BASE TOOL --args JSON [--key K] [--mode auto|legacy]
                                [--progress] [--elicit JSON]

BASE is the server's origin; the endpoint is BASE/mcp. `--mode auto` (the SDK's default) probes
`server/discover` and speaks revision 2026-07-28; `legacy` forces the `initialize` handshake.
`--progress` asks for progress notifications; `--elicit` declares the elicitation capability
and answers every elicitation with that JSON (`{"action", "content"?}`), so a call that needs a
person takes the 2026-07-28 input-required round trip.

Prints one JSON object per line, flushed at once: `{"connected": {"protocolVersion"}}`, then
for `list` `{"tools": [{name, title, description, inputSchema, outputSchema}]}`, for `call`
`{"progress": {progress, message}}` per notification, `{"elicited": {message,
requestedSchema}}` per elicitation, and `{"result": {isError, text, structured}}`. An error
prints `{"error": {"type", "message", "code"?}}` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import httpx2

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
import mcp_types as types


def emit(obj: object) -> None:
    print(json.dumps(obj, sort_keys=True, default=str), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["list", "call"])
    parser.add_argument("base")
    parser.add_argument("tool", nargs="?")
    parser.add_argument("--args", default="{}")
    parser.add_argument("--key")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--elicit")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=120.0))
    transport = streamable_http_client(f"{args.base}/mcp", http_client=http)

    elicitation_callback = None
    if args.elicit is not None:
        answer = json.loads(args.elicit)

        async def elicitation_callback(context, params):
            emit({"elicited": {"message": params.message, "requestedSchema": params.requested_schema}})
            return types.ElicitResult(action=answer["action"], content=answer.get("content"))

    try:
        async with Client(
            transport, mode=args.mode, elicitation_callback=elicitation_callback, read_timeout_seconds=120
        ) as client:
            emit({"connected": {"protocolVersion": client.protocol_version}})
            if args.command == "list":
                result = await client.list_tools()
                emit(
                    {
                        "tools": [
                            {
                                "name": t.name,
                                "title": t.title,
                                "description": t.description,
                                "inputSchema": t.input_schema,
                                "outputSchema": t.output_schema,
                            }
                            for t in result.tools
                        ]
                    }
                )
                return

            async def progress(value: float, total: float | None, message: str | None) -> None:
                emit({"progress": {"progress": value, "total": total, "message": message}})

            result = await client.call_tool(
                args.tool,
                json.loads(args.args),
                progress_callback=progress if args.progress else None,
            )
            text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
            emit({"result": {"isError": bool(result.is_error), "text": text, "structured": result.structured_content}})
    except BaseException as e:  # noqa: BLE001 - the test reads what failed
        mcp_error = find_mcp_error(e)
        if mcp_error is not None:
            err = mcp_error.error
            emit({"error": {"type": "MCPError", "message": err.message, "code": err.code, "data": err.data}})
        else:
            emit({"error": {"type": type(e).__name__, "message": describe(e)}})
        sys.exit(1)


def find_mcp_error(e: BaseException) -> MCPError | None:
    """The MCP error inside `e` (the SDK raises it wrapped in task-group exception groups)."""
    if isinstance(e, MCPError):
        return e
    if isinstance(e, BaseExceptionGroup):
        for inner in e.exceptions:
            found = find_mcp_error(inner)
            if found is not None:
                return found
    if e.__cause__ is not None:
        return find_mcp_error(e.__cause__)
    return None


def describe(e: BaseException) -> str:
    causes = []
    cur: BaseException | None = e
    while cur is not None:
        causes.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or (cur.exceptions[0] if isinstance(cur, BaseExceptionGroup) and cur.exceptions else None)
    return " <- ".join(causes)

if __name__ == "__main__":
    anyio.run(main)
