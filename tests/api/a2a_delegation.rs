//! Runs delegating items to remote agents built with the official Python SDK: the
//! `delegate_to_agent` tool in the catalogue, the remote's answer as the tool's result, every
//! remote update committed under the delegating `TOOL_CALL`, a failing remote as a tool error,
//! a v0.3-only agent, and kill -9 while a remote task is pending: the new process watches the
//! recorded task again and never sends the message twice.
//!
//! Then the client's guards, against fake remotes on 127.0.0.1 that record what reaches them
//! ([`Remote`]): a card cannot send our requests (or the agent's headers) to another origin, a
//! redirect cannot either, and a card, reply or stream event past `PES_A2A_MAX_BYTES` is an
//! error the model reads while the service keeps answering.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::a2a_client::{Agent, python};
use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, TestApp, spawn_with};
use crate::process::{Proc, env_for};

/// Script a one-item plan whose item delegates `message` to `agent` (the item's first turn).
fn script_delegation(llm: &FakeLlm, item: &str, desc: &str, agent: &str, message: &str) {
    llm.push("plan", plan(&[(item, desc, &["delegate_to_agent"], &[])]));
    llm.push_item(
        item,
        Reply::ToolCalls(vec![(
            "delegate_to_agent".into(),
            json!({"agent": agent, "message": message}),
        )]),
    );
}

fn agents_json(agents: &[(&str, &Agent)]) -> String {
    let map: serde_json::Map<String, Value> = agents
        .iter()
        .map(|(name, a)| {
            (
                (*name).to_owned(),
                json!({"url": format!("{}/.well-known/agent-card.json", a.base)}),
            )
        })
        .collect();
    Value::Object(map).to_string()
}

