"""Checks tests/a2a/agents.py with the official A2A SDK's own client, on both protocol settings.

    python tests/a2a/selfcheck_agents.py [-v]

Starts each kind of agent as a process (`--port 0`, reads its READY line) and drives it with the
SDK client: send, stream, get, cancel on slow, resubscribe, input-required then follow-up, failing,
count; then raw JSON-RPC probes of the A2A-Version header, GetTask for an unknown task after a
kill -9 and restart on the same port, and a clean exit on SIGTERM with a stream open. With -v it
prints the card and the wire JSON of one SSE event of each kind. Exits non-zero on the first
failed check; prints `N passed, 0 failed` at the end.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from a2a.client import ClientConfig, create_client
from a2a.helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types import CancelTaskRequest, GetTaskRequest, Role, SendMessageRequest, SubscribeToTaskRequest, TaskState
from a2a.utils.errors import A2AError

AGENTS = Path(__file__).with_name("agents.py")
VERBOSE = "-v" in sys.argv
passed = 0
wire_events: dict[str, dict[str, Any]] = {}  # first SSE `result` seen per kind of event


def check(cond: bool, what: str) -> None:
    global passed
    if not cond:
        print(f"FAIL: {what}", flush=True)
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1
    print(f"ok: {what}", flush=True)


def start(kind: str, protocol: str, port: int = 0, extra: list[str] | None = None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(AGENTS), kind, "--port", str(port), "--protocol", protocol, *(extra or [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None if VERBOSE else subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})})
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"{kind}: no READY line, got {line!r}")
    return proc, line.removeprefix("READY ")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=10)


class Recorder(httpx.AsyncBaseTransport):
    """Keeps the first wire JSON of each SSE event kind (task, statusUpdate, artifactUpdate, ...)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if "text/event-stream" not in response.headers.get("content-type", ""):
            return response
        stream = response.stream

        class Tee(httpx.AsyncByteStream):
            async def __aiter__(self):
                buf = b""
                async for chunk in stream:  # type: ignore[union-attr]
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.startswith(b"data:"):
                            record(json.loads(line[5:]))
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()  # type: ignore[union-attr]

        return httpx.Response(response.status_code, headers=response.headers, stream=Tee(), extensions=response.extensions)


def record(envelope: dict[str, Any]) -> None:
    result = envelope.get("result")
    if not isinstance(result, dict):
        wire_events.setdefault("error", envelope)
        return
    if "kind" in result:  # v0.3: the event itself, tagged by `kind`
        kind, inner = f"v0.3 {result['kind']}", result
    else:  # v1.0: a StreamResponse, one of task/message/statusUpdate/artifactUpdate
        key = next(iter(result))
        kind, inner = f"v1.0 {key}", result[key]
    state = inner.get("status", {}).get("state")
    wire_events.setdefault(f"{kind} {state}" if state else kind, envelope)


@asynccontextmanager
async def client(url: str, streaming: bool = True):
    http = httpx.AsyncClient(transport=Recorder(), timeout=30)
    c = await create_client(url, ClientConfig(streaming=streaming, httpx_client=http))
    try:
        yield c
    finally:
        await c.close()
        await http.aclose()


def message(text: str, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    msg = new_text_message(text, role=Role.ROLE_USER, task_id=task_id or None, context_id=context_id or None)
    return SendMessageRequest(message=msg)


async def collect(c, req) -> list:
    return [ev async for ev in c.send_message(req)]


def state_name(s: int) -> str:
    return TaskState.Name(s)


async def check_kind_echo(p: str) -> None:
    proc, url = start("echo", p)
    try:
        async with client(url, streaming=False) as c:
            [ev] = await collect(c, message("hi"))
            task = ev.task
            check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"[{p}] echo send: completed")
            check(get_artifact_text(task.artifacts[0]) == "echo: hi", f"[{p}] echo send: artifact 'echo: hi'")
            got = await c.get_task(GetTaskRequest(id=task.id))
            check(got.status.state == TaskState.TASK_STATE_COMPLETED and got.id == task.id, f"[{p}] echo get: completed")
            try:
                await c.get_task(GetTaskRequest(id=str(uuid.uuid4())))
                check(False, f"[{p}] get unknown task: an error")
            except A2AError as e:
                check(type(e).__name__ == "TaskNotFoundError", f"[{p}] get unknown task: {type(e).__name__} ({e})")
        async with client(url) as c:
            events = await collect(c, message("stream me"))
            kinds = [ev.WhichOneof("payload") for ev in events]
            last = events[-1]
            check(last.WhichOneof("payload") == "status_update" and last.status_update.status.state == TaskState.TASK_STATE_COMPLETED, f"[{p}] echo stream ends completed: {kinds}")
            arts = [ev.artifact_update.artifact for ev in events if ev.HasField("artifact_update")]
            check(len(arts) == 1 and get_artifact_text(arts[0]) == "echo: stream me", f"[{p}] echo stream: artifact update")
    finally:
        check(stop(proc) == 0, f"[{p}] echo: SIGTERM exits 0")


