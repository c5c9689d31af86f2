"""An AG-UI 1.0 consumer over the official `ag-ui-protocol` package, which the Rust black-box
tests (`tests/api/agui.rs`) run as a process against pes-server's `POST /v1/ag-ui`.

    python tests/agui/client.py BASE --input JSON [--key K] [--last-event-id N] [--stop-after N]

The input is checked with the package's `RunAgentInput` (when it has a `runId`, which the model
requires), POSTed, and the answer read as Server-Sent Events. Every event is validated with the
package's `Event` union and must come back unchanged from the model it parsed into, with no field
the model does not know, at any depth. The protocol's order rules are checked as the events
arrive: the stream opens with `RUN_STARTED`; steps, text messages and tool calls are opened once,
continued and closed only while open, and all closed by `RUN_FINISHED`; nothing follows the run's
end. `STATE_SNAPSHOT` sets the state and every `STATE_DELTA` must apply to it (RFC 6902).

Prints one JSON object per line: `{"event": …, "id": <SSE id or null>}` per event, then
`{"done": {"state": <the state>, "count": N}}`; an HTTP error prints `{"http": {"status",
"body"}}`; a violation prints `{"error": "…"}` and exits 1. `--stop-after N` stops reading after
N events (a client that goes away).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import httpx
from pydantic import BaseModel, TypeAdapter

from ag_ui.core import Event, RunAgentInput
from ag_ui.core.version import PROTOCOL_VERSION

EVENTS = TypeAdapter(Event)


def emit(obj: object) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


def fail(message: str) -> None:
    emit({"error": message})
    sys.exit(1)


def no_extras(value: object, path: str) -> None:
    """Every model, at every depth, holds only fields its class declares."""
    if isinstance(value, BaseModel):
        if value.model_extra:
            fail(f"{path}: fields the protocol does not define: {sorted(value.model_extra)}")
        for name in type(value).model_fields:
            no_extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            no_extras(item, f"{path}[{i}]")


def pointer(path: str) -> list[str]:
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def resolve(doc, tokens):
    for t in tokens:
        doc = doc[int(t)] if isinstance(doc, list) else doc[t]
    return doc


def apply_patch(state, ops):
    """RFC 6902, strictly: a path that does not resolve is an error."""
    state = copy.deepcopy(state)
    for op in ops:
        kind, tokens = op["op"], pointer(op["path"])
        if not tokens:
            if kind in ("add", "replace"):
                state = copy.deepcopy(op["value"])
                continue
            raise ValueError(f"{kind} of the whole document")
        parent, last = resolve(state, tokens[:-1]), tokens[-1]
        if kind == "add":
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if index > len(parent):
                    raise IndexError(op["path"])
                parent.insert(index, copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op["value"])
            else:
                if last not in parent:
                    raise KeyError(op["path"])
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "test":
            if resolve(state, tokens) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        else:
            raise ValueError(f"unexpected op {kind}")
    return state


class Order:
    """The AG-UI order rules, checked one event at a time."""

    def __init__(self) -> None:
        self.started = False
        self.ended = False
        self.steps: set[str] = set()
        self.messages: set[str] = set()
        self.calls: set[str] = set()
        self.closed_calls: set[str] = set()
        self.state = None

    def take(self, e: dict) -> None:
        t = e["type"]
        if self.ended:
            fail(f"{t} after the run ended")
        if not self.started:
            if t not in ("RUN_STARTED", "RUN_ERROR"):
                fail(f"the stream opens with {t}, not RUN_STARTED")
            self.started = True
            if t == "RUN_STARTED" and e.get("protocolVersion") != PROTOCOL_VERSION:
                fail(f"RUN_STARTED declares protocolVersion {e.get('protocolVersion')!r}")
        elif t == "RUN_STARTED":
            fail("a RUN_STARTED while the run is active")
        if t == "STEP_STARTED":
            if e["stepName"] in self.steps:
                fail(f"step {e['stepName']} opened twice")
            self.steps.add(e["stepName"])
        elif t == "STEP_FINISHED":
            if e["stepName"] not in self.steps:
                fail(f"step {e['stepName']} finished but not open")
            self.steps.remove(e["stepName"])
        elif t == "TEXT_MESSAGE_START":
            if e["messageId"] in self.messages:
                fail(f"message {e['messageId']} opened twice")
            self.messages.add(e["messageId"])
        elif t in ("TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"):
            if e["messageId"] not in self.messages:
                fail(f"{t} for message {e['messageId']}, which is not open")
            if t == "TEXT_MESSAGE_END":
                self.messages.remove(e["messageId"])
        elif t == "TOOL_CALL_START":
            if e["toolCallId"] in self.calls:
                fail(f"tool call {e['toolCallId']} opened twice")
            self.calls.add(e["toolCallId"])
        elif t in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            if e["toolCallId"] not in self.calls:
                fail(f"{t} for tool call {e['toolCallId']}, which is not open")
            if t == "TOOL_CALL_END":
                self.calls.remove(e["toolCallId"])
                self.closed_calls.add(e["toolCallId"])
        elif t == "TOOL_CALL_RESULT":
            if e["toolCallId"] in self.calls:
                fail(f"a result for tool call {e['toolCallId']} before its end")
        elif t == "STATE_SNAPSHOT":
            self.state = copy.deepcopy(e["snapshot"])
        elif t == "STATE_DELTA":
            if self.state is None:
                fail("STATE_DELTA before any STATE_SNAPSHOT")
            try:
                self.state = apply_patch(self.state, e["delta"])
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                fail(f"STATE_DELTA does not apply: {exc!r}: {e['delta']}")
        elif t == "RUN_FINISHED":
            open_things = sorted(self.steps) + sorted(self.messages) + sorted(self.calls)
            if open_things:
                fail(f"RUN_FINISHED with {open_things} still open")
            self.ended = True
        elif t == "RUN_ERROR":
            self.ended = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("--input", required=True)
    parser.add_argument("--key")
    parser.add_argument("--last-event-id")
    parser.add_argument("--stop-after", type=int)
    args = parser.parse_args()

    body = json.loads(args.input)
    if "runId" in body:
        RunAgentInput.model_validate(body)
    headers = {"accept": "text/event-stream", "content-type": "application/json"}
    if args.key:
        headers["authorization"] = f"Bearer {args.key}"
    if args.last_event_id is not None:
        headers["last-event-id"] = args.last_event_id

    order = Order()
    count = 0
    with httpx.Client(timeout=httpx.Timeout(60.0)) as http:
        with http.stream("POST", f"{args.base}/v1/ag-ui", headers=headers, content=json.dumps(body)) as r:
            if r.status_code != 200:
                emit({"http": {"status": r.status_code, "body": json.loads(r.read() or b"null")}})
                return
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                fail(f"content-type {r.headers.get('content-type')}")
            data: list[str] = []
            event_id = None
            for line in r.iter_lines():
                if line.startswith(":"):
                    continue
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                    continue
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                    continue
                if line.startswith("event:") or line.startswith("retry:"):
                    fail(f"an SSE field other than data and id: {line}")
                if line == "" and data:
                    raw = json.loads("\n".join(data))
                    model = EVENTS.validate_python(raw)
                    no_extras(model, raw["type"])
                    again = model.model_dump(mode="json", by_alias=True)
                    if again != raw:
                        fail(f"{raw['type']} does not round-trip: sent {raw}, model {again}")
                    order.take(raw)
                    emit({"event": raw, "id": event_id})
                    count += 1
                    data, event_id = [], None
                    if args.stop_after is not None and count >= args.stop_after:
                        emit({"stopped": count})
                        return
    if not order.ended:
        fail("the stream ended without RUN_FINISHED or RUN_ERROR")
    emit({"done": {"state": order.state, "count": count}})


if __name__ == "__main__":
    main()