async fn a_run_delegates_to_remote_agents(backend: Backend) {
    let Some(python) = python() else { return };
    let echo = Agent::start(&python, "echo", "1.0").await;
    let old = Agent::start(&python, "echo", "0.3").await;
    let failing = Agent::start(&python, "failing", "1.0").await;
    let llm = FakeLlm::start().await;
    let agents = agents_json(&[("echo", &echo), ("old", &old), ("failing", &failing)]);
    let app = spawn_with(backend, Some(&llm), |c| c.a2a_agents = Some(agents)).await;

    let (_, cat) = app.get("/v1/tools").await;
    let tool = cat["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "delegate_to_agent")
        .cloned()
        .unwrap_or_else(|| panic!("{cat}"));
    assert_eq!(tool["source"], "a2a");
    assert_eq!(
        tool["parameters"]["properties"]["agent"]["enum"],
        json!(["echo", "failing", "old"])
    );
    assert!(
        tool["description"].as_str().unwrap().contains("echo"),
        "{tool}"
    );

    llm.push(
        "plan",
        plan(&[("s1", "Ask the remote agents", &["delegate_to_agent"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            (
                "delegate_to_agent".into(),
                json!({"agent": "echo", "message": "hi"}),
            ),
            (
                "delegate_to_agent".into(),
                json!({"agent": "old", "message": "hello"}),
            ),
            (
                "delegate_to_agent".into(),
                json!({"agent": "failing", "message": "x"}),
            ),
        ]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "delegate").await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let of = |ty: &str| obs.iter().filter(|o| o["type"] == ty).collect::<Vec<_>>();
    let execs = of("TOOL_EXECUTION");
    assert_eq!(execs[0]["content"]["output"], "echo: hi");
    assert_eq!(
        execs[1]["content"]["output"], "echo: hello",
        "a v0.3-only agent"
    );
    assert_eq!(execs[2]["content"]["status"], "error");
    assert!(
        execs[2]["content"]["error"]
            .as_str()
            .unwrap()
            .contains("ended the task as failed"),
        "{}",
        execs[2]
    );
    let calls = of("TOOL_CALL");
    for (i, call) in calls.iter().enumerate() {
        let all_updates = of("A2A_TASK_UPDATE");
        let updates: Vec<&Value> = all_updates
            .iter()
            .filter(|u| u["content"]["toolCallId"] == call["content"]["toolCallId"])
            .copied()
            .collect();
        assert!(!updates.is_empty(), "call {i}");
        for u in &updates {
            assert_eq!(
                u["parentId"], call["id"],
                "updates nest under the TOOL_CALL"
            );
        }
        assert!(updates[0]["content"]["taskId"].is_string());
    }
    app.stop().await;
}

/// kill -9 while the remote task works: the recorded task is watched again by the next process
/// and the message is never sent twice.
async fn a_pending_delegation_survives_kill_9_without_being_sent_again(backend: Backend) {
    let Some(python) = python() else { return };
    let slow = Agent::start(&python, "slow", "1.0").await;
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    let mut env = env_for(&db, &llm.url);
    env.push(("PES_A2A_AGENTS", agents_json(&[("slow", &slow)])));
    env.push(("PES_LEASE_SECONDS", "3".into()));
    env.push(("PES_HEARTBEAT_MS", "200".into()));
    // Parked at once: the kill finds the run held by its watcher, not by a worker slot.
    env.push(("PES_A2A_PARK_AFTER_MS", "0".into()));
    script_delegation(&llm, "s1", "Delegate", "slow", "work on it");
    let p1 = Proc::start(&env).await;
    let (s, _) = p1.post("/v1/threads", json!({"threadId": "t"})).await;
    assert_eq!(s, 201);
    let (s, run) = p1.post("/v1/threads/t/runs", json!({"query": "go"})).await;
    assert_eq!(s, 202);
    // The remote task is recorded: the call now waits on it.
    p1.wait_for("/v1/threads/t/observations?type=A2A_TASK_UPDATE", |page| {
        page["items"].as_array().is_some_and(|i| !i.is_empty())
    })
    .await;
    p1.kill9().await;

    let p2 = Proc::start(&env).await;
    let run_id = run["runId"].as_str().unwrap();
    let done = p2
        .wait_for(&format!("/v1/threads/t/runs/{run_id}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let (_, page) = p2
        .get("/v1/threads/t/observations?type=TOOL_EXECUTION")
        .await;
    let out = &page["items"][0]["content"];
    assert_eq!(out["status"], "success", "{out}");
    // The remote saw one task only.
    let (client, _) = slow.client().await;
    let (_, calls) = p2.get("/v1/threads/t/observations?type=TOOL_CALL").await;
    let call_id = calls["items"][0]["content"]["toolCallId"].as_str().unwrap();
    let context = format!("pes-{run_id}-{call_id}");
    let tasks = client
        .tasks_of_context(&context, Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tasks.len(), 1, "sent once: {tasks:?}");
    p2.kill9().await;
}

/// Cancelling our run cancels the remote task it waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_run_cancels_the_remote_task() {
    let Some(python) = python() else { return };
    let slow = Agent::start(&python, "slow", "1.0").await;
    let llm = FakeLlm::start().await;
    let agents = agents_json(&[("slow", &slow)]);
    // Parked at once: the cancel reaches the run through its watcher.
    let app = spawn_with(Backend::Postgres, Some(&llm), |c| {
        c.a2a_agents = Some(agents);
        c.a2a_park_after_ms = 0;
    })
    .await;
    script_delegation(&llm, "s1", "Delegate", "slow", "work");
    let t = app.thread(json!({})).await;
    let (st, run) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "go"}))
        .await;
    assert_eq!(st, 202, "{run}");
    let run_id = run["runId"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let task_id = loop {
        let obs = app.observations(&t).await;
        if let Some(u) = obs.iter().find(|o| o["type"] == "A2A_TASK_UPDATE") {
            break u["content"]["taskId"].as_str().unwrap().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the remote task was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // While it waits, the thread's state names the remote task its item waits on.
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(
        state["pendingA2ATasks"][0]["itemId"], "s1",
        "{}",
        state["pendingA2ATasks"]
    );
    assert_eq!(state["pendingA2ATasks"][0]["taskIds"], json!([task_id]));
    assert!(state["pendingA2ATasks"][0]["submittedAt"].is_string());
    let (st, _) = app
        .post(&format!("/v1/threads/{t}/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(st, 202);
    let done = app
        .wait_run(&t, &run_id, |r| r["status"] == "cancelled")
        .await;
    assert_eq!(done["status"], "cancelled");
    let (client, _) = slow.client().await;
    let remote = client
        .get_task(&task_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        remote.state,
        pes_server::a2a::client::rpc::RemoteState::Canceled,
        "{remote:?}"
    );
    let obs = app.observations(&t).await;
    assert!(
        obs.iter()
            .any(|o| o["type"] == "A2A_TASK_UPDATE" && o["content"]["cancelRequested"] == true),
        "the cancel is in the tree"
    );
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(
        state["pendingA2ATasks"],
        json!([]),
        "nothing waits any more"
    );
    app.stop().await;
}

/// A remote `input-required` becomes our `remote_input` suspension; the person's answer is
/// forwarded to the remote, which completes; a rejection cancels the remote task.
async fn a_remote_question_is_asked_here_and_the_answer_forwarded(backend: Backend) {
    let Some(python) = python() else { return };
    let input = Agent::start(&python, "input", "1.0").await;
    let llm = FakeLlm::start().await;
    let agents = agents_json(&[("greeter", &input)]);
    let app = spawn_with(backend, Some(&llm), |c| c.a2a_agents = Some(agents)).await;
    for answer in ["respond", "reject"] {
        llm.push(
            "plan",
            plan(&[("s1", "Greet", &["delegate_to_agent"], &[])]),
        );
        llm.push(
            "execute",
            Reply::ToolCalls(vec![(
                "delegate_to_agent".into(),
                json!({"agent": "greeter", "message": "greet the user"}),
            )]),
        );
        let t = app.thread(json!({})).await;
        let run = app.run_wait(&t, "greet").await;
        assert_eq!(run["status"], "suspended", "{run}");
        let s = &run["suspension"];
        assert_eq!(s["kind"], "remote_input", "{s}");
        assert_eq!(s["question"], "What is your name?");
        assert_eq!(s["allowedDecisions"], json!(["respond", "reject"]));
        assert_eq!(s["toolCall"]["arguments"]["agent"], "greeter");
        let sid = s["suspensionId"].as_str().unwrap();
        let body = if answer == "respond" {
            json!({"decision": "respond", "response": "Ada"})
        } else {
            json!({"decision": "reject", "reason": "private"})
        };
        let (st, b) = app
            .post(&format!("/v1/suspensions/{sid}/resume"), body)
            .await;
        assert_eq!(st, 202, "{b}");
        let done = app
            .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
                r["status"] == "completed"
            })
            .await;
        assert_eq!(done["status"], "completed", "{done}");
        let obs = app.observations(&t).await;
        let exec = obs.iter().find(|o| o["type"] == "TOOL_EXECUTION").unwrap();
        if answer == "respond" {
            assert_eq!(exec["content"]["output"], "hello, Ada", "{exec}");
            assert!(
                obs.iter()
                    .any(|o| o["type"] == "A2A_TASK_UPDATE" && o["content"]["forwarded"] == sid),
                "the forward is in the tree"
            );
        } else {
            let e = exec["content"]["error"].as_str().unwrap();
            assert!(e.contains("declined") && e.contains("private"), "{e}");
        }
    }
    app.stop().await;
}

/// With one worker slot, a run whose only item waits on a remote agent gives the slot back: a
/// second thread's run starts and completes meanwhile, the parked run stays `running`, its
/// remote's progress is still committed under the call, and it completes once the remote does.
async fn a_run_waiting_on_a_remote_gives_its_worker_slot_back(backend: Backend) {
    let Some(python) = python() else { return };
    let slow = Agent::start_for(&python, "slow", "1.0", 6).await;
    let llm = FakeLlm::start().await;
    let agents = agents_json(&[("slow", &slow)]);
    let app = spawn_with(backend, Some(&llm), |c| {
        c.a2a_agents = Some(agents);
        c.worker_concurrency = 1;
        c.a2a_park_after_ms = 0;
    })
    .await;
    script_delegation(&llm, "a1", "Delegate", "slow", "work on it");
    let ta = app.thread(json!({})).await;
    let (st, a) = app
        .post(&format!("/v1/threads/{ta}/runs"), json!({"query": "go"}))
        .await;
    assert_eq!(st, 202, "{a}");
    let a_id = a["runId"].as_str().unwrap().to_owned();
    app.wait_observation(&ta, |o| o["type"] == "A2A_TASK_UPDATE")
        .await;

    // The one slot is free again: another thread's run goes through meanwhile.
    let tb = app.thread(json!({})).await;
    let b = app.run_wait(&tb, "What is 2+2?").await;
    assert_eq!(b["status"], "completed", "{b}");
    let (_, a_now) = app.get(&format!("/v1/threads/{ta}/runs/{a_id}")).await;
    assert_eq!(
        a_now["status"], "running",
        "a parked run stays running: {a_now}"
    );

    let done = app
        .wait_run(&ta, &a_id, |r| r["status"] == "completed")
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let obs = app.observations(&ta).await;
    let exec = obs.iter().find(|o| o["type"] == "TOOL_EXECUTION").unwrap();
    assert_eq!(exec["content"]["output"], "slow: done after 6 s", "{exec}");
    let call = obs.iter().find(|o| o["type"] == "TOOL_CALL").unwrap();
    let updates: Vec<&Value> = obs
        .iter()
        .filter(|o| o["type"] == "A2A_TASK_UPDATE")
        .collect();
    for u in &updates {
        assert_eq!(u["parentId"], call["id"], "{u}");
    }
    // Progress the remote reported while no worker held the run was committed all the same.
    for step in ["working: step 2 of 3", "working: step 3 of 3"] {
        assert!(
            updates.iter().any(|u| u["content"]["message"] == step),
            "{step} in {updates:?}"
        );
    }
    let settled: Vec<&&Value> = updates
        .iter()
        .filter(|u| u["content"]["settled"].is_object())
        .collect();
    assert_eq!(settled.len(), 1, "settled once: {settled:?}");
    assert_eq!(
        settled[0]["content"]["settled"]["result"],
        "slow: done after 6 s"
    );
    // The metrics tell a parked call (handed to the watcher) from a cancelled one.
    let page = crate::metrics::scrape(&app).await;
    let calls = |outcome| {
        page.value(
            "pes_tool_calls_total",
            &[("outcome", outcome), ("tool", "a2a:slow")],
        )
    };
    assert!(calls("parked") >= 1.0, "parked: {}", calls("parked"));
    assert_eq!(calls("cancelled"), 0.0);
    assert_eq!(calls("ok"), 1.0);
    app.stop().await;
}

/// A remote agent that dies while a parked run waits on it: after `PES_A2A_UNREACHABLE_SECONDS`
/// the call fails with a tool error the model reads, and the run goes on to its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_remote_agent_becomes_a_tool_error() {
    let Some(python) = python() else { return };
    let mut slow = Agent::start_for(&python, "slow", "1.0", 60).await;
    let llm = FakeLlm::start().await;
    let agents = agents_json(&[("slow", &slow)]);
    let app = spawn_with(Backend::Sqlite, Some(&llm), |c| {
        c.a2a_agents = Some(agents);
        c.a2a_park_after_ms = 0;
        c.a2a_unreachable_seconds = 2;
    })
    .await;
    script_delegation(&llm, "s1", "Delegate", "slow", "work");
    let t = app.thread(json!({})).await;
    let (st, run) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "go"}))
        .await;
    assert_eq!(st, 202, "{run}");
    app.wait_observation(&t, |o| o["type"] == "A2A_TASK_UPDATE")
        .await;
    slow.kill().await;
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let exec = app
        .wait_observation(&t, |o| o["type"] == "TOOL_EXECUTION")
        .await;
    assert_eq!(exec["content"]["status"], "error", "{exec}");
    let e = exec["content"]["error"].as_str().unwrap();
    assert!(e.contains("cannot be reached"), "{e}");
    app.stop().await;
}

/// Two replicas with one slot each and three delegating runs: the runs park and wait side by
/// side; kill -9 of one replica leaves its parked runs to the other, which follows the recorded
/// tasks to their end. Every message reached its remote exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_parked_runs_and_survive_kill_9() {
    let Some(python) = python() else { return };
    let slow = Agent::start_for(&python, "slow", "1.0", 5).await;
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(Backend::Postgres).await;
    let mut env = env_for(&db, &llm.url);
    env.push(("PES_A2A_AGENTS", agents_json(&[("slow", &slow)])));
    env.push(("PES_LEASE_SECONDS", "3".into()));
    env.push(("PES_HEARTBEAT_MS", "200".into()));
    env.push(("PES_WORKER_CONCURRENCY", "1".into()));
    env.push(("PES_A2A_PARK_AFTER_MS", "0".into()));
    let threads = ["r1", "r2", "r3"];
    for t in threads {
        let item = format!("{t}-item");
        llm.push(
            "plan",
            plan(&[(&item, "Delegate", &["delegate_to_agent"], &[])]),
        );
        llm.push_item(
            &item,
            Reply::ToolCalls(vec![(
                "delegate_to_agent".into(),
                json!({"agent": "slow", "message": format!("work for {t}")}),
            )]),
        );
    }
    let p1 = Proc::start(&env).await;
    let p2 = Proc::start(&env).await;
    let mut runs = Vec::new();
    for t in threads {
        let (s, _) = p1.post("/v1/threads", json!({"threadId": t})).await;
        assert_eq!(s, 201);
        let (s, run) = p1
            .post(&format!("/v1/threads/{t}/runs"), json!({"query": "go"}))
            .await;
        assert_eq!(s, 202, "{run}");
        runs.push(run["runId"].as_str().unwrap().to_owned());
    }
    // Three runs wait on the remote at once with two slots in all: they gave their slots back.
    for t in threads {
        p2.wait_for(
            &format!("/v1/threads/{t}/observations?type=A2A_TASK_UPDATE"),
            |page| page["items"].as_array().is_some_and(|i| !i.is_empty()),
        )
        .await;
    }
    p1.kill9().await;
    for (t, run_id) in threads.iter().zip(&runs) {
        let done = p2
            .wait_for(&format!("/v1/threads/{t}/runs/{run_id}"), |r| {
                r["status"] == "completed"
            })
            .await;
        assert_eq!(done["status"], "completed", "{done}");
        let (_, page) = p2
            .get(&format!("/v1/threads/{t}/observations?type=TOOL_EXECUTION"))
            .await;
        assert_eq!(
            page["items"][0]["content"]["output"], "slow: done after 5 s",
            "{page}"
        );
    }
    // All three were sent before any came back: they waited side by side, on two slots.
    let (mut sent, mut back) = (Vec::new(), Vec::new());
    for t in threads {
        let (_, page) = p2
            .get(&format!(
                "/v1/threads/{t}/observations?type=A2A_TASK_UPDATE"
            ))
            .await;
        let items = page["items"].as_array().unwrap();
        sent.push(items[0]["createdAt"].as_str().unwrap().to_owned());
        let settled = items
            .iter()
            .find(|u| u["content"]["settled"].is_object())
            .unwrap_or_else(|| panic!("{t} settled: {page}"));
        back.push(settled["createdAt"].as_str().unwrap().to_owned());
    }
    let (last_sent, first_back) = (sent.iter().max().unwrap(), back.iter().min().unwrap());
    assert!(last_sent < first_back, "sent {sent:?}, back {back:?}");
    let (client, _) = slow.client().await;
    for (t, run_id) in threads.iter().zip(&runs) {
        let (_, calls) = p2
            .get(&format!("/v1/threads/{t}/observations?type=TOOL_CALL"))
            .await;
        let call_id = calls["items"][0]["content"]["toolCallId"].as_str().unwrap();
        let tasks = client
            .tasks_of_context(&format!("pes-{run_id}-{call_id}"), Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tasks.len(), 1, "{t}: sent once: {tasks:?}");
    }
    p2.kill9().await;
}