async def check_kind_slow(p: str) -> None:
    proc, url = start("slow", p, extra=["--seconds", "1.5"])
    try:
        async with client(url) as c:
            events = await collect(c, message("work"))
            working = [get_message_text(ev.status_update.status.message) for ev in events if ev.HasField("status_update") and ev.status_update.status.state == TaskState.TASK_STATE_WORKING]
            check(working == [f"working: step {i} of 3" for i in (1, 2, 3)], f"[{p}] slow stream: progress {working}")
            check(events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED, f"[{p}] slow stream: completed")
        # Cancel mid-work, with a second client resubscribed to the task.
        async with client(url) as c, client(url) as watcher:
            stream = c.send_message(message("cancel me"))
            first = await anext(stream)
            task_id = first.task.id if first.HasField("task") else first.status_update.task_id
            sub_events: list = []

            async def watch() -> None:
                async for ev in watcher.subscribe(SubscribeToTaskRequest(id=task_id)):
                    sub_events.append(ev)

            watching = asyncio.create_task(watch())
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            task = await c.cancel_task(CancelTaskRequest(id=task_id))
            took = time.monotonic() - t0
            check(task.status.state == TaskState.TASK_STATE_CANCELED, f"[{p}] slow cancel: canceled in {took:.3f} s")
            check(took < 1.0, f"[{p}] slow cancel: prompt")
            rest = [ev async for ev in stream]
            states = [state_name(ev.status_update.status.state) for ev in rest if ev.HasField("status_update")]
            check(states[-1:] == ["TASK_STATE_CANCELED"], f"[{p}] slow stream after cancel ends canceled: {states}")
            await asyncio.wait_for(watching, 5)
            check(sub_events[0].HasField("task") and sub_events[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED, f"[{p}] resubscribe: task first, canceled last ({len(sub_events)} events)")
            got = await c.get_task(GetTaskRequest(id=task_id))
            check(got.status.state == TaskState.TASK_STATE_CANCELED, f"[{p}] slow get after cancel: canceled")
            try:
                await c.cancel_task(CancelTaskRequest(id=task_id))
                check(False, f"[{p}] cancel twice: an error")
            except A2AError as e:
                check(type(e).__name__ == "TaskNotCancelableError", f"[{p}] cancel twice: {type(e).__name__}")
        # kill -9 with a task pending, restart on the same port: the task is gone.
        async with client(url, streaming=False) as c:
            req = message("forget me")
            req.configuration.return_immediately = True
            [ev] = await collect(c, req)
            task_id = ev.task.id
            check(ev.task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING), f"[{p}] return_immediately: {state_name(ev.task.status.state)}")
        port = int(url.rsplit(":", 1)[1])
        proc.kill()
        proc.wait()
        proc, url2 = start("slow", p, port=port)
        check(url2 == url, f"[{p}] restart on the same port at once")
        async with client(url) as c:
            try:
                await c.get_task(GetTaskRequest(id=task_id))
                check(False, f"[{p}] get after restart: an error")
            except A2AError as e:
                check(type(e).__name__ == "TaskNotFoundError", f"[{p}] get after restart: {type(e).__name__}")
            try:
                async for _ in c.subscribe(SubscribeToTaskRequest(id=task_id)):
                    pass
                check(False, f"[{p}] resubscribe after restart: an error")
            except A2AError as e:
                check(type(e).__name__ == "TaskNotFoundError", f"[{p}] resubscribe after restart: {type(e).__name__}")
        # SIGTERM with a stream open exits 0, promptly.
        async with client(url) as c:
            stream = c.send_message(message("sigterm"))
            await anext(stream)
            t0 = time.monotonic()
            code = stop(proc)
            check(code == 0 and time.monotonic() - t0 < 5, f"[{p}] SIGTERM with a stream open: exit {code} in {time.monotonic() - t0:.2f} s")
            try:
                async for _ in stream:
                    pass
            except Exception:  # noqa: BLE001 - the stream may end either way
                pass
    finally:
        if proc.poll() is None:
            stop(proc)


async def check_kind_input(p: str) -> None:
    proc, url = start("input", p)
    try:
        async with client(url) as c:
            events = await collect(c, message("hello"))
            last = events[-1].status_update
            check(last.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, f"[{p}] input: input-required")
            check(get_message_text(last.status.message) == "What is your name?", f"[{p}] input: the question")
            events = await collect(c, message("Ada", task_id=last.task_id, context_id=last.context_id))
            arts = [get_artifact_text(ev.artifact_update.artifact) for ev in events if ev.HasField("artifact_update")]
            check(arts == ["hello, Ada"] and events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED, f"[{p}] input follow-up: completed 'hello, Ada'")
        async with client(url, streaming=False) as c:
            [ev] = await collect(c, message("hello"))
            check(ev.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, f"[{p}] input send: input-required")
            [ev] = await collect(c, message("Bob", task_id=ev.task.id, context_id=ev.task.context_id))
            check(ev.task.status.state == TaskState.TASK_STATE_COMPLETED and get_artifact_text(ev.task.artifacts[0]) == "hello, Bob", f"[{p}] input send follow-up: 'hello, Bob'")
    finally:
        stop(proc)


