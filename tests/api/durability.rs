//! Durable execution with real processes: `kill -9` in the middle of a model call and of a tool
//! call, two replicas on one Postgres, SIGTERM hand-over; and in-process: interrupt and cancel of
//! a tool call in flight.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, plan};
use crate::helpers::{Backend, SseReader, spawn_with};
use crate::process::{Proc, env_for};

pub(crate) fn temp_log() -> PathBuf {
    std::env::temp_dir().join(format!("pes-debug-{}.log", uuid::Uuid::now_v7().simple()))
}

/// Completed `debug_sleep` calls by tag, from the tool's log (it survives the process).
pub(crate) fn completed_calls(log: &Path) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        *out.entry(line.split(' ').next().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    out
}

/// The lease is a few seconds, not one: on a loaded machine a 1 s lease can lapse under a live
/// worker, and a call in flight then legitimately runs twice (under the same key).
pub(crate) fn env(db: &str, llm: &FakeLlm, log: &Path, lease: &str) -> Vec<(&'static str, String)> {
    let mut e = env_for(db, &llm.url);
    e.push(("PES_DEBUG_TOOLS", "true".into()));
    e.push(("PES_DEBUG_TOOL_LOG", log.display().to_string()));
    e.push(("PES_LEASE_SECONDS", lease.into()));
    e.push(("PES_HEARTBEAT_MS", "200".into()));
    e.push(("PES_STREAM_POLL_MS", "200".into()));
    e
}

fn three_sleeps(slow: &str) -> crate::fake_llm::Reply {
    let desc = |id: &str| {
        if id == slow {
            format!("sleep {id} (slow)")
        } else {
            format!("sleep {id}")
        }
    };
    let (a, b, c) = (desc("a"), desc("b"), desc("c"));
    plan(&[
        ("a", &a, &["debug_sleep"], &[]),
        ("b", &b, &["debug_sleep"], &["a"]),
        ("c", &c, &["debug_sleep"], &["b"]),
    ])
}

/// Read a stream until it ends (the server died) or `until` arrives; the observations seen.
async fn drain_stream(mut sse: SseReader, until: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(60), sse.next_or_end())
            .await
            .expect("stream stalled");
        let Some(f) = frame else { return out };
        if f.comment {
            continue;
        }
        let v: Value = serde_json::from_str(&f.data).unwrap();
        let done = v["type"] == until;
        out.push(v);
        if done {
            return out;
        }
    }
}

pub(crate) fn assert_gap_free(obs: &[Value]) {
    let seqs: Vec<i64> = obs.iter().map(|o| o["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=obs.len() as i64).collect::<Vec<_>>(),
        "seq is gap-free and has no duplicate"
    );
}

pub(crate) async fn all_observations(p: &Proc, thread: &str) -> Vec<Value> {
    let (_, page) = p
        .get(&format!("/v1/threads/{thread}/observations?limit=1000"))
        .await;
    page["items"].as_array().unwrap().clone()
}

/// kill -9 while the model is answering item b (after b's tool ran); restart; the run completes,
/// no completed tool call runs again, and a client that reconnects with Last-Event-ID sees every
/// observation exactly once.
async fn kill_9_during_a_model_call(backend: Backend) {
    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(backend).await;
    llm.push("plan", three_sleeps(""));
    let after_b_tool = |r: &Value| {
        let m = r["messages"]
            .as_array()
            .map(|m| m.last().cloned().unwrap_or(Value::Null))
            .unwrap_or(Value::Null);
        m["role"] == "tool"
            && m["content"]
                .as_str()
                .unwrap_or("")
                .contains("\"tag\":\"b\"")
    };
    llm.slow_once(after_b_tool, Duration::from_secs(60));
    let p1 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let (s, _) = p1.post("/v1/threads", json!({"threadId": "t"})).await;
    assert_eq!(s, 201);
    let stream = SseReader::new(
        p1.client
            .get(p1.url("/v1/threads/t/events"))
            .send()
            .await
            .unwrap(),
    );
    let first_half = tokio::spawn(drain_stream(stream, "RUN_COMPLETED"));
    let (s, run) = p1.post("/v1/threads/t/runs", json!({"query": "go"})).await;
    assert_eq!(s, 202);
    llm.wait_for_request(after_b_tool).await;
    p1.kill9().await;
    let seen = first_half.await.unwrap();
    assert!(!seen.is_empty());

    let p2 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let last = seen.last().unwrap()["seq"].as_i64().unwrap();
    let resumed = SseReader::new(
        p2.client
            .get(p2.url("/v1/threads/t/events"))
            .header("last-event-id", last.to_string())
            .send()
            .await
            .unwrap(),
    );
    let second_half = drain_stream(resumed, "RUN_COMPLETED").await;
    let rid = run["runId"].as_str().unwrap();
    let done = p2
        .wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["attempt"], 2, "re-claimed once");
    let calls = completed_calls(&log);
    assert_eq!(calls.get("a"), Some(&1), "{calls:?}");
    assert_eq!(
        calls.get("b"),
        Some(&1),
        "b's tool had completed: it never runs again: {calls:?}"
    );
    assert_eq!(calls.get("c"), Some(&1), "{calls:?}");
    let obs = all_observations(&p2, "t").await;
    assert_gap_free(&obs);
    let mut streamed = seen.clone();
    streamed.extend(second_half);
    assert_eq!(
        streamed, obs,
        "the reconnected stream saw everything exactly once"
    );
    assert_eq!(
        obs.iter().filter(|o| o["type"] == "TOOL_EXECUTION").count(),
        3
    );
    assert_eq!(obs.iter().filter(|o| o["type"] == "RUN_STARTED").count(), 1);
    p2.kill9().await;
    let _ = std::fs::remove_file(&log);
}
both_stores!(kill_9_model_call, kill_9_during_a_model_call);