both_stores!(delegates, a_run_delegates_to_remote_agents);
both_stores!(parks, a_run_waiting_on_a_remote_gives_its_worker_slot_back);
both_stores!(
    remote_input,
    a_remote_question_is_asked_here_and_the_answer_forwarded
);
both_stores!(
    kill_9,
    a_pending_delegation_survives_kill_9_without_being_sent_again
);

/// What reached a fake remote: `METHOD /path`, and the agent's secret header if it came along.
type Seen = Vec<(String, Option<String>)>;

/// A fake A2A remote on 127.0.0.1 (v1.0, JSON-RPC): it records every request, and its paths say
/// how it behaves, so one card can name another remote's endpoint:
/// - `GET /card?endpoint=<url>&pad=<n>`: a card naming `endpoint`, its description padded by `n`
///   bytes;
/// - `GET /redirect?to=<url>`: 302 to `to`; `POST /a2a-redirect?to=<url>`: 307 to `to`;
/// - `POST /a2a`: a task that completes with the artifact `done by <port>`;
/// - `POST /a2a-long`: a task whose stream brings three 3000-byte artifacts, then completes;
/// - `POST /a2a-big-reply`: every answer is an endless body;
/// - `POST /a2a-big-event`: a task whose stream sends one endless event.
struct Remote {
    port: u16,
    seen: Arc<Mutex<Seen>>,
}