async def check_kind_failing(p: str) -> None:
    proc, url = start("failing", p)
    try:
        async with client(url) as c:
            events = await collect(c, message("try"))
            last = events[-1].status_update
            check(last.status.state == TaskState.TASK_STATE_FAILED, f"[{p}] failing stream: failed")
            check("always fails" in get_message_text(last.status.message), f"[{p}] failing: the reason in the status message")
        async with client(url, streaming=False) as c:
            [ev] = await collect(c, message("try"))
            check(ev.task.status.state == TaskState.TASK_STATE_FAILED, f"[{p}] failing send: failed")
    finally:
        stop(proc)


async def check_kind_count(p: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "count"
        proc, url = start("count", p, env={"A2A_COUNT_FILE": str(path)})
        try:
            async with client(url) as c:
                await collect(c, message("one"))
                await collect(c, message("two"))
            lines = path.read_text().splitlines()
            check([line.split(" ", 1)[1] for line in lines] == ["one", "two"], f"[{p}] count: one line per new task")
        finally:
            stop(proc)


async def raw_probes() -> None:
    """What the SDK server does with method names and the A2A-Version header, on the wire."""
    msg10 = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    msg03 = {"message": {"messageId": "m1", "role": "user", "kind": "message", "parts": [{"kind": "text", "text": "hi"}]}}

    async def call(url: str, method: str, params: dict, version: str | None) -> dict:
        headers = {"A2A-Version": version} if version else {}
        async with httpx.AsyncClient() as h:
            r = await h.post(url + "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers)
            return r.json()

    def code(resp: dict) -> Any:
        return resp["error"]["code"] if "error" in resp else "ok"

    proc, url = start("echo", "1.0")
    try:
        r = await call(url, "SendMessage", msg10, None)
        check(code(r) == -32009, f"[1.0] SendMessage without A2A-Version: {code(r)} {r.get('error', {}).get('message')}")
        check(code(await call(url, "SendMessage", msg10, "1.0")) == "ok", "[1.0] SendMessage with A2A-Version 1.0: ok")
        check(code(await call(url, "SendMessage", msg10, "1.0.0")) == "ok", "[1.0] SendMessage with A2A-Version 1.0.0: ok")
        check(code(await call(url, "message/send", msg03, None)) == -32601, "[1.0] message/send: -32601 (v0.3 compat is off)")
        r = await call(url, "GetTask", {"id": "nope"}, "1.0")
        check(code(r) == -32001, f"[1.0] GetTask unknown: {json.dumps(r)}")
    finally:
        stop(proc)
    proc, url = start("echo", "0.3")
    try:
        check(code(await call(url, "message/send", msg03, None)) == "ok", "[0.3] message/send without A2A-Version: ok")
        check(code(await call(url, "message/send", msg03, "0.3")) == "ok", "[0.3] message/send with A2A-Version 0.3: ok")
        r = await call(url, "message/send", msg03, "1.0")
        # The SDK's v0.3 adapter has no code for a version mismatch: it answers -32603.
        check(code(r) == -32603, f"[0.3] message/send with A2A-Version 1.0: {code(r)} {r['error']['message']}")
        check(code(await call(url, "SendMessage", msg10, "1.0")) == -32601, "[0.3] SendMessage: -32601")
        r = await call(url, "tasks/get", {"id": "nope"}, None)
        check(code(r) == -32001, f"[0.3] tasks/get unknown: {json.dumps(r)}")
        async with httpx.AsyncClient() as h:
            card = (await h.get(url + "/.well-known/agent-card.json")).json()
        check(card.get("protocolVersion") == "0.3" and "supportedInterfaces" not in card, "[0.3] card: protocolVersion 0.3, no supportedInterfaces")
        if VERBOSE:
            print("card 0.3:", json.dumps(card))
    finally:
        stop(proc)


async def main() -> None:
    for p in ("1.0", "0.3"):
        await check_kind_echo(p)
        await check_kind_slow(p)
        await check_kind_input(p)
        await check_kind_failing(p)
        await check_kind_count(p)
    await raw_probes()
    if VERBOSE:
        for kind, env in wire_events.items():
            print(f"wire {kind}: {json.dumps(env)}")
    print(f"{passed} passed, 0 failed")


if __name__ == "__main__":
    asyncio.run(main())
