"""Remote A2A agents the A2A client tests delegate to, built on the official Python A2A SDK.

    python tests/a2a/agents.py KIND [--port N] [--protocol 1.0|0.3] [--seconds S]

KIND is one of
  echo     completes at once with an artifact `echo: <the user's text>`
  slow     works for --seconds (default 3), sending `working` updates with progress text, then
           completes with an artifact `slow: done after S s`; a CancelTask ends it as `canceled`
  input    answers a new task with `input-required` ("What is your name?"); a follow-up message on
           the same task completes it with an artifact `hello, <answer>`
  failing  ends the task `failed`, the status message explaining why
  count    like echo, and appends one line `<taskId> <text>` to the file named by $A2A_COUNT_FILE
           for every new task created (proves a delegation is never sent twice)

The agent binds 127.0.0.1:PORT itself (--port 0: a free port; SO_REUSEADDR, so a test that SIGKILLs
it can restart it on the same port at once), serves its card at /.well-known/agent-card.json and
JSON-RPC at /a2a, and prints one stdout line `READY http://127.0.0.1:PORT` once it accepts
connections. Tasks live in memory: a restart forgets them. SIGTERM shuts it down cleanly.

--protocol 1.0 (default) is the SDK's v1.0 JSON-RPC binding only (method names `SendMessage`, ...;
the SDK refuses them without an `A2A-Version: 1.0` header). --protocol 0.3 is a v0.3-only agent:
a v0.3 card (top-level `url`, `protocolVersion: "0.3"`, no `supportedInterfaces`) and only the v0.3
method names (`message/send`, ...), served by the SDK's v0.3 compatibility adapter; v1.0 names get
JSON-RPC -32601 as from a v0.3 server.
"""

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator

import anyio
import uvicorn
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.helpers import new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Task, TaskState, TaskStatus
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

log = logging.getLogger("a2a-peer")

KINDS = ("echo", "slow", "input", "failing", "count")
RPC_PATH = "/a2a"

SKILLS = {
    "echo": ("Echo", "Answers with the text it was sent, prefixed with 'echo: '."),
    "slow": ("Slow work", "Works for a few seconds, reporting progress, then answers; can be cancelled."),
    "input": ("Greeter", "Asks for your name, then greets you."),
    "failing": ("Always fails", "Fails every task, saying why."),
    "count": ("Counted echo", "Echoes, and counts every new task in a file."),
}


class PeerExecutor(AgentExecutor):
    """One executor for every kind: the kind picks the behaviour after the common task set-up."""

    def __init__(self, kind: str, seconds: float, count_file: str | None) -> None:
        self.kind = kind
        self.seconds = seconds
        self.count_file = count_file

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        text = context.get_user_input()
        task = context.current_task
        if task is None:
            # The SDK wants a Task before any status update; the user's message is its history.
            history = [context.message] if context.message else []
            task = Task(id=task_id, context_id=context_id, status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED), history=history)
            await event_queue.enqueue_event(task)
            if self.kind == "count":
                self.count(task_id, text)
        up = TaskUpdater(event_queue, task_id, context_id)
        say = up.new_agent_message

        if self.kind in ("echo", "count"):
            await up.add_artifact([new_text_part(f"echo: {text}")], name="echo")
            await up.complete()
        elif self.kind == "slow":
            steps = 3
            for step in range(1, steps + 1):
                await up.start_work(say([new_text_part(f"working: step {step} of {steps}")]))
                await anyio.sleep(self.seconds / steps)
            await up.add_artifact([new_text_part(f"slow: done after {self.seconds:g} s")], name="result")
            await up.complete()
        elif self.kind == "input":
            if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
                await up.requires_input(say([new_text_part("What is your name?")]))
                return  # the follow-up message on this task calls execute again
            await up.add_artifact([new_text_part(f"hello, {text}")], name="greeting")
            await up.complete()
        elif self.kind == "failing":
            await up.start_work()
            await up.failed(say([new_text_part(f"the failing agent always fails (it was asked: {text})")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        # The SDK cancels the running execute() right after this returns.
        up = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await up.cancel(up.new_agent_message([new_text_part("canceled on request")]))

    def count(self, task_id: str, text: str) -> None:
        if not self.count_file:
            log.warning("count: A2A_COUNT_FILE is not set; not counting")
            return
        with open(self.count_file, "a", encoding="utf-8") as f:
            f.write(f"{task_id} {text}\n")
            f.flush()
            os.fsync(f.fileno())


class V03OnlyDispatcher(JsonRpcDispatcher):
    """The SDK's JSON-RPC dispatcher with the v1.0 method names removed: only the v0.3 adapter
    answers, so the agent behaves as a v0.3 server (a v1.0 name is an unknown method, -32601)."""

    METHOD_TO_MODEL: dict[str, type] = {}


def build_card(kind: str, base: str, protocol: str) -> AgentCard:
    name, description = SKILLS[kind]
    return AgentCard(
        name=f"{kind} agent",
        description=f"A test peer: {description}",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=base + RPC_PATH, protocol_binding="JSONRPC", protocol_version=protocol)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id=kind, name=name, description=description, tags=["test", kind], examples=[f"{kind} this"])],
    )