#[derive(Clone)]
struct RemoteCtx {
    port: u16,
    seen: Arc<Mutex<Seen>>,
}

impl Remote {
    async fn start() -> Remote {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ctx = RemoteCtx {
            port,
            seen: seen.clone(),
        };
        let app = Router::new()
            .route("/card", get(fake_card))
            .route("/redirect", get(fake_redirect))
            .route("/{endpoint}", post(fake_rpc))
            .layer(axum::middleware::from_fn_with_state(ctx.clone(), record))
            .with_state(ctx);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Remote { port, seen }
    }

    /// `http://127.0.0.1:<port><path>`.
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The same remote by the name `localhost` (another origin, which `PES_A2A_ALLOW=localhost`
    /// allows while `127.0.0.1` stays refused).
    fn named(&self, path: &str) -> String {
        format!("http://localhost:{}{path}", self.port)
    }

    /// The URL of a card (served here) that names `endpoint`, its description padded by `pad`.
    fn card(&self, endpoint: &str, pad: usize) -> String {
        self.card_at(&self.url("/card"), endpoint, pad)
    }

    fn card_at(&self, base: &str, endpoint: &str, pad: usize) -> String {
        reqwest::Url::parse_with_params(base, [("endpoint", endpoint), ("pad", &pad.to_string())])
            .unwrap()
            .to_string()
    }

    /// A URL here that redirects to `to`.
    fn redirect(&self, path: &str, to: &str) -> String {
        reqwest::Url::parse_with_params(&self.url(path), [("to", to)])
            .unwrap()
            .to_string()
    }

    fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }
}

