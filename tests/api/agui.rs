//! `POST /v1/ag-ui` read by the official AG-UI Python package (`ag-ui-protocol`, through
//! `tests/agui/client.py`, run as a process): every event validates against the package's models
//! and comes back from them unchanged, and the order rules hold (each start closed, steps
//! balanced, `RUN_FINISHED` last, every `STATE_DELTA` applies). A run with a tool that needs
//! approval ends with an interrupt; the next input's `resume` completes it; a reconnect with
//! `Last-Event-ID` loses nothing. The thread is created when missing; tenants are kept apart.
//! Bad input is a problem, before anything starts. Without the venv the Python-driven tests say
//! so loudly and pass, except where `PES_PYVENV` or `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, TestApp, item_statuses, repo_file, spawn_with, statuses};

fn python() -> Option<PathBuf> {
    crate::helpers::venv_python("ag_ui.core", "the AG-UI Python package (ag-ui-protocol)")
}

/// What the Python consumer read of one POST.
#[derive(Debug, Default)]
struct Read {
    /// Each event, with its SSE `id:`.
    events: Vec<(Value, Option<i64>)>,
    /// The state after the last delta.
    state: Value,
    /// An HTTP error instead of a stream: (status, problem).
    http: Option<(u16, Value)>,
}

impl Read {
    fn types(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|(e, _)| e["type"].as_str().unwrap())
            .collect()
    }

    fn first(&self, kind: &str) -> &Value {
        self.all(kind)
            .first()
            .copied()
            .unwrap_or_else(|| panic!("no {kind} in {:?}", self.types()))
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.events
            .iter()
            .map(|(e, _)| e)
            .filter(|e| e["type"] == kind)
            .collect()
    }

    fn last(&self) -> &Value {
        &self.events.last().expect("events").0
    }
}

