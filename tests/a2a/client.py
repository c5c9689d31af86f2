"""A small command-line A2A client over the official A2A Python SDK (`a2a-sdk`), which the Rust
black-box tests (`tests/api/a2a_server.rs`) run as a process against pes-server.

Every command resolves the agent card at BASE (`/.well-known/agent-card.json`) with the SDK's
`A2ACardResolver`, builds a client with its `ClientFactory` (JSON-RPC; protocol 1.0 unless
`--protocol 0.3` keeps only the card's 0.3 interface, which makes the SDK speak v0.3), and prints
one JSON object per line on stdout, flushed at once:

    card        the card as the SDK parsed it
    send        a blocking (or, with --no-wait, an immediate) SendMessage: the task
    stream      SendStreamingMessage: every event, as it arrives
    get         GetTask
    cancel      CancelTask
    resubscribe SubscribeToTask: every event, as it arrives
    list        ListTasks

Events are ProtoJSON (`{"task": …}`, `{"statusUpdate": …}`, `{"artifactUpdate": …}`), whatever
the protocol version on the wire: the SDK converts v0.3 answers. An error prints
`{"error": {"type", "message", "code"}}` and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

import httpx
from google.protobuf.json_format import MessageToDict, ParseDict

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
)


def emit(obj: object) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


def to_json(message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=False)


async def make_client(args, streaming: bool):
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60.0))
    card = await A2ACardResolver(http, args.base).get_agent_card()
    if args.protocol:
        keep = [i for i in card.supported_interfaces if i.protocol_version.startswith(args.protocol)]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(keep)
    config = ClientConfig(streaming=streaming, httpx_client=http)
    return ClientFactory(config).create(card), http, card


def build_message(args) -> Message:
    parts = []
    if args.text is not None:
        parts.append(Part(text=args.text))
    if args.data is not None:
        part = Part()
        ParseDict({"data": json.loads(args.data)}, part)
        parts.append(part)
    message = Message(message_id=args.message_id or str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts)
    if args.context:
        message.context_id = args.context
    if args.task:
        message.task_id = args.task
    return message


async def run(args) -> None:
    streaming = args.command in ("stream", "resubscribe")
    client, http, card = await make_client(args, streaming)
    try:
        if args.command == "card":
            emit(to_json(card))
        elif args.command in ("send", "stream"):
            request = SendMessageRequest(message=build_message(args))
            if args.no_wait:
                request.configuration.return_immediately = True
            async for event in client.send_message(request):
                emit(to_json(event))
        elif args.command == "get":
            request = GetTaskRequest(id=args.task)
            if args.history is not None:
                request.history_length = args.history
            emit(to_json(await client.get_task(request)))
        elif args.command == "cancel":
            emit(to_json(await client.cancel_task(CancelTaskRequest(id=args.task))))
        elif args.command == "resubscribe":
            async for event in client.subscribe(SubscribeToTaskRequest(id=args.task)):
                emit(to_json(event))
        elif args.command == "list":
            request = ListTasksRequest()
            if args.context:
                request.context_id = args.context
            if args.status:
                ParseDict({"status": args.status}, request)
            if args.page_size:
                request.page_size = args.page_size
            if args.page_token:
                request.page_token = args.page_token
            emit(to_json(await client.list_tasks(request)))
    finally:
        await client.close()
        await http.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["card", "send", "stream", "get", "cancel", "resubscribe", "list"]
    )
    parser.add_argument("base", help="the agent's base URL (its card is at /.well-known/agent-card.json)")
    parser.add_argument("--key", help="API key, sent as Authorization: Bearer")
    parser.add_argument("--protocol", choices=["1.0", "0.3"], help="speak only this version")
    parser.add_argument("--text", help="a text part")
    parser.add_argument("--data", help="a data part (JSON)")
    parser.add_argument("--context", help="contextId")
    parser.add_argument("--task", help="taskId")
    parser.add_argument("--message-id", help="messageId (default: a fresh UUID)")
    parser.add_argument("--no-wait", action="store_true", help="send: returnImmediately")
    parser.add_argument("--history", type=int, help="get: historyLength")
    parser.add_argument("--status", help="list: a TaskState (TASK_STATE_WORKING…)")
    parser.add_argument("--page-size", type=int)
    parser.add_argument("--page-token")
    args = parser.parse_args()
    try:
        asyncio.run(run(args))
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        emit({"error": {"type": type(e).__name__, "message": str(e), "code": getattr(e, "code", None)}})
        sys.exit(1)


if __name__ == "__main__":
    main()