async fn record(
    State(ctx): State<RemoteCtx>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let secret = req
        .headers()
        .get("x-secret")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let line = format!("{} {}", req.method(), req.uri().path());
    ctx.seen.lock().unwrap().push((line, secret));
    next.run(req).await
}

async fn fake_card(Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let pad: usize = q.get("pad").and_then(|p| p.parse().ok()).unwrap_or(0);
    Json(json!({
        "name": "Fake", "description": format!("A fake agent{}", ".".repeat(pad)), "version": "1",
        "supportedInterfaces": [{"url": q.get("endpoint").cloned().unwrap_or_default(),
                                 "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": true}, "skills": []
    }))
}

async fn fake_redirect(Query(q): Query<HashMap<String, String>>) -> impl IntoResponse {
    let to = q.get("to").cloned().unwrap_or_default();
    (StatusCode::FOUND, [(header::LOCATION, to)])
}

/// An endless body of `x`.
fn endless(prefix: &'static str) -> Body {
    let chunk = bytes::Bytes::from(vec![b'x'; 16 * 1024]);
    let head = futures::stream::once(async move { Ok::<_, std::io::Error>(prefix.into()) });
    let rest = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
    Body::from_stream(head.chain(rest))
}

fn task(id: &str, context: &str, state: &str, artifacts: Value) -> Value {
    json!({"id": id, "contextId": context, "status": {"state": state}, "artifacts": artifacts})
}

async fn fake_rpc(
    State(ctx): State<RemoteCtx>,
    Path(endpoint): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    Json(req): Json<Value>,
) -> axum::response::Response {
    let id = req["id"].clone();
    let answer = |result: Value| Json(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    let sse = |events: Vec<Value>| {
        let body: String = events
            .iter()
            .map(|e| {
                format!(
                    "data: {}\n\n",
                    json!({"jsonrpc": "2.0", "id": id, "result": e})
                )
            })
            .collect();
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    };
    let method = req["method"].as_str().unwrap_or("");
    let context = req["params"]["message"]["contextId"]
        .as_str()
        .unwrap_or("c")
        .to_owned();
    let done = |text: String| {
        task(
            "t1",
            "c",
            "TASK_STATE_COMPLETED",
            json!([{"artifactId": "a", "parts": [{"text": text}]}]),
        )
    };
    match (endpoint.as_str(), method) {
        ("a2a-redirect", _) => {
            let to = q.get("to").cloned().unwrap_or_default();
            (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response()
        }
        ("a2a-big-reply", _) => endless("{\"jsonrpc\": \"2.0\", \"result\": \"").into_response(),
        (_, "ListTasks") => answer(json!({"tasks": []})).into_response(),
        (_, "SendMessage") => {
            answer(json!({"task": task("t1", &context, "TASK_STATE_WORKING", json!([]))}))
                .into_response()
        }
        ("a2a-big-event", "SubscribeToTask") => (
            [(header::CONTENT_TYPE, "text/event-stream")],
            endless("data: {\"jsonrpc\": \"2.0\", \"result\": \""),
        )
            .into_response(),
        ("a2a-long", "SubscribeToTask") => {
            let mut events =
                vec![json!({"task": task("t1", "c", "TASK_STATE_WORKING", json!([]))})];
            for c in ['a', 'b', 'c'] {
                events.push(json!({"artifactUpdate": {"taskId": "t1", "contextId": "c",
                    "artifact": {"artifactId": c.to_string(), "parts": [{"text": c.to_string().repeat(3000)}]}}}));
            }
            events.push(json!({"statusUpdate": {"taskId": "t1", "contextId": "c",
                               "status": {"state": "TASK_STATE_COMPLETED"}}}));
            sse(events)
        }
        (_, "SubscribeToTask") => sse(vec![json!({"task": done(format!("done by {}", ctx.port))})]),
        (_, "GetTask") => {
            answer(json!({"task": done(format!("done by {}", ctx.port))})).into_response()
        }
        _ => Json(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}}))
            .into_response(),
    }
}