/// Run the consumer against `app` with `input` (and `key`, `Last-Event-ID`).
async fn agui(
    py: &Path,
    app: &TestApp,
    input: &Value,
    key: Option<&str>,
    last_event_id: Option<i64>,
) -> Read {
    let mut cmd = tokio::process::Command::new(py);
    cmd.arg(repo_file("tests/agui/client.py"))
        .arg(&app.base)
        .args(["--input", &input.to_string()]);
    if let Some(k) = key {
        cmd.args(["--key", k]);
    }
    if let Some(n) = last_event_id {
        cmd.args(["--last-event-id", &n.to_string()]);
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the AG-UI consumer finishes within 60 s")
        .expect("the AG-UI consumer runs");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    assert!(
        out.status.success(),
        "the consumer refused the stream: {:?}\n{}",
        lines.last(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut read = Read::default();
    for l in lines {
        if let Some(e) = l.get("event") {
            let id = l["id"].as_str().map(|s| s.parse().unwrap());
            read.events.push((e.clone(), id));
        } else if let Some(d) = l.get("done") {
            read.state = d["state"].clone();
        } else if let Some(h) = l.get("http") {
            read.http = Some((h["status"].as_u64().unwrap() as u16, h["body"].clone()));
        }
    }
    read
}

fn user(text: &str) -> Value {
    json!({"id": uuid::Uuid::new_v4().to_string(), "role": "user", "content": text})
}

async fn a_tool_run_is_interrupted_for_approval_and_a_resume_completes_it(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    // The answer is written in pieces, so it streams as text content.
    llm.stream_slowly(4, Duration::from_millis(5));
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let thread = format!("agui-{}", uuid::Uuid::new_v4().simple());

    let input = json!({
        "threadId": thread,
        "runId": "agui-run-1",
        "state": {},
        "messages": [
            {"id": "s1", "role": "system", "content": "Be brief."},
            user("what is 2+2?"),
        ],
        "tools": [],
        "context": [{"description": "the user's name", "value": "Ada"}],
        "forwardedProps": {"pes": {"config": {"requireApproval": ["calculator"]}}, "app": {"x": 1}},
    });
    let first = agui(&py, &app, &input, None, None).await;
    let types = first.types();
    assert_eq!(types[..2], ["RUN_STARTED", "STATE_SNAPSHOT"], "{types:?}");
    let started = first.first("RUN_STARTED");
    assert_eq!(started["threadId"], thread.as_str());
    assert_eq!(started["runId"], "agui-run-1");
    assert_eq!(started["protocolVersion"], "1.0");
    let pes_run = started["metadata"]["pes"]["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The thread was created for the input, and the query is its last user message with the
    // context below it.
    let (s, run) = app
        .get(&format!("/v1/threads/{thread}/runs/{pes_run}"))
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "suspended");
    assert_eq!(
        run["query"],
        "what is 2+2?\n\nContext:\n- the user's name: Ada"
    );
    assert_eq!(run["config"]["requireApproval"], json!(["calculator"]));
    // The item runs until its tool call waits for a person.
    let step = first.first("STEP_STARTED")["stepName"].as_str().unwrap();
    let call = first.first("TOOL_CALL_START");
    assert_eq!(call["toolCallName"], "calculator");
    let call_id = call["toolCallId"].as_str().unwrap().to_owned();
    let args: Value =
        serde_json::from_str(first.first("TOOL_CALL_ARGS")["delta"].as_str().unwrap()).unwrap();
    assert!(args["expression"].is_string(), "{args}");
    assert!(first.all("TOOL_CALL_RESULT").is_empty(), "not run yet");
    assert!(first.all("TEXT_MESSAGE_START").is_empty(), "no answer yet");
    // The run ends with the pending suspension as its interrupt.
    let end = first.last();
    assert_eq!(end["type"], "RUN_FINISHED");
    assert_eq!(end["runId"], "agui-run-1");
    assert_eq!(end["outcome"]["type"], "interrupt");
    let interrupts = end["outcome"]["interrupts"].as_array().unwrap();
    assert_eq!(interrupts.len(), 1, "{end}");
    let interrupt = &interrupts[0];
    let (_, pending) = app.get(&format!("/v1/threads/{thread}/suspensions")).await;
    let suspension_id = pending["items"][0]["suspensionId"].as_str().unwrap();
    assert_eq!(interrupt["id"], suspension_id);
    assert_eq!(interrupt["reason"], "tool_approval");
    assert_eq!(interrupt["toolCallId"], call_id.as_str());
    assert_eq!(interrupt["responseSchema"]["required"], json!(["decision"]));
    assert_eq!(interrupt["metadata"]["pes"]["itemId"], step);
    // The state the deltas built is the thread's todo list as it stands.
    assert_eq!(
        item_statuses(&first.state),
        statuses(&app, None, &thread).await
    );
    assert!(
        first.state["todoList"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == step && i["status"] == "waiting"),
        "{}",
        first.state
    );

    // The next input answers the interrupt: the run goes on as a new AG-UI run.
    let resume = json!({
        "threadId": thread,
        "runId": "agui-run-2",
        "messages": input["messages"],
        "resume": [{"interruptId": suspension_id, "status": "resolved", "payload": {"decision": "approve", "reason": "fine"}}],
    });
    let second = agui(&py, &app, &resume, None, None).await;
    let types = second.types();
    assert_eq!(
        types[..3],
        ["RUN_STARTED", "STATE_SNAPSHOT", "STEP_STARTED"],
        "the waiting item's step opens at once: {types:?}"
    );
    assert_eq!(second.first("RUN_STARTED")["runId"], "agui-run-2");
    assert_eq!(second.first("STEP_STARTED")["stepName"], step);
    let result = second.first("TOOL_CALL_RESULT");
    assert_eq!(result["toolCallId"], call_id.as_str());
    let output: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert!(output["result"].is_number(), "{output}");
    // The answer streams in pieces, which add up to the answer the run stored.
    let text: String = second
        .all("TEXT_MESSAGE_CONTENT")
        .iter()
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "final answer");
    assert!(
        second.all("TEXT_MESSAGE_CONTENT").len() > 1,
        "token deltas: {types:?}"
    );
    let end = second.last();
    assert_eq!(end["type"], "RUN_FINISHED");
    assert_eq!(end["outcome"], json!({"type": "success"}));
    assert_eq!(end["result"]["response"], "final answer");
    let usage = &end["usage"][0];
    assert_eq!(usage["model"], "fake-model");
    assert!(usage["totalTokens"].as_u64().unwrap() > 0, "{usage}");
    let (_, run) = app
        .get(&format!("/v1/threads/{thread}/runs/{pes_run}"))
        .await;
    assert_eq!(run["status"], "completed");
    assert!(
        usage["totalTokens"].as_u64() < run["usage"]["totalTokens"].as_u64(),
        "the resumed AG-UI run reports only what it spent itself: {usage} vs {}",
        run["usage"]
    );
    let final_statuses = statuses(&app, None, &thread).await;
    assert!(final_statuses.iter().all(|(_, s)| s == "completed"));
    assert_eq!(item_statuses(&second.state), final_statuses);

    // The same answer again is refused: the suspension is decided.
    let again = agui(&py, &app, &resume, None, None).await;
    let (status, problem) = again.http.expect("a problem, not a stream");
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("suspension_resolved"))
    );

    // A reconnect to the first AG-UI run after one of its ids gets every event after it.
    let (cut, _) = first
        .events
        .iter()
        .enumerate()
        .filter(|(_, (_, id))| id.is_some())
        .nth(1)
        .map(|(i, (_, id))| (i, id.unwrap()))
        .unwrap();
    let cut_id = first.events[cut].1.unwrap();
    let again = agui(&py, &app, &input, None, Some(cut_id)).await;
    assert_eq!(again.first("RUN_STARTED")["runId"], "agui-run-1");
    let after: Vec<&Value> = again
        .events
        .iter()
        .map(|(e, _)| e)
        .filter(|e| {
            !matches!(
                e["type"].as_str(),
                Some("RUN_STARTED" | "STATE_SNAPSHOT" | "STEP_STARTED")
            )
        })
        .collect();
    let want: Vec<&Value> = first.events[cut + 1..]
        .iter()
        .map(|(e, _)| e)
        .filter(|e| e["type"] != "STEP_STARTED")
        .collect();
    assert_eq!(after, want, "a reconnect loses and invents nothing");
    // Nothing was posted again: still one run on the thread.
    let (_, runs) = app.get(&format!("/v1/threads/{thread}/runs")).await;
    assert_eq!(runs["items"].as_array().unwrap().len(), 1, "{runs}");
}
both_stores!(
    approval_interrupt_and_resume,
    a_tool_run_is_interrupted_for_approval_and_a_resume_completes_it
);