/// kill -9 while item b's tool runs: only that in-flight call runs again.
async fn kill_9_during_a_tool_call(backend: Backend) {
    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(backend).await;
    llm.push("plan", three_sleeps("b"));
    let p1 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let (s, run) = p1
        .post(
            "/v1/threads/t/runs",
            json!({"query": "go", "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 202);
    // b's call is journaled as TOOL_CALL before it runs; it sleeps 3 s.
    p1.wait_for(
        "/v1/threads/t/observations?type=TOOL_CALL&parentId=b",
        |p| !p["items"].as_array().unwrap().is_empty(),
    )
    .await;
    p1.kill9().await;
    assert_eq!(completed_calls(&log).get("b"), None, "b was in flight");

    let p2 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let rid = run["runId"].as_str().unwrap();
    p2.wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
        r["status"] == "completed"
    })
    .await;
    let calls = completed_calls(&log);
    assert_eq!(
        calls.get("a"),
        Some(&1),
        "a completed before the crash and never ran again: {calls:?}"
    );
    assert_eq!(calls.get("b"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("c"), Some(&1), "{calls:?}");
    let obs = all_observations(&p2, "t").await;
    assert_gap_free(&obs);
    let b_execs = obs
        .iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION" && o["parentId"] == "b")
        .count();
    assert_eq!(b_execs, 1);
    // The in-flight call ran again with the same idempotency key (run id + tool call id).
    let key = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("b "))
        .unwrap()
        .to_owned();
    assert!(key.contains(rid), "{key}");
    p2.kill9().await;
    let _ = std::fs::remove_file(&log);
}
both_stores!(kill_9_tool_call, kill_9_during_a_tool_call);

/// Two replicas on one Postgres: a stream on B shows what A executes, live; kill -9 A mid-run
/// and B finishes the run within the lease timeout + 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_streams_and_take_over_a_dead_replicas_run() {
    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(Backend::Postgres).await;
    llm.push("plan", three_sleeps(""));
    llm.delay_execute(Duration::from_millis(300));
    let lease = 2;
    let a = Proc::start(&env(&db, &llm, &log, &lease.to_string())).await;
    let (s, run) = a
        .post(
            "/v1/threads/t/runs",
            json!({"query": "go", "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 202);
    let rid = run["runId"].as_str().unwrap().to_owned();
    // A holds the run before B exists.
    a.wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
        r["status"] == "running"
    })
    .await;
    let b = Proc::start(&env(&db, &llm, &log, &lease.to_string())).await;
    let mut on_b = SseReader::new(
        b.client
            .get(b.url("/v1/threads/t/events"))
            .send()
            .await
            .unwrap(),
    );
    // Live on B: a TOOL_EXECUTION that A commits after B's stream opened.
    let mut seen = Vec::new();
    let opened_at = all_observations(&b, "t").await.len() as i64;
    loop {
        let f = on_b
            .next(Duration::from_secs(30))
            .await
            .expect("stream open");
        if f.comment {
            continue;
        }
        let v: Value = serde_json::from_str(&f.data).unwrap();
        let live_exec = v["type"] == "TOOL_EXECUTION" && v["seq"].as_i64().unwrap() > opened_at;
        seen.push(v);
        if live_exec {
            break;
        }
    }
    a.kill9().await;
    let killed = Instant::now();
    let rest = drain_stream(on_b, "RUN_COMPLETED").await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(lease + 5),
        "B finished {took:?} after the kill"
    );
    b.wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
        r["status"] == "completed"
    })
    .await;
    seen.extend(rest);
    let obs = all_observations(&b, "t").await;
    assert_gap_free(&obs);
    assert_eq!(
        seen, obs,
        "B's stream: every observation once, whichever replica made it"
    );
    let calls = completed_calls(&log);
    assert!(
        calls.values().all(|n| *n == 1) && calls.len() == 3,
        "{calls:?}"
    );
    b.kill9().await;
    let _ = std::fs::remove_file(&log);
}