/// `PES_A2A_AGENTS` for these `(name, card URL)`, every one with the header `x-secret: s3cret`.
fn secret_agents(agents: &[(&str, String)]) -> String {
    let map: serde_json::Map<String, Value> = agents
        .iter()
        .map(|(name, url)| {
            (
                (*name).to_owned(),
                json!({"url": url, "headers": {"x-secret": "s3cret"}}),
            )
        })
        .collect();
    Value::Object(map).to_string()
}

/// One run whose item delegates `message` to each of `agents` in one turn; the
/// `TOOL_EXECUTION` contents in call order.
async fn delegate_to_each(app: &TestApp, llm: &FakeLlm, agents: &[&str]) -> Vec<Value> {
    llm.push(
        "plan",
        plan(&[("s1", "Ask them", &["delegate_to_agent"], &[])]),
    );
    llm.push_item(
        "s1",
        Reply::ToolCalls(
            agents
                .iter()
                .map(|a| {
                    (
                        "delegate_to_agent".to_owned(),
                        json!({"agent": a, "message": "go"}),
                    )
                })
                .collect(),
        ),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "delegate").await;
    assert_eq!(run["status"], "completed", "{run}");
    let execs: Vec<Value> = app
        .observations(&t)
        .await
        .into_iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .map(|o| o["content"].clone())
        .collect();
    assert_eq!(execs.len(), agents.len(), "{execs:?}");
    execs
}

