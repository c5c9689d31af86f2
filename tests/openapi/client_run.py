"""One run with an approval, driven through a client that openapi-python-client generated from
pes-server's OpenAPI document (tests/api/openapi.rs generates it and runs this script).

Usage: client_run.py <folder holding the generated `pes_server_client` package> <base URL>

Every call goes through the generated, typed API: a thread with `requireApproval: [calculator]`,
a query posted with runs/wait, the run's `suspension` read as a `Suspension` model, an
`ApproveResumeRequest`, the run awaited to completion, and the thread's observations read as
their per-type models with typed content. Anything untyped (a plain dict where a model is due),
an observation parsed as a model of another type, or a call that fails ends the script with an
exception. On success it prints one JSON line for the test to check against the server.
"""

import json
import sys
import time

sys.path.insert(0, sys.argv[1])
base_url = sys.argv[2]

from pes_server_client import Client  # noqa: E402
from pes_server_client.api.observations import list_observations  # noqa: E402
from pes_server_client.api.runs import get_run, wait_run  # noqa: E402
from pes_server_client.api.suspensions import resume_suspension  # noqa: E402
from pes_server_client.api.threads import create_thread, get_state  # noqa: E402
from pes_server_client.models import (  # noqa: E402
    AgentConfig,
    AgentResumedContent,
    AgentResumedObservation,
    AgentStateView,
    AgentSuspendedContent,
    AgentSuspendedObservation,
    ApproveResumeRequest,
    CreateRun,
    CreateThread,
    Decision,
    FinalResponseContent,
    FinalResponseObservation,
    PageObservation,
    PlanContent,
    PlanObservation,
    Run,
    RunStatus,
    Suspension,
    SuspensionKind,
    Thread,
    TodoSummary,
    ToolExecutionContent,
    ToolExecutionObservation,
    ToolResultStatus,
)


def expect(value, kind, what):
    """`value`, which must be an instance of `kind` (a generated model, not a dict)."""
    if not isinstance(value, kind):
        raise AssertionError(f"{what}: expected {kind.__name__}, got {type(value).__name__}: {value!r}")
    return value


def pascal(screaming):
    return "".join(w.capitalize() for w in screaming.split("_"))


client = Client(base_url=base_url, raise_on_unexpected_status=True, timeout=60.0)

thread = expect(
    create_thread.sync(
        client=client,
        body=CreateThread(config=AgentConfig(require_approval=["calculator"])),
    ),
    Thread,
    "POST /v1/threads",
)

run = expect(
    wait_run.sync(thread.thread_id, client=client, body=CreateRun(query="What is 2+2?")),
    Run,
    "POST runs/wait",
)
assert run.status == RunStatus.SUSPENDED, run.status
suspension = expect(run.suspension, Suspension, "the run's suspension")
assert suspension.kind == SuspensionKind.APPROVAL, suspension.kind
assert suspension.tool_call.name == "calculator", suspension.tool_call.name
assert Decision.APPROVE in suspension.allowed_decisions, suspension.allowed_decisions

state = expect(get_state.sync(thread.thread_id, client=client), AgentStateView, "GET state")
assert state.is_paused
assert expect(state.suspension, Suspension, "the state's suspension").suspension_id == suspension.suspension_id

resumed = expect(
    resume_suspension.sync(
        str(suspension.suspension_id),
        client=client,
        body=ApproveResumeRequest(decision="approve", reason="looks right"),
    ),
    Run,
    "POST resume",
)
assert resumed.run_id == run.run_id

deadline = time.monotonic() + 30
while True:
    done = expect(get_run.sync(thread.thread_id, str(run.run_id), client=client), Run, "GET run")
    if done.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        break
    if time.monotonic() > deadline:
        raise AssertionError(f"the run never ended: {done.status}")
    time.sleep(0.05)
assert done.status == RunStatus.COMPLETED, done.to_dict()
final = expect(done.final_response, FinalResponseContent, "the run's finalResponse")

page = expect(
    list_observations.sync(thread.thread_id, client=client, limit=1000),
    PageObservation,
    "GET observations",
)
types = []
for o in page.items:
    kind = o.type_
    # The union picked the model of the observation's own type, not the first that parsed.
    assert type(o).__name__ == pascal(kind) + "Observation", (type(o).__name__, kind)
    assert not isinstance(o.content, dict), f"{kind}: untyped content {o.content!r}"
    types.append(kind)


def only(kind):
    found = [o for o in page.items if isinstance(o, kind)]
    assert len(found) == 1, f"{kind.__name__}: {len(found)}"
    return found[0]


plan = expect(only(PlanObservation).content, PlanContent, "PLAN content")
assert plan.todo_list, "the plan has items"
for item in plan.todo_list:
    expect(item, TodoSummary, "a PLAN item")
suspended = expect(only(AgentSuspendedObservation).content, AgentSuspendedContent, "AGENT_SUSPENDED")
assert suspended.suspension_id == suspension.suspension_id
resumed_obs = expect(only(AgentResumedObservation).content, AgentResumedContent, "AGENT_RESUMED")
assert resumed_obs.decision == Decision.APPROVE and resumed_obs.reason == "looks right"
executions = [o.content for o in page.items if isinstance(o, ToolExecutionObservation)]
calculator = [expect(e, ToolExecutionContent, "TOOL_EXECUTION") for e in executions if e.name == "calculator"]
assert calculator and calculator[0].status == ToolResultStatus.SUCCESS, executions
answer = expect(only(FinalResponseObservation).content, FinalResponseContent, "FINAL_RESPONSE")
assert answer.response == final.response

print(
    json.dumps(
        {
            "threadId": thread.thread_id,
            "runId": str(run.run_id),
            "suspensionId": str(suspension.suspension_id),
            "types": types,
            "answer": answer.response,
            "planItems": [i.id for i in plan.todo_list],
        }
    )
)
