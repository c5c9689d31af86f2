//! pes-server as an A2A agent, driven by the official A2A Python SDK's client
//! (`tests/a2a/client.py`, run as a process): the card resolves; a blocking send completes with
//! the answer as an artifact; a stream carries working… completed in log order; get, list and
//! cancel; input-required answered by a message with the task's id; a resubscribe after kill -9
//! of the server gets everything after the cut; the v0.3 method names; JSON-RPC errors with A2A
//! codes; API keys and tenants. Without the venv these tests say so loudly and pass, except where
//! `PES_PYVENV` or `CI` is set: there a missing SDK fails them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, phase_of, plan};
use crate::helpers::{Backend, TestApp, database_url, repo_file, spawn_with};
use crate::process::{Proc, env_for};

/// The venv's Python with the Python A2A SDK (see [`crate::helpers::venv_python`]).
fn python() -> Option<PathBuf> {
    crate::helpers::venv_python("a2a.client", "the Python A2A SDK")
}

/// The SDK client against `base`.
struct Sdk {
    python: PathBuf,
    base: String,
    key: Option<String>,
}

impl Sdk {
    fn new(python: &Path, base: &str) -> Self {
        Self {
            python: python.to_owned(),
            base: base.to_owned(),
            key: None,
        }
    }

    fn with_key(python: &Path, base: &str, key: &str) -> Self {
        Self {
            key: Some(key.to_owned()),
            ..Self::new(python, base)
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.python);
        cmd.arg(repo_file("tests/a2a/client.py"))
            .arg(args[0])
            .arg(&self.base);
        cmd.args(&args[1..]);
        if let Some(k) = &self.key {
            cmd.args(["--key", k]);
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Run a command to its end: its JSON lines.
    async fn run(&self, args: &[&str]) -> Vec<Value> {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .expect("the SDK client finishes within 60 s")
            .expect("the SDK client runs");
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect();
        let failed = lines.last().is_some_and(|l| l.get("error").is_some());
        assert_eq!(
            out.status.success(),
            !failed,
            "{args:?}: {lines:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines
    }

    /// Run a command that answers one object.
    async fn one(&self, args: &[&str]) -> Value {
        let mut lines = self.run(args).await;
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        lines.remove(0)
    }

    /// Run a command whose answer is an error: its `{type, message}`.
    async fn error(&self, args: &[&str]) -> Value {
        let v = self.one(args).await;
        assert!(v["error"].is_object(), "{args:?} should fail: {v}");
        v["error"].clone()
    }

    /// Start a streaming command; its events are read as they arrive.
    fn spawn(&self, args: &[&str]) -> Events {
        let mut child = self.command(args).spawn().expect("the SDK client starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Events { child, lines }
    }
}

/// The events of a streaming command, line by line.
struct Events {
    #[allow(dead_code)]
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Events {
    /// The next event, or None when the command ended.
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("an event within 60 s")
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}")))
    }

    /// Every event to the end.
    async fn all(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }
}

/// The state of an event: a task's, or a status update's.
fn state(e: &Value) -> &str {
    e["task"]["status"]["state"]
        .as_str()
        .or_else(|| e["statusUpdate"]["status"]["state"].as_str())
        .unwrap_or("")
}

/// The observation `seq` an update comes from.
fn seq(e: &Value) -> Option<i64> {
    let pes = e
        .get("statusUpdate")
        .or_else(|| e.get("artifactUpdate"))
        .map(|u| &u["metadata"]["pes"]["seq"])?;
    pes.as_f64().map(|f| f as i64)
}

/// POST a raw JSON-RPC body to `/a2a`.
async fn rpc(app: &TestApp, body: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = app
        .client
        .post(app.url("/a2a"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    crate::helpers::read(req.send().await.unwrap()).await
}

fn call(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}).to_string()
}

/// The seqs of the observations of `run` a stream reports (every type but the silent ones).
fn reported_seqs(log: &[Value], run: &str) -> Vec<i64> {
    let silent = [
        "INTENT",
        "TITLE",
        "THOUGHTS",
        "AGENT_SUSPENDED",
        "COMPACTION",
        "FLOWCHART_STEP",
    ];
    log.iter()
        .filter(|o| o["runId"] == run && !silent.contains(&o["type"].as_str().unwrap()))
        .map(|o| o["seq"].as_i64().unwrap())
        .collect()
}

/// A thread's whole observation log, from a server process.
async fn proc_log(p: &Proc, thread: &str) -> Vec<Value> {
    let (s, page) = p
        .get(&format!("/v1/threads/{thread}/observations?limit=1000"))
        .await;
    assert_eq!(s, 200, "{page}");
    page["items"].as_array().unwrap().clone()
}

async fn the_card_resolves_and_a_blocking_send_completes_with_the_answer(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let sdk = Sdk::new(&py, &app.base);

    let card = sdk.one(&["card"]).await;
    assert_eq!(card["name"], "pes-server");
    assert_eq!(card["capabilities"]["streaming"], true);
    let endpoint = app.url("/a2a");
    assert_eq!(
        card["supportedInterfaces"],
        json!([
            {"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ])
    );
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(skills[0], "answer");
    assert!(skills.contains(&"tool:calculator"), "{skills:?}");
    assert!(card.get("securitySchemes").is_none(), "no keys, no scheme");

    let done = sdk.one(&["send", "--text", "what is 2+2?"]).await;
    let task = &done["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    let artifact = &task["artifacts"][0];
    assert_eq!(artifact["artifactId"], "response");
    assert_eq!(artifact["parts"][0]["text"], "final answer");
    assert!(artifact["parts"][1]["data"]["suggestions"].is_array());
    // The task is the run, the context its thread (created for the message).
    let (ctx, id) = (
        task["contextId"].as_str().unwrap(),
        task["id"].as_str().unwrap(),
    );
    let (s, run) = app.get(&format!("/v1/threads/{ctx}/runs/{id}")).await;
    assert_eq!((s, &run["status"]), (200, &json!("completed")), "{run}");
    assert_eq!(run["query"], "what is 2+2?");

    let got = sdk.one(&["get", "--task", id]).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "final answer");
    assert_eq!(got["history"][0]["parts"][0]["text"], "what is 2+2?");

    // A follow-up in the same context is a new task on the same thread.
    let next = sdk
        .one(&["send", "--context", ctx, "--text", "and 3+3?"])
        .await;
    assert_eq!(next["task"]["contextId"], ctx);
    assert_ne!(next["task"]["id"], id);
    let listed = sdk.one(&["list", "--context", ctx]).await;
    let ids: Vec<&Value> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["id"])
        .collect();
    assert_eq!(ids, [&next["task"]["id"], &json!(id)], "newest first");
    assert_eq!(listed["totalSize"], 2);
    assert!(
        listed["tasks"][0].get("artifacts").is_none(),
        "artifacts only on request"
    );
    let paged = sdk.one(&["list", "--page-size", "1"]).await;
    assert_eq!(paged["tasks"].as_array().unwrap().len(), 1);
    let token = paged["nextPageToken"].as_str().unwrap();
    let rest = sdk
        .one(&["list", "--page-size", "1", "--page-token", token])
        .await;
    assert_eq!(rest["tasks"][0]["id"], id);
    assert!(rest.get("nextPageToken").is_none_or(|t| t == ""));

    // Filters: by state, and by the time of the last change.
    let completed = sdk.one(&["list", "--status", "TASK_STATE_COMPLETED"]).await;
    assert_eq!(completed["totalSize"], 2, "{completed}");
    let working = sdk.one(&["list", "--status", "TASK_STATE_WORKING"]).await;
    assert!(
        working.get("tasks").is_none_or(|t| t == &json!([])),
        "{working}"
    );
    let later = |at: &str| call("ListTasks", json!({"statusTimestampAfter": at}));
    let (_, v) = rpc(&app, &later("2999-01-01T00:00:00Z"), &[]).await;
    assert_eq!(
        (
            v["result"]["totalSize"].as_i64(),
            v["result"]["nextPageToken"].as_str()
        ),
        (Some(0), Some("")),
        "{v}"
    );
    let (_, v) = rpc(&app, &later("2000-01-01T00:00:00Z"), &[]).await;
    assert_eq!(v["result"]["totalSize"], 2, "{v}");
    let (_, v) = rpc(&app, &later("yesterday"), &[]).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");

    // The v0.3 method names, through the SDK's v0.3 transport.
    let old = sdk
        .one(&["send", "--protocol", "0.3", "--text", "what is 5+5?"])
        .await;
    assert_eq!(
        old["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{old}"
    );
    assert_eq!(
        old["task"]["artifacts"][0]["parts"][0]["text"],
        "final answer"
    );
    let old_id = old["task"]["id"].as_str().unwrap();
    let got = sdk
        .one(&["get", "--protocol", "0.3", "--task", old_id])
        .await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
    // … whose wire shapes are v0.3's.
    let (s, raw) = rpc(&app, &call("tasks/get", json!({"id": old_id})), &[]).await;
    assert_eq!(s, 200);
    assert_eq!(raw["result"]["kind"], "task");
    assert_eq!(raw["result"]["status"]["state"], "completed");
    assert_eq!(raw["result"]["artifacts"][0]["parts"][0]["kind"], "text");
    app.stop().await;
}
both_stores!(
    card_and_send,
    the_card_resolves_and_a_blocking_send_completes_with_the_answer
);

async fn a_stream_carries_working_then_completed_in_log_order(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let sdk = Sdk::new(&py, &app.base);
    for protocol in ["1.0", "0.3"] {
        let events = sdk
            .run(&["stream", "--protocol", protocol, "--text", "what is 2+2?"])
            .await;
        let first = &events[0]["task"];
        assert_eq!(
            state(&events[0]),
            "TASK_STATE_SUBMITTED",
            "{protocol}: the stream starts with the new task: {events:?}"
        );
        let (ctx, id) = (
            first["contextId"].as_str().unwrap(),
            first["id"].as_str().unwrap(),
        );
        let last = events.last().unwrap();
        assert_eq!(state(last), "TASK_STATE_COMPLETED", "{protocol}: {last}");
        let artifact = &events[events.len() - 2]["artifactUpdate"];
        assert_eq!(artifact["artifact"]["parts"][0]["text"], "final answer");
        assert_eq!(artifact["lastChunk"], true);
        let middle = &events[1..events.len() - 2];
        assert!(
            middle.iter().all(|e| state(e) == "TASK_STATE_WORKING"),
            "{protocol}: {middle:?}"
        );
        let types: Vec<&str> = middle
            .iter()
            .map(|e| {
                e["statusUpdate"]["metadata"]["pes"]["type"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(types[0], "RUN_STARTED");
        assert!(
            types.contains(&"PLAN") && types.contains(&"TOOL_CALL"),
            "{types:?}"
        );
        // Every update comes from the log, in its order, and the log's reported steps all came.
        let seqs: Vec<i64> = events[1..].iter().filter_map(seq).collect();
        assert_eq!(seqs.len(), events.len() - 1);
        let want = reported_seqs(&app.observations(ctx).await, id);
        assert_eq!(seqs, want, "{protocol}");
    }
    app.stop().await;
}
both_stores!(stream, a_stream_carries_working_then_completed_in_log_order);

async fn a_slow_task_is_cancelled_and_cannot_be_cancelled_twice(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.debug_tools = true).await;
    let sdk = Sdk::new(&py, &app.base);
    llm.push(
        "plan",
        plan(&[("s1", "Wait a while (slow)", &["debug_sleep"], &[])]),
    );
    // The run holds in its first tool-using turn until the test lets it go.
    llm.hold_if(|r| phase_of(r) == "execute");
    let sent = sdk
        .one(&["send", "--no-wait", "--text", "take your time"])
        .await;
    let id = sent["task"]["id"].as_str().unwrap().to_owned();
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"].contains(&state(&sent)),
        "returnImmediately answers at once: {sent}"
    );
    llm.wait_in_flight(1).await;
    let working = sdk.one(&["get", "--task", &id]).await;
    assert_eq!(working["status"]["state"], "TASK_STATE_WORKING");

    let cancelled = sdk.one(&["cancel", "--task", &id]).await;
    assert_eq!(
        cancelled["status"]["state"], "TASK_STATE_CANCELED",
        "{cancelled}"
    );
    assert_eq!(cancelled["id"], id.as_str());
    let ctx = cancelled["contextId"].as_str().unwrap();
    let (_, run) = app.get(&format!("/v1/threads/{ctx}/runs/{id}")).await;
    assert_eq!(run["status"], "cancelled");
    llm.release();

    let again = sdk.error(&["cancel", "--task", &id]).await;
    assert_eq!(again["type"], "TaskNotCancelableError", "{again}");
    let gone = sdk
        .error(&["cancel", "--task", "01937c5e-0000-7000-8000-000000000000"])
        .await;
    assert_eq!(gone["type"], "TaskNotFoundError");
    app.stop().await;
}
both_stores!(
    cancel,
    a_slow_task_is_cancelled_and_cannot_be_cancelled_twice
);

async fn input_required_is_answered_by_a_message_with_the_task_id(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let sdk = Sdk::new(&py, &app.base);
    llm.push(
        "plan",
        plan(&[("s1", "Ask the user's name", &["ask_user"], &[])]),
    );
    let schema =
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}});
    llm.push(
        "execute",
        Reply::ToolCalls(vec![(
            "ask_user".into(),
            json!({"question": "What is your name?", "inputSchema": schema}),
        )]),
    );
    // The stream ends where the task needs input, with the question.
    let events = sdk.run(&["stream", "--text", "greet me"]).await;
    let last = events.last().unwrap();
    assert_eq!(state(last), "TASK_STATE_INPUT_REQUIRED", "{events:?}");
    let question = &last["statusUpdate"]["status"]["message"];
    assert_eq!(question["role"], "ROLE_AGENT");
    assert_eq!(question["parts"][0]["text"], "What is your name?");
    let details = &question["parts"][1]["data"]["suspension"];
    assert_eq!(details["kind"], "input");
    assert_eq!(details["inputSchema"], schema);
    let id = last["statusUpdate"]["taskId"].as_str().unwrap().to_owned();
    let ctx = last["statusUpdate"]["contextId"]
        .as_str()
        .unwrap()
        .to_owned();
    let got = sdk.one(&["get", "--task", &id]).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(
        got["status"]["message"]["parts"][0]["text"],
        "What is your name?"
    );

    // An answer that does not fit the question's schema is refused; the task still waits.
    let bad = sdk.error(&["send", "--task", &id, "--text", "Ada"]).await;
    assert_eq!(bad["type"], "InvalidParamsError", "{bad}");
    assert!(
        bad["message"].as_str().unwrap().contains("inputSchema"),
        "{bad}"
    );
    let other = sdk
        .error(&[
            "send",
            "--task",
            &id,
            "--context",
            "elsewhere",
            "--data",
            r#"{"name":"Ada"}"#,
        ])
        .await;
    assert_eq!(other["type"], "InvalidParamsError", "{other}");

    // The answer resumes the same run (respond), which completes.
    let done = sdk
        .one(&[
            "send",
            "--task",
            &id,
            "--context",
            &ctx,
            "--data",
            r#"{"name":"Ada"}"#,
        ])
        .await;
    assert_eq!(done["task"]["id"], id.as_str());
    assert_eq!(
        done["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );
    let last_exec = llm.requests_of("execute").last().unwrap().to_string();
    assert!(last_exec.contains("Ada"), "the answer is the tool's result");
    let obs = app.observations(&ctx).await;
    let resumed: Vec<&Value> = obs
        .iter()
        .filter(|o| o["type"] == "AGENT_RESUMED")
        .collect();
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0]["content"]["decision"], "respond");

    // A finished task takes no more messages.
    let late = sdk
        .error(&["send", "--task", &id, "--text", "hello?"])
        .await;
    assert_eq!(late["type"], "UnsupportedOperationError", "{late}");
    app.stop().await;
}
both_stores!(
    input_required,
    input_required_is_answered_by_a_message_with_the_task_id
);

async fn a_resubscribe_after_kill_9_gets_every_update_after_the_cut(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let db = database_url(backend).await;
    let mut env = env_for(&db, &llm.url);
    env.push(("PES_LEASE_SECONDS", "2".into()));
    let first = Proc::start(&env).await;
    // The run stops short of its synthesis until the test lets it go.
    llm.hold_if(|r| phase_of(r) == "synthesis");
    let mut stream = Sdk::new(&py, &first.base).spawn(&["stream", "--text", "what is 2+2?"]);
    let head = stream.next().await.expect("the task");
    let id = head["task"]["id"].as_str().unwrap().to_owned();
    let ctx = head["task"]["contextId"].as_str().unwrap().to_owned();
    llm.wait_for_request(|r| phase_of(r) == "synthesis").await;
    // Read the updates of everything committed before the cut (the run waits on its synthesis).
    let committed = reported_seqs(&proc_log(&first, &ctx).await, &id);
    let mut before = vec![head];
    while seq(before.last().unwrap()) != committed.last().copied() {
        before.push(stream.next().await.expect("the updates committed so far"));
    }
    first.kill9().await;
    let rest = stream.all().await;
    assert!(
        rest.iter().all(|e| e.get("error").is_some()),
        "the cut ends the stream with an error: {rest:?}"
    );

    // A new process on the same store takes the run over once its lease runs out; the client
    // resubscribes there.
    let second = Proc::start(&env).await;
    let mut again = Sdk::new(&py, &second.base).spawn(&["resubscribe", "--task", &id]);
    let snapshot = again.next().await.expect("the task first");
    assert_eq!(snapshot["task"]["id"], id.as_str(), "{snapshot}");
    assert_eq!(state(&snapshot), "TASK_STATE_WORKING");
    let cut = snapshot["task"]["metadata"]["pes"]["seq"].as_f64().unwrap() as i64;
    llm.release();
    let after = again.all().await;
    assert_eq!(
        state(after.last().unwrap()),
        "TASK_STATE_COMPLETED",
        "{after:?}"
    );
    assert_eq!(
        after[after.len() - 2]["artifactUpdate"]["artifact"]["parts"][0]["text"],
        "final answer"
    );

    // Nothing lost, nothing invented: the updates before the cut are a prefix of the log's, and
    // the resubscribe brings every one after its snapshot, in order.
    let want = reported_seqs(&proc_log(&second, &ctx).await, &id);
    let seen_before: Vec<i64> = before.iter().filter_map(seq).collect();
    assert_eq!(seen_before, want[..seen_before.len()], "{before:?}");
    assert!(cut >= *seen_before.last().unwrap());
    let seen_after: Vec<i64> = after.iter().filter_map(seq).collect();
    let want_after: Vec<i64> = want.iter().copied().filter(|s| *s > cut).collect();
    assert_eq!(seen_after, want_after);
    let types: Vec<&str> = after
        .iter()
        .filter_map(|e| e["statusUpdate"]["metadata"]["pes"]["type"].as_str())
        .collect();
    assert!(types.contains(&"RUN_COMPLETED"), "{types:?}");
    second.kill9().await;
}
both_stores!(
    resubscribe,
    a_resubscribe_after_kill_9_gets_every_update_after_the_cut
);

async fn json_rpc_errors_carry_a2a_codes_and_never_a_500(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let code = |v: &Value| v["error"]["code"].as_i64();

    let (s, v) = rpc(&app, "{not json", &[]).await;
    assert_eq!(
        (s, code(&v), &v["id"]),
        (400, Some(-32700), &Value::Null),
        "{v}"
    );
    let (s, v) = rpc(&app, "[1, 2]", &[]).await;
    assert_eq!((s, code(&v)), (400, Some(-32600)), "{v}");
    let (s, v) = rpc(&app, r#"{"jsonrpc": "2.0", "id": 4}"#, &[]).await;
    assert_eq!(
        (s, code(&v), &v["id"]),
        (400, Some(-32600), &json!(4)),
        "{v}"
    );
    let (s, v) = rpc(&app, &call("tasks/fly", json!({})), &[]).await;
    assert_eq!(
        (s, code(&v), &v["id"]),
        (200, Some(-32601), &json!("r1")),
        "{v}"
    );
    let (s, v) = rpc(&app, &call("GetTask", json!({})), &[]).await;
    assert_eq!((s, code(&v)), (200, Some(-32602)), "no id: {v}");
    let (s, v) = rpc(&app, &call("GetTask", json!({"id": "no-such-task"})), &[]).await;
    assert_eq!((s, code(&v)), (200, Some(-32001)), "{v}");
    assert_eq!(v["error"]["data"][0]["reason"], "TASK_NOT_FOUND");
    assert_eq!(v["error"]["data"][0]["metadata"]["taskId"], "no-such-task");
    let (_, v) = rpc(&app, &call("tasks/get", json!({"id": "no-such-task"})), &[]).await;
    assert_eq!(code(&v), Some(-32001), "{v}");
    assert_eq!(
        v["error"]["data"]["taskId"], "no-such-task",
        "v0.3: data is an object"
    );

    let message = |parts: Value, extra: Value| {
        let mut m = json!({"messageId": "m-1", "role": "ROLE_USER", "parts": parts});
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"message": m, "configuration": {"returnImmediately": true}})
    };
    let (_, v) = rpc(
        &app,
        &call(
            "SendMessage",
            message(
                json!([{"text": "hi"}]),
                json!({"contextId": "not a valid id!"}),
            ),
        ),
        &[],
    )
    .await;
    assert_eq!(code(&v), Some(-32602), "an invalid contextId: {v}");
    let (_, v) = rpc(
        &app,
        &call(
            "SendMessage",
            message(
                json!([{"url": "https://x.test/cat.png", "mediaType": "image/png"}]),
                json!({}),
            ),
        ),
        &[],
    )
    .await;
    assert_eq!(code(&v), Some(-32005), "{v}");
    let (_, v) = rpc(
        &app,
        &call("SendMessage", message(json!([]), json!({}))),
        &[],
    )
    .await;
    assert_eq!(code(&v), Some(-32602), "no parts: {v}");
    let (_, v) = rpc(
        &app,
        &call(
            "SendMessage",
            message(
                json!([{"text": "hi"}]),
                json!({"taskId": "01937c5e-0000-7000-8000-000000000000"}),
            ),
        ),
        &[],
    )
    .await;
    assert_eq!(code(&v), Some(-32001), "a message to an unknown task: {v}");
    let (_, v) = rpc(
        &app,
        &call("SendMessage", message(json!([{"text": "hi"}]), json!({}))),
        &[("A2A-Version", "2.0")],
    )
    .await;
    assert_eq!(code(&v), Some(-32009), "{v}");
    let (_, v) = rpc(
        &app,
        &call("CreateTaskPushNotificationConfig", json!({})),
        &[],
    )
    .await;
    assert_eq!(code(&v), Some(-32003), "{v}");
    let (_, v) = rpc(&app, &call("ListTasks", json!({"pageSize": 0})), &[]).await;
    assert_eq!(code(&v), Some(-32602), "{v}");

    // A finished task cannot be subscribed to; its stream answer is a plain JSON-RPC error.
    let (_, v) = rpc(
        &app,
        &call(
            "SendMessage",
            message(json!([{"text": "what is 2+2?"}]), json!({})),
        ),
        &[("A2A-Version", "1.0")],
    )
    .await;
    let id = v["result"]["task"]["id"].as_str().unwrap().to_owned();
    let done = app
        .wait_run(
            v["result"]["task"]["contextId"].as_str().unwrap(),
            &id,
            |r| r["status"] == "completed",
        )
        .await;
    assert_eq!(done["status"], "completed");
    let (s, v) = rpc(&app, &call("SubscribeToTask", json!({"id": id})), &[]).await;
    assert_eq!((s, code(&v)), (200, Some(-32004)), "{v}");
    let (_, v) = rpc(&app, &call("CancelTask", json!({"id": id})), &[]).await;
    assert_eq!(code(&v), Some(-32002), "{v}");
    app.stop().await;
}
both_stores!(errors, json_rpc_errors_carry_a2a_codes_and_never_a_500);

async fn api_keys_guard_a2a_and_tenants_do_not_see_each_others_tasks(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("k-acme:acme,k-globex:globex".into());
    })
    .await;
    // The card is public, and names the bearer scheme.
    let (s, card) = app.get("/.well-known/agent-card.json").await;
    assert_eq!(s, 200);
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    assert_eq!(card["security"], json!([{"bearer": []}]));
    let (s, _) = rpc(&app, &call("ListTasks", json!({})), &[]).await;
    assert_eq!(s, 401, "no key");
    let (s, _) = rpc(
        &app,
        &call("ListTasks", json!({})),
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(s, 401, "a wrong key");

    let acme = Sdk::with_key(&py, &app.base, "k-acme");
    let globex = Sdk::with_key(&py, &app.base, "k-globex");
    let parsed = acme.one(&["card"]).await;
    assert!(parsed["securitySchemes"]["bearer"].is_object(), "{parsed}");
    let done = acme.one(&["send", "--text", "what is 2+2?"]).await;
    assert_eq!(done["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    let id = done["task"]["id"].as_str().unwrap();
    let ctx = done["task"]["contextId"].as_str().unwrap();

    let hidden = globex.error(&["get", "--task", id]).await;
    assert_eq!(hidden["type"], "TaskNotFoundError", "{hidden}");
    let hidden = globex.error(&["cancel", "--task", id]).await;
    assert_eq!(hidden["type"], "TaskNotFoundError", "{hidden}");
    let theirs = globex.one(&["list"]).await;
    assert!(
        theirs.get("tasks").is_none_or(|t| t == &json!([])),
        "{theirs}"
    );
    let ours = acme.one(&["list"]).await;
    assert_eq!(ours["tasks"][0]["id"], id);
    // The same context id is another thread for another tenant.
    let other = globex
        .one(&["send", "--context", ctx, "--text", "what is 2+2?"])
        .await;
    assert_eq!(other["task"]["contextId"], ctx);
    assert_eq!(
        acme.one(&["list", "--context", ctx]).await["tasks"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let anonymous = Sdk::new(&py, &app.base).error(&["list"]).await;
    assert!(
        anonymous["message"].as_str().unwrap().contains("401"),
        "{anonymous}"
    );
    app.stop().await;
}
both_stores!(
    auth,
    api_keys_guard_a2a_and_tenants_do_not_see_each_others_tasks
);