def build_app(kind: str, base: str, protocol: str, seconds: float) -> tuple[Starlette, DefaultRequestHandler]:
    card = build_card(kind, base, protocol)
    executor = PeerExecutor(kind, seconds, os.environ.get("A2A_COUNT_FILE"))
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    if protocol == "1.0":
        routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url=RPC_PATH, shutdown_grace_period=0.5)
    else:
        # A v0.3 server serves a v0.3 card only (the SDK's own route would add `supportedInterfaces`).
        v03_card = to_compat_agent_card(card).model_dump(mode="json", by_alias=True, exclude_none=True)

        async def get_card(_: Request) -> JSONResponse:
            return JSONResponse(v03_card)

        dispatcher = V03OnlyDispatcher(request_handler=handler, enable_v0_3_compat=True, shutdown_grace_period=0.5)
        routes = [
            Route(AGENT_CARD_WELL_KNOWN_PATH, get_card, methods=["GET"]),
            Route(RPC_PATH, dispatcher.handle_requests, methods=["POST"]),
        ]
    return Starlette(routes=routes), handler


class Uvicorn(uvicorn.Server):
    """uvicorn that leaves signals to `until_terminated`: its own handlers re-raise SIGTERM after
    shutting down, so the process would die by the signal instead of exiting 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def until_terminated(stop: Callable[[], Awaitable[None]]) -> None:
    """Waits for SIGTERM or SIGINT, then stops the server with `stop`."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: shutting down", signum)
            await stop()
            return


async def serve(kind: str, port: int, protocol: str, seconds: float) -> None:
    host = "127.0.0.1"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    port = sock.getsockname()[1]
    base = f"http://{host}:{port}"
    app, handler = build_app(kind, base, protocol, seconds)
    uv = Uvicorn(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off"))

    async def stop() -> None:
        uv.should_exit = True
        await handler.aclose()  # ends running executors, so open streams close

    async def run() -> None:
        await uv.serve(sockets=[sock])
        tg.cancel_scope.cancel()  # stops the signal watcher

    async with anyio.create_task_group() as tg:
        tg.start_soon(until_terminated, stop)
        tg.start_soon(run)
        while not uv.started and not uv.should_exit:
            await anyio.sleep(0.01)
        if uv.started:
            print(f"READY {base}", flush=True)


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="a2a-peer %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    parser.add_argument("--protocol", choices=("1.0", "0.3"), default="1.0", help="A2A protocol version served")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long the slow agent works")
    args = parser.parse_args()
    anyio.run(serve, args.kind, args.port, args.protocol, args.seconds)


if __name__ == "__main__":
    main()