async fn a_question_is_answered_by_the_payload_and_a_cancelled_entry_rejects(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    llm.push(
        "plan",
        plan(&[("q1", "Ask for the city", &["ask_user"], &[])]),
    );
    // The item asks, then (answered) asks again, then answers.
    llm.push_item(
        "q1",
        Reply::ToolCalls(vec![(
            "ask_user".into(),
            json!({"question": "Which city?", "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}),
        )]),
    )
    .push_item(
        "q1",
        Reply::ToolCalls(vec![("ask_user".into(), json!({"question": "Sure?"}))]),
    );
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let thread = format!("agui-{}", uuid::Uuid::new_v4().simple());
    let input = json!({"threadId": thread, "runId": "q-1", "messages": [user("weather?")]});
    let first = agui(&py, &app, &input, None, None).await;
    let end = first.last();
    let interrupt = &end["outcome"]["interrupts"][0];
    assert_eq!(interrupt["reason"], "input_required", "{end}");
    assert_eq!(interrupt["message"], "Which city?");
    assert_eq!(interrupt["responseSchema"]["required"], json!(["city"]));
    assert!(interrupt.get("toolCallId").is_none(), "not an approval");
    let id = interrupt["id"].as_str().unwrap();

    // An answer that does not fit the question's schema is refused before anything happens.
    let bad = json!({"threadId": thread, "runId": "q-2", "messages": [],
        "resume": [{"interruptId": id, "status": "resolved", "payload": {"town": "Oslo"}}]});
    let refused = agui(&py, &app, &bad, None, None).await;
    let (status, problem) = refused.http.expect("a problem");
    assert_eq!(status, 422, "{problem}");

    let answer = json!({"threadId": thread, "runId": "q-2", "messages": [],
        "resume": [{"interruptId": id, "status": "resolved", "payload": {"city": "Oslo"}}]});
    let second = agui(&py, &app, &answer, None, None).await;
    let result = second.first("TOOL_CALL_RESULT");
    assert!(
        result["content"].as_str().unwrap().contains("Oslo"),
        "{result}"
    );
    let again = &second.last()["outcome"]["interrupts"][0];
    assert_eq!(again["message"], "Sure?");
    // Abandoning the question rejects it, and the run goes on to its end.
    let abandon = json!({"threadId": thread, "runId": "q-3", "messages": [],
        "resume": [{"interruptId": again["id"], "status": "cancelled"}]});
    let third = agui(&py, &app, &abandon, None, None).await;
    assert_eq!(
        third.last()["outcome"]["type"],
        "success",
        "{:?}",
        third.types()
    );
    let (_, all) = app
        .get(&format!("/v1/threads/{thread}/suspensions?status=all"))
        .await;
    let decisions: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["respond", "reject"]);
}
both_stores!(
    question_interrupts,
    a_question_is_answered_by_the_payload_and_a_cancelled_entry_rejects
);

async fn tenants_never_see_each_others_runs(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("key-a:alpha,key-b:beta".into());
    })
    .await;
    let input = json!({"threadId": "shared", "runId": "r1", "messages": [user("2+2?")],
        "forwardedProps": {"pes": {"config": {"requireApproval": ["calculator"]}}}});
    let a = agui(&py, &app, &input, Some("key-a"), None).await;
    let interrupt = a.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Another tenant cannot answer it: to it the suspension does not exist.
    let steal = json!({"threadId": "shared", "runId": "r2", "messages": [],
        "resume": [{"interruptId": interrupt, "status": "resolved", "payload": {"decision": "approve"}}]});
    let refused = agui(&py, &app, &steal, Some("key-b"), None).await;
    let (status, problem) = refused.http.expect("a problem");
    assert_eq!(
        (status, problem["code"].as_str()),
        (404, Some("suspension_not_found"))
    );
    // The same thread id and run id in another tenant are another thread and another run.
    let b = agui(&py, &app, &input, Some("key-b"), None).await;
    let b_run = b.first("RUN_STARTED")["metadata"]["pes"]["runId"].clone();
    assert_ne!(b_run, a.first("RUN_STARTED")["metadata"]["pes"]["runId"]);
    let (_, runs) = app.get_as("key-b", "/v1/threads/shared/runs").await;
    let ids: Vec<&Value> = runs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["runId"])
        .collect();
    assert_eq!(ids, [&b_run]);
    // And a key that is not one is refused.
    let anon = agui(&py, &app, &input, Some("nope"), None).await;
    assert_eq!(anon.http.expect("refused").0, 401);
}
both_stores!(tenant_isolation, tenants_never_see_each_others_runs);

