//! Runs delegating items to remote agents built with the official Python SDK: the
//! `delegate_to_agent` tool in the catalogue, the remote's answer as the tool's result, every
//! remote update committed under the delegating `TOOL_CALL`, a failing remote as a tool error,
//! a v0.3-only agent, and kill -9 while a remote task is pending: the new process watches the
//! recorded task again and never sends the message twice.

use std::time::Duration;

use serde_json::{Value, json};

use crate::a2a_client::{Agent, python};
use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, spawn_with};
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