/// The error of a call that failed.
fn failed(exec: &Value) -> String {
    assert_eq!(exec["status"], "error", "{exec}");
    exec["error"].as_str().unwrap().to_owned()
}

/// Every request `remote` saw carried the agent's header (it is the card's origin).
fn all_with_secret(remote: &Remote) {
    let seen = remote.seen();
    assert!(!seen.is_empty());
    for (line, secret) in &seen {
        assert_eq!(secret.as_deref(), Some("s3cret"), "{line}");
    }
}

/// No request `remote` saw carried the agent's header.
fn none_with_secret(remote: &Remote) {
    for (line, secret) in remote.seen() {
        assert_eq!(secret, None, "{line} carried the agent's header");
    }
}

/// A card on origin A naming an endpoint on B (loopback, not allowed): the call is a tool error
/// naming the guard's reason and B receives nothing. Naming C, which `PES_A2A_ALLOW` allows: C
/// gets the call, without the agent's headers. The card's own origin gets calls and headers.
async fn a_card_cannot_send_our_requests_or_headers_to_another_origin(backend: Backend) {
    let (a, b, c) = (
        Remote::start().await,
        Remote::start().await,
        Remote::start().await,
    );
    let llm = FakeLlm::start().await;
    let agents = secret_agents(&[
        ("home", a.card(&a.url("/a2a"), 0)),
        ("elsewhere", a.card(&b.url("/a2a"), 0)),
        ("allowed", a.card(&c.named("/a2a"), 0)),
    ]);
    let app = spawn_with(backend, Some(&llm), |cfg| {
        cfg.a2a_agents = Some(agents);
        cfg.a2a_allow = Some("localhost".into());
    })
    .await;
    let execs = delegate_to_each(&app, &llm, &["home", "elsewhere", "allowed"]).await;
    assert_eq!(execs[0]["status"], "success", "{}", execs[0]);
    assert_eq!(execs[0]["output"], format!("done by {}", a.port));
    let e = failed(&execs[1]);
    assert!(
        e.contains("did not take the task")
            && e.contains("127.0.0.1 is not an allowed address (a loopback address)")
            && e.ends_with("the operator can allow it in PES_A2A_ALLOW"),
        "{e}"
    );
    assert_eq!(b.seen(), vec![], "B received nothing");
    assert_eq!(execs[2]["status"], "success", "{}", execs[2]);
    assert_eq!(execs[2]["output"], format!("done by {}", c.port));
    assert!(
        c.seen().iter().any(|(l, _)| l == "POST /a2a"),
        "{:?}",
        c.seen()
    );
    none_with_secret(&c);
    // The card's origin got the cards and home's calls, each with the header.
    assert!(
        a.seen().iter().any(|(l, _)| l == "POST /a2a"),
        "{:?}",
        a.seen()
    );
    all_with_secret(&a);
    app.stop().await;
}

