//! pes-server as an MCP server (`POST /mcp`), driven by the official Python MCP SDK's client
//! (`tests/mcp/client.py`, run as a process) in both eras: 2026-07-28 (`server/discover`,
//! per-request metadata) and the `initialize` handshake; and by hand for the 2025-06-18
//! handshake. The client lists `ask`, `resume` and the tenant's flowcharts; `ask` answers with
//! the run's progress as notifications; a run needing approval returns its suspension, which
//! `resume` completes (or, with elicitation, the input-required round trip does in one call); a
//! flowchart is a tool of its own that runs the flowchart itself (no model call) and answers
//! with its output, or with its suspension. Keys and tenants as on `/v1`; what the transport refuses
//! is a problem. Without the venv the SDK-driven tests say so loudly and pass, except where
//! `PES_PYVENV` or `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, phase_of};
use crate::helpers::{Backend, TestApp, define_flowchart, repo_file, spawn_with};

fn python() -> Option<PathBuf> {
    crate::helpers::venv_python("mcp.client", "the Python MCP SDK")
}

/// Run the SDK client: its JSON lines, and whether it succeeded.
async fn sdk(py: &Path, app: &TestApp, args: &[&str], key: Option<&str>) -> (bool, Vec<Value>) {
    let mut cmd = tokio::process::Command::new(py);
    cmd.arg(repo_file("tests/mcp/client.py"))
        .arg(args[0])
        .arg(&app.base)
        .args(&args[1..]);
    if let Some(k) = key {
        cmd.args(["--key", k]);
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("the MCP client finishes within 90 s")
        .expect("the MCP client runs");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    if !out.status.success() {
        assert!(
            lines.last().is_some_and(|l| l.get("error").is_some()),
            "{args:?} failed without saying why: {lines:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (out.status.success(), lines)
}

fn line<'a>(lines: &'a [Value], key: &str) -> &'a Value {
    lines
        .iter()
        .find_map(|l| l.get(key))
        .unwrap_or_else(|| panic!("no {key} in {lines:?}"))
}

/// A tool call that succeeds: (its result, the progress notifications, the elicitations).
async fn call(
    py: &Path,
    app: &TestApp,
    tool: &str,
    args: Value,
    extra: &[&str],
    key: Option<&str>,
) -> (Value, Vec<Value>, Vec<Value>) {
    let args = args.to_string();
    let mut argv = vec!["call", tool, "--args", &args];
    argv.extend_from_slice(extra);
    let (ok, lines) = sdk(py, app, &argv, key).await;
    assert!(ok, "{tool}: {lines:?}");
    let pick = |k: &str| -> Vec<Value> { lines.iter().filter_map(|l| l.get(k).cloned()).collect() };
    (
        line(&lines, "result").clone(),
        pick("progress"),
        pick("elicited"),
    )
}

/// POST a raw JSON-RPC message to `/mcp`.
pub(crate) async fn raw(
    app: &TestApp,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut req = app
        .client
        .post(app.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

/// The JSON-RPC message of a response that may be SSE (its last `data:`) or JSON.
pub(crate) fn message(body: &str) -> Value {
    let data = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .rfind(|d| !d.is_empty());
    serde_json::from_str(data.unwrap_or(body)).unwrap_or_else(|_| panic!("not JSON-RPC: {body}"))
}

fn triage() -> Value {
    json!({
        "description": "Triage a refund request.",
        "inputSchema": {
            "type": "object",
            "properties": {"amount": {"type": "number"}},
            "required": ["amount"],
            "additionalProperties": false
        },
        "flowchart": {"start": "route", "stages": {
            "route": {"kind": "decide", "rules": [
                {"condition": {">": [{"var": "args.amount"}, 1000]}, "next": "escalate"}
            ], "default": "approve"},
            "approve": {"kind": "end", "result": {"decision": "approved", "amount": {"var": "args.amount"}}},
            "escalate": {"kind": "end", "result": {"decision": "escalated"}}
        }}
    })
}

async fn the_sdk_lists_the_tools_and_ask_answers_with_progress(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    assert_eq!(define_flowchart(&app, None, "triage", triage()).await, 201);

    for (mode, version) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let (ok, lines) = sdk(&py, &app, &["list", "--mode", mode], None).await;
        assert!(ok, "{lines:?}");
        assert_eq!(line(&lines, "connected")["protocolVersion"], version);
        let tools = line(&lines, "tools").as_array().unwrap().clone();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["ask", "resume", "triage"], "{mode}");
        assert_eq!(tools[0]["inputSchema"]["required"], json!(["query"]));
        assert_eq!(tools[2]["inputSchema"]["required"], json!(["amount"]));
        assert!(
            tools[2]["description"]
                .as_str()
                .unwrap()
                .contains("Triage a refund")
        );
        assert_eq!(
            tools[0]["outputSchema"]["required"],
            json!(["status", "threadId", "runId"])
        );
    }

    let (result, progress, _) = call(
        &py,
        &app,
        "ask",
        json!({"query": "what is 2+2?"}),
        &["--progress"],
        None,
    )
    .await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["text"], "final answer");
    let s = &result["structured"];
    assert_eq!(
        (s["status"].as_str(), s["answer"].as_str()),
        (Some("completed"), Some("final answer"))
    );
    let (thread, run) = (
        s["threadId"].as_str().unwrap(),
        s["runId"].as_str().unwrap(),
    );
    let (st, stored) = app.get(&format!("/v1/threads/{thread}/runs/{run}")).await;
    assert_eq!(
        (st, &stored["status"]),
        (200, &json!("completed")),
        "{stored}"
    );
    // One notification per observation of the run, in log order, counting up.
    let log = app.observations(thread).await;
    let kinds: Vec<&str> = progress
        .iter()
        .map(|p| p["message"].as_str().unwrap().split(' ').next().unwrap())
        .collect();
    let logged: Vec<&str> = log.iter().map(|o| o["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, logged, "{progress:?}");
    let counts: Vec<f64> = progress
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");

    // A follow-up on the thread, through the handshake era.
    let (result, progress, _) = call(
        &py,
        &app,
        "ask",
        json!({"query": "and 3+3?", "threadId": thread}),
        &["--mode", "legacy"],
        None,
    )
    .await;
    assert_eq!(result["structured"]["threadId"], thread);
    assert!(progress.is_empty(), "no progress token, no notifications");
    let (_, runs) = app.get(&format!("/v1/threads/{thread}/runs")).await;
    assert_eq!(runs["items"].as_array().unwrap().len(), 2);

    // The 2025-06-18 handshake the SDKs still send.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let (st, _, body) = raw(&app, &init, &[]).await;
    assert_eq!(st, 200, "{body}");
    let answer = message(&body);
    assert_eq!(
        answer["result"]["protocolVersion"], "2025-06-18",
        "{answer}"
    );
    assert_eq!(answer["result"]["serverInfo"]["name"], "pes-server");
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (st, _, body) = raw(&app, &list, &[("mcp-protocol-version", "2025-06-18")]).await;
    assert_eq!(st, 200, "{body}");
    let tools = &message(&body)["result"]["tools"];
    assert_eq!(tools.as_array().unwrap().len(), 3, "{tools}");
}
both_stores!(
    list_and_ask,
    the_sdk_lists_the_tools_and_ask_answers_with_progress
);

async fn progress_arrives_while_a_slow_run_is_still_going(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    // The answer is held: the run waits at its synthesis until released.
    llm.hold_if(|req| phase_of(req) == "synthesis");
    let mut child = tokio::process::Command::new(&py)
        .arg(repo_file("tests/mcp/client.py"))
        .args([
            "call",
            &app.base,
            "ask",
            "--args",
            r#"{"query": "slow one"}"#,
            "--progress",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        let l = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("progress within 60 s")
            .unwrap()
            .expect("the client is still waiting");
        let v: Value = serde_json::from_str(&l).unwrap();
        assert!(
            v.get("result").is_none(),
            "the call ended while the run was held: {v}"
        );
        if let Some(p) = v.get("progress") {
            let message = p["message"].as_str().unwrap().to_owned();
            seen.push(message.clone());
            if message.starts_with("SYNTHESIS") {
                break;
            }
        }
    }
    assert!(seen[0].starts_with("RUN_STARTED"), "{seen:?}");
    assert!(
        seen.iter().any(|m| m.starts_with("TOOL_EXECUTION")),
        "{seen:?}"
    );
    // The run is still going while the client has its progress.
    let (_, threads) = app.get("/v1/threads").await;
    let thread = threads["items"][0]["threadId"].as_str().unwrap().to_owned();
    let (_, runs) = app.get(&format!("/v1/threads/{thread}/runs")).await;
    assert_eq!(runs["items"][0]["status"], "running", "{runs}");
    llm.release();
    let mut result = None;
    while let Ok(Some(l)) = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the end within 60 s")
    {
        let v: Value = serde_json::from_str(&l).unwrap();
        if let Some(p) = v.get("progress") {
            seen.push(p["message"].as_str().unwrap().to_owned());
        }
        if let Some(r) = v.get("result") {
            result = Some(r.clone());
        }
    }
    let result = result.expect("a result");
    assert_eq!(result["structured"]["status"], "completed", "{result}");
    assert!(
        seen.last().unwrap().starts_with("RUN_COMPLETED"),
        "{seen:?}"
    );
}
both_stores!(
    slow_progress,
    progress_arrives_while_a_slow_run_is_still_going
);

async fn a_run_needing_approval_returns_its_suspension_and_resume_completes_it(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let thread = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;

    let (result, _, _) = call(
        &py,
        &app,
        "ask",
        json!({"query": "what is 2+2?", "threadId": thread}),
        &[],
        None,
    )
    .await;
    assert_eq!(result["isError"], false, "{result}");
    let s = &result["structured"];
    assert_eq!(s["status"], "suspended", "{s}");
    let (_, pending) = app.get(&format!("/v1/threads/{thread}/suspensions")).await;
    let id = pending["items"][0]["suspensionId"].as_str().unwrap();
    let named = &s["suspensions"][0];
    assert_eq!(named["suspensionId"], id);
    assert_eq!(named["kind"], "approval");
    assert_eq!(named["toolCall"]["name"], "calculator");
    assert!(result["text"].as_str().unwrap().contains(id), "{result}");

    let (result, progress, _) = call(
        &py,
        &app,
        "resume",
        json!({"suspensionId": id, "decision": "approve"}),
        &["--progress"],
        None,
    )
    .await;
    let s = &result["structured"];
    assert_eq!(
        (s["status"].as_str(), s["answer"].as_str()),
        (Some("completed"), Some("final answer")),
        "{result}"
    );
    assert_eq!(s["threadId"], thread.as_str());
    let first = progress[0]["message"].as_str().unwrap();
    assert!(
        first.starts_with("AGENT_RESUMED"),
        "progress from the decision on: {progress:?}"
    );

    // Deciding again is refused with the problem's code.
    let (ok, lines) = sdk(
        &py,
        &app,
        &[
            "call",
            "resume",
            "--args",
            &json!({"suspensionId": id, "decision": "reject"}).to_string(),
        ],
        None,
    )
    .await;
    assert!(!ok);
    let error = line(&lines, "error");
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(error["data"]["code"], "suspension_resolved");

    // A client that can elicit gets the input-required round trip: one call, asked and done.
    let fresh = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let (result, _, elicited) = call(
        &py,
        &app,
        "ask",
        json!({"query": "and 5+5?", "threadId": fresh}),
        &[
            "--elicit",
            r#"{"action": "accept", "content": {"decision": "approve", "reason": "ok"}}"#,
        ],
        None,
    )
    .await;
    assert_eq!(elicited.len(), 1, "{elicited:?} {result}");
    assert!(
        elicited[0]["message"]
            .as_str()
            .unwrap()
            .contains("calculator")
    );
    assert_eq!(
        elicited[0]["requestedSchema"]["required"],
        json!(["decision"])
    );
    assert_eq!(result["structured"]["status"], "completed", "{result}");
    let (_, all) = app
        .get(&format!("/v1/threads/{fresh}/suspensions?status=all"))
        .await;
    assert_eq!(all["items"][0]["decision"], "approve", "{all}");
    assert_eq!(all["items"][0]["reason"], "ok", "{all}");

    // Declined in the form: the call is rejected, and the run goes on without it.
    let declined = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let (result, _, _) = call(
        &py,
        &app,
        "ask",
        json!({"query": "and 6+6?", "threadId": declined}),
        &["--elicit", r#"{"action": "decline"}"#],
        None,
    )
    .await;
    assert_eq!(result["structured"]["status"], "completed", "{result}");
    let (_, all) = app
        .get(&format!("/v1/threads/{declined}/suspensions?status=all"))
        .await;
    assert_eq!(all["items"][0]["decision"], "reject", "{all}");

    // Cancelled: nothing is decided, and the call names the suspension for later.
    let cancelled = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let (result, _, elicited) = call(
        &py,
        &app,
        "ask",
        json!({"query": "and 7+7?", "threadId": cancelled}),
        &["--elicit", r#"{"action": "cancel"}"#],
        None,
    )
    .await;
    assert_eq!(elicited.len(), 1);
    assert_eq!(result["structured"]["status"], "suspended", "{result}");
}
both_stores!(
    approval_and_resume,
    a_run_needing_approval_returns_its_suspension_and_resume_completes_it
);

async fn a_flowchart_is_a_tool_of_its_own(backend: Backend) {
    let Some(py) = python() else { return };
    // A model that never calls a tool: the flowchart runs anyway, by itself.
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    assert_eq!(define_flowchart(&app, None, "triage", triage()).await, 201);
    let (result, progress, _) = call(
        &py,
        &app,
        "triage",
        json!({"amount": 40}),
        &["--progress"],
        None,
    )
    .await;
    assert_eq!(result["isError"], false, "{result}");
    let output = json!({"decision": "approved", "amount": 40});
    let text: Value = serde_json::from_str(result["text"].as_str().unwrap())
        .unwrap_or_else(|_| panic!("the text is the output's JSON: {result}"));
    assert_eq!(text, output);
    let s = &result["structured"];
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["result"], output, "{s}");
    assert_eq!(llm.calls(), 0, "no model request: {:?}", llm.requests());
    // It ran as a flowchart run on a thread of its own, its stages in the log and in progress.
    let thread = s["threadId"].as_str().unwrap();
    let (_, run) = app
        .get(&format!(
            "/v1/threads/{thread}/runs/{}",
            s["runId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(run["kind"], "flowchart", "{run}");
    assert_eq!(run["finalResponse"]["output"], output);
    let log = app.observations(thread).await;
    assert!(
        log.iter().any(|o| o["type"] == "FLOWCHART_STEP"),
        "stages are observable"
    );
    let messages: Vec<&str> = progress
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.iter().any(|m| m.starts_with("FLOWCHART_STEP")),
        "{messages:?}"
    );
    assert!(
        messages.last().unwrap().starts_with("RUN_COMPLETED"),
        "{messages:?}"
    );

    // Arguments that do not fit its input schema are refused before any run.
    let (ok, lines) = sdk(
        &py,
        &app,
        &["call", "triage", "--args", r#"{"amount": "lots"}"#],
        None,
    )
    .await;
    assert!(!ok);
    assert_eq!(line(&lines, "error")["code"], -32602, "{lines:?}");
    let (ok, lines) = sdk(&py, &app, &["call", "nope", "--args", "{}"], None).await;
    assert!(!ok);
    assert_eq!(line(&lines, "error")["code"], -32602, "{lines:?}");
}
both_stores!(flowchart_tool, a_flowchart_is_a_tool_of_its_own);

/// A stage that needs a person suspends the flowchart's run: the call answers with the
/// suspension, as `ask` does, and `resume` finishes it with the flowchart's output.
async fn a_flowchart_tool_waiting_for_a_person_returns_its_suspension(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.require_approval = vec!["calculator".into()];
    })
    .await;
    let status = define_flowchart(
        &app,
        None,
        "fee",
        json!({
            "description": "The fee of an amount.",
            "inputSchema": {"type": "object", "properties": {"amount": {"type": "number"}},
                            "required": ["amount"]},
            "flowchart": {"start": "fee", "stages": {
                "fee": {"kind": "tool", "tool": "calculator", "output": "fee", "next": "done",
                        "args": {"expression": {"cat": [{"var": "args.amount"}, " * 0.02"]}}},
                "done": {"kind": "end", "result": {"fee": {"var": "state.fee.result"}}}
            }}
        }),
    )
    .await;
    assert_eq!(status, 201);
    let (result, _, _) = call(&py, &app, "fee", json!({"amount": 100}), &[], None).await;
    assert_eq!(result["isError"], false, "{result}");
    let s = &result["structured"];
    assert_eq!(s["status"], "suspended", "{s}");
    let named = &s["suspensions"][0];
    assert_eq!(named["kind"], "approval");
    assert_eq!(named["toolCall"]["name"], "calculator");
    let id = named["suspensionId"].as_str().unwrap();
    assert!(result["text"].as_str().unwrap().contains(id), "{result}");

    let (result, _, _) = call(
        &py,
        &app,
        "resume",
        json!({"suspensionId": id, "decision": "approve"}),
        &[],
        None,
    )
    .await;
    let s = &result["structured"];
    assert_eq!(s["status"], "completed", "{result}");
    assert_eq!(s["result"], json!({"fee": 2}), "{result}");
    let text: Value = serde_json::from_str(result["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, json!({"fee": 2}));
    assert_eq!(llm.calls(), 0, "no model request");
}
both_stores!(
    flowchart_tool_suspends,
    a_flowchart_tool_waiting_for_a_person_returns_its_suspension
);

async fn keys_and_tenants_are_those_of_v1(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("key-a:alpha,key-b:beta".into());
    })
    .await;
    assert_eq!(
        define_flowchart(&app, Some("key-a"), "triage", triage()).await,
        201
    );
    let names = |lines: &[Value]| -> Vec<String> {
        line(lines, "tools")
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, a) = sdk(&py, &app, &["list"], Some("key-a")).await;
    let (_, b) = sdk(&py, &app, &["list"], Some("key-b")).await;
    assert_eq!(names(&a), ["ask", "resume", "triage"]);
    assert_eq!(
        names(&b),
        ["ask", "resume"],
        "another tenant's flowchart is not its tool"
    );

    // A run of tenant alpha: beta cannot decide its suspension, or see its thread.
    let s = app
        .client
        .post(app.url("/v1/threads"))
        .bearer_auth("key-a")
        .json(&json!({"threadId": "shared", "config": {"requireApproval": ["calculator"]}}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(s.as_u16(), 201);
    let (result, _, _) = call(
        &py,
        &app,
        "ask",
        json!({"query": "2+2?", "threadId": "shared"}),
        &[],
        Some("key-a"),
    )
    .await;
    let id = result["structured"]["suspensions"][0]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = json!({"suspensionId": id, "decision": "approve"}).to_string();
    let (ok, lines) = sdk(
        &py,
        &app,
        &["call", "resume", "--args", &args],
        Some("key-b"),
    )
    .await;
    assert!(!ok);
    assert!(
        line(&lines, "error")["message"]
            .as_str()
            .unwrap()
            .contains("no suspension")
    );
    // The same thread id in beta is beta's own thread.
    let (result, _, _) = call(
        &py,
        &app,
        "ask",
        json!({"query": "2+2?", "threadId": "shared"}),
        &[],
        Some("key-b"),
    )
    .await;
    assert_eq!(result["structured"]["status"], "completed", "{result}");
    let (_, runs) = app.get_as("key-a", "/v1/threads/shared/runs").await;
    assert_eq!(runs["items"].as_array().unwrap().len(), 1);

    // A wrong key, or none, is refused before any MCP.
    let (ok, lines) = sdk(&py, &app, &["list"], Some("wrong")).await;
    assert!(
        !ok && lines.iter().all(|l| l.get("tools").is_none()),
        "{lines:?}"
    );
    let (st, ct, body) = raw(
        &app,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        &[],
    )
    .await;
    assert_eq!(
        (st, ct.as_str()),
        (401, "application/problem+json"),
        "{body}"
    );
}
both_stores!(keys_and_tenants, keys_and_tenants_are_those_of_v1);