/// SIGTERM with a run in flight: the replica finishes the step in flight, releases the run and
/// exits; the other replica takes it over at once (long before the lease would expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_run_over_to_another_replica() {
    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(Backend::Postgres).await;
    llm.push("plan", three_sleeps(""));
    llm.delay_execute(Duration::from_millis(500));
    let a = Proc::start(&env(&db, &llm, &log, "60")).await;
    let (_, run) = a
        .post(
            "/v1/threads/t/runs",
            json!({"query": "go", "ifNotExists": "create"}),
        )
        .await;
    let rid = run["runId"].as_str().unwrap().to_owned();
    a.wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
        r["status"] == "running"
    })
    .await;
    let b = Proc::start(&env(&db, &llm, &log, "60")).await;
    llm.wait_for_request(|r| crate::fake_llm::phase_of(r) == "execute")
        .await;
    let started = Instant::now();
    let status = a.terminate().await;
    assert!(status.success(), "{status:?}");
    let done = b
        .wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "handed over, not left to a 60 s lease"
    );
    assert_eq!(done["attempt"], 2);
    let calls = completed_calls(&log);
    assert!(
        calls.values().all(|n| *n == 1) && calls.len() == 3,
        "{calls:?}"
    );
    let obs = all_observations(&b, "t").await;
    assert_gap_free(&obs);
    b.kill9().await;
    let _ = std::fs::remove_file(&log);
}

/// SIGTERM on the only replica: the run is released (queued, no owner), never left running,
/// and the next start completes it.
async fn sigterm_never_strands_a_run(backend: Backend) {
    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(backend).await;
    llm.push("plan", three_sleeps(""));
    llm.delay_execute(Duration::from_millis(500));
    let a = Proc::start(&env(&db, &llm, &log, "60")).await;
    let (_, run) = a
        .post(
            "/v1/threads/t/runs",
            json!({"query": "go", "ifNotExists": "create"}),
        )
        .await;
    let rid = run["runId"].as_str().unwrap().to_owned();
    llm.wait_for_request(|r| crate::fake_llm::phase_of(r) == "execute")
        .await;
    assert!(a.terminate().await.success());
    let b = Proc::start(&env(&db, &llm, &log, "60")).await;
    let done = b
        .wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(
        done["attempt"], 2,
        "released by the first process, claimed by the second"
    );
    let calls = completed_calls(&log);
    assert!(
        calls.values().all(|n| *n == 1) && calls.len() == 3,
        "{calls:?}"
    );
    b.kill9().await;
    let _ = std::fs::remove_file(&log);
}
both_stores!(sigterm_single, sigterm_never_strands_a_run);

async fn interrupt_cancels_the_active_run_and_keeps_its_completed_items(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.debug_tools = true).await;
    llm.push("plan", three_sleeps("b"));
    let t = app.thread(json!({})).await;
    let (_, first) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "first"}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, p) = app
            .get(&format!(
                "/v1/threads/{t}/observations?type=TOOL_CALL&parentId=b"
            ))
            .await;
        if !p["items"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    llm.push(
        "plan",
        plan(&[
            ("a", "sleep a", &["debug_sleep"], &[]),
            ("d", "new", &[], &["a"]),
        ]),
    );
    let t0 = Instant::now();
    let (s, second) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "second", "multitaskStrategy": "interrupt"}),
        )
        .await;
    assert_eq!(s, 202);
    let fid = first["runId"].as_str().unwrap();
    let first = app.wait_run(&t, fid, |r| r["status"] == "cancelled").await;
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the tool call in flight was abandoned within 1 s or so: {:?}",
        t0.elapsed()
    );
    assert!(first["endedAt"].is_string());
    let sid = second["runId"].as_str().unwrap();
    app.wait_run(&t, sid, |r| r["status"] == "completed").await;
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let items = state["todoList"].as_array().unwrap();
    let a = items.iter().find(|i| i["id"] == "a").unwrap();
    assert_eq!(a["status"], "completed");
    assert_eq!(
        a["attempts"], 1,
        "the interrupted run's completed item was kept, not re-run"
    );
    let obs = app.observations(&t).await;
    assert!(
        obs.iter()
            .any(|o| o["type"] == "RUN_CANCELLED" && o["runId"] == fid)
    );
    app.stop().await;
}
both_stores!(
    interrupt,
    interrupt_cancels_the_active_run_and_keeps_its_completed_items
);