/// A redirect never carries our requests to an origin the guard refuses, nor the agent's
/// headers to another origin: a card URL redirected to B (loopback) is not fetched from B; one
/// redirected to C (allowed) is fetched without the headers; a JSON-RPC call answered with a
/// redirect is not followed at all, even to C.
async fn redirects_do_not_carry_our_requests_or_headers_to_another_origin(backend: Backend) {
    let (a, b, c) = (
        Remote::start().await,
        Remote::start().await,
        Remote::start().await,
    );
    let llm = FakeLlm::start().await;
    let agents = secret_agents(&[
        ("moved", a.redirect("/redirect", &b.card(&b.url("/a2a"), 0))),
        (
            "moved_ok",
            a.redirect(
                "/redirect",
                &c.card_at(&c.named("/card"), &c.named("/a2a"), 0),
            ),
        ),
        (
            "hop",
            a.card(&a.redirect("/a2a-redirect", &c.named("/hop-target")), 0),
        ),
    ]);
    let app = spawn_with(backend, Some(&llm), |cfg| {
        cfg.a2a_agents = Some(agents);
        cfg.a2a_allow = Some("localhost".into());
    })
    .await;
    let execs = delegate_to_each(&app, &llm, &["moved", "moved_ok", "hop"]).await;
    let e = failed(&execs[0]);
    assert!(
        e.contains("is unavailable")
            && e.contains("127.0.0.1 is not an allowed address (a loopback address)"),
        "{e}"
    );
    assert_eq!(b.seen(), vec![], "B received nothing");
    assert_eq!(execs[1]["status"], "success", "{}", execs[1]);
    assert_eq!(execs[1]["output"], format!("done by {}", c.port));
    let e = failed(&execs[2]);
    assert!(
        e.contains("answered with a redirect") && e.contains("do not follow"),
        "{e}"
    );
    let on_c = c.seen();
    assert!(on_c.iter().any(|(l, _)| l == "GET /card"), "{on_c:?}");
    assert!(
        !on_c.iter().any(|(l, _)| l.contains("hop-target")),
        "a call's redirect is not followed: {on_c:?}"
    );
    none_with_secret(&c);
    all_with_secret(&a);
    app.stop().await;
}

/// With `PES_A2A_MAX_BYTES` at 4096: a card, a reply and a stream event past it (the last two
/// endless) are errors the model reads, a result assembled from many events is cut once with a
/// marker that counts what was cut, the run completes and the service keeps answering.
async fn oversized_cards_replies_and_events_are_errors(backend: Backend) {
    let a = Remote::start().await;
    let llm = FakeLlm::start().await;
    let agents = secret_agents(&[
        ("bigcard", a.card(&a.url("/a2a"), 10_000)),
        ("bigreply", a.card(&a.url("/a2a-big-reply"), 0)),
        ("bigevent", a.card(&a.url("/a2a-big-event"), 0)),
        ("long", a.card(&a.url("/a2a-long"), 0)),
    ]);
    let app = spawn_with(backend, Some(&llm), |cfg| {
        cfg.a2a_agents = Some(agents);
        cfg.a2a_max_bytes = 4096;
    })
    .await;
    let (_, tools) = app.get("/v1/tools").await;
    let described = tools["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "delegate_to_agent")
        .map(|t| t["description"].as_str().unwrap().to_owned())
        .unwrap();
    assert!(
        described.contains("bigcard: unavailable now")
            && described.contains("larger than 4096 bytes (PES_A2A_MAX_BYTES)"),
        "{described}"
    );
    let execs = delegate_to_each(&app, &llm, &["bigcard", "bigreply", "bigevent", "long"]).await;
    for (i, what) in [
        (0, "the document at"),
        (1, "the reply"),
        (2, "a stream event"),
    ] {
        let e = failed(&execs[i]);
        assert!(
            e.contains(what) && e.contains("is larger than 4096 bytes (PES_A2A_MAX_BYTES)"),
            "{i}: {e}"
        );
    }
    let long = &execs[3];
    assert_eq!(long["status"], "success", "{long}");
    let text = long["output"].as_str().unwrap();
    // 3 × 3000 bytes and two line breaks; 4096 − 64 bytes kept, the rest counted.
    assert!(text.len() <= 4096, "{}", text.len());
    assert!(text.starts_with(&"a".repeat(3000)), "in order");
    assert!(
        text.ends_with(&format!("…[truncated: {} bytes cut]", 9002 - 4032)),
        "{}",
        &text[text.len() - 60..]
    );
    let (st, _) = app.get("/healthz").await;
    assert_eq!(st, 200, "the service keeps answering");
    app.stop().await;
}

both_stores!(
    card_origin,
    a_card_cannot_send_our_requests_or_headers_to_another_origin
);
both_stores!(
    redirects,
    redirects_do_not_carry_our_requests_or_headers_to_another_origin
);
both_stores!(oversized, oversized_cards_replies_and_events_are_errors);