async fn post(app: &TestApp, body: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = app
        .client
        .post(app.url("/v1/ag-ui"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    crate::helpers::read(req.send().await.unwrap()).await
}

async fn bad_input_is_a_problem_and_starts_nothing(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.agui_max_body_bytes = 4096;
        c.tenant_max_streams = 1;
    })
    .await;
    let cases = [
        (json!({"threadId": "t", "messages": []}).to_string(), 422, "validation_failed"),
        (
            json!({"threadId": "t", "messages": [{"id": "a", "role": "assistant", "content": "hi"}]}).to_string(),
            422,
            "validation_failed",
        ),
        (
            json!({"threadId": "t", "messages": [{"id": "u", "role": "user", "content": [{"type": "image", "source": {"type": "url", "value": "http://x"}}]}]}).to_string(),
            422,
            "validation_failed",
        ),
        (json!({"threadId": "a b", "messages": [user("x")]}).to_string(), 422, "validation_failed"),
        (
            json!({"threadId": "t", "runId": "", "messages": [user("x")]}).to_string(),
            422,
            "validation_failed",
        ),
        (
            json!({"threadId": "t", "messages": [user("x")], "forwardedProps": {"pes": {"config": {"maxIterations": 0}}}}).to_string(),
            422,
            "validation_failed",
        ),
        (
            json!({"threadId": "t", "messages": [user("x")], "forwardedProps": {"pes": {"colour": 1}}}).to_string(),
            422,
            "validation_failed",
        ),
        (
            json!({"threadId": "t", "messages": [], "resume": [{"interruptId": uuid::Uuid::new_v4(), "status": "resolved", "payload": {}}]}).to_string(),
            404,
            "suspension_not_found",
        ),
        (
            json!({"threadId": "t", "messages": [], "resume": [{"interruptId": "x", "status": "maybe"}]}).to_string(),
            422,
            "validation_failed",
        ),
        ("[1]".to_owned(), 422, "validation_failed"),
        ("{".to_owned(), 400, "malformed_json"),
        (
            json!({"threadId": "t", "messages": [user(&"x".repeat(5000))]}).to_string(),
            413,
            "payload_too_large",
        ),
    ];
    for (body, status, code) in cases {
        let (s, problem) = post(&app, &body, &[]).await;
        assert_eq!(
            (s, problem["code"].as_str()),
            (status, Some(code)),
            "{body}: {problem}"
        );
    }
    let (s, problem) = post(
        &app,
        &json!({"threadId": "t", "runId": "r", "messages": [user("x")]}).to_string(),
        &[("last-event-id", "minus one")],
    )
    .await;
    assert_eq!((s, problem["code"].as_str()), (400, Some("invalid_header")));
    let (s, _) = post(
        &app,
        &json!({"threadId": "t", "messages": [user("x")]}).to_string(),
        &[("last-event-id", "3")],
    )
    .await;
    assert_eq!(s, 422, "a reconnect needs the runId");
    let r = app
        .client
        .post(app.url("/v1/ag-ui"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    // None of these made a thread.
    let (_, threads) = app.get("/v1/threads").await;
    assert_eq!(threads["items"], json!([]), "{threads}");

    // One stream slot per open stream: a second stream is refused while the first is open, and
    // starts nothing.
    llm.hold();
    let open = app
        .client
        .post(app.url("/v1/ag-ui"))
        .json(&json!({"threadId": "slot", "runId": "s1", "messages": [user("x")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status().as_u16(), 200);
    let (s, problem) = post(
        &app,
        &json!({"threadId": "slot-2", "runId": "s2", "messages": [user("x")]}).to_string(),
        &[],
    )
    .await;
    assert_eq!((s, problem["code"].as_str()), (429, Some("quota_exceeded")));
    let (s, _) = app.get("/v1/threads/slot-2").await;
    assert_eq!(s, 404, "a refused stream starts no run");
    drop(open);
    llm.release();
}
both_stores!(bad_input, bad_input_is_a_problem_and_starts_nothing);
