//! Token streaming over HTTP, with a fake model that writes slowly, on both providers: deltas
//! arrive live (before the commit of what they make), carry their run, item and phase, have no
//! `id:`, reach only clients that asked, are never replayed, and join into what was committed;
//! with two processes on one Postgres database, they reach a stream served by the replica that
//! does not drive the run, and cross only while someone there listens.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_llm::{FakeLlm, Reply};
use crate::helpers::{Backend, Frame, SseReader, TestApp, spawn_with, use_anthropic};

/// Which API the fake model speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    Anthropic,
}

/// The answer of item `s2`, written in 20 pieces.
const ANSWER: &str = "Two and two make four, as the calculator said a moment ago.";

async fn setup(backend: Backend, api: Api, tweak: impl FnOnce(&FakeLlm)) -> (FakeLlm, TestApp) {
    let llm = match api {
        Api::OpenAi => FakeLlm::start().await,
        Api::Anthropic => FakeLlm::start_anthropic().await,
    };
    tweak(&llm);
    let app = spawn_with(backend, Some(&llm), |c| {
        if api == Api::Anthropic {
            use_anthropic(c, &llm);
        }
    })
    .await;
    (llm, app)
}

/// Open the thread's stream (`query` appended to the path), with headers.
async fn open(app: &TestApp, thread: &str, query: &str, last_event_id: Option<&str>) -> SseReader {
    let mut req = app
        .client
        .get(app.url(&format!("/v1/threads/{thread}/events{query}")))
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    SseReader::new(req.send().await.unwrap())
}

/// Frames (no comments) until an observation of type `until`, inclusive, or the end.
async fn frames_until(sse: &mut SseReader, until: &str) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some(f) = sse.next(Duration::from_secs(30)).await {
        if f.comment {
            continue;
        }
        let done = f.event.as_deref() == Some(until);
        out.push(f);
        if done {
            break;
        }
    }
    out
}

fn data(f: &Frame) -> Value {
    serde_json::from_str(&f.data).unwrap()
}

fn is_token(f: &Frame) -> bool {
    f.event.as_deref() == Some("token")
}

/// Positions and contents of the token frames of `item` (null: the run's own) in `phase`,
/// checking every token frame on the way: no id, and exactly the documented fields.
fn tokens_of(frames: &[Frame], run: &str, item: Value, phase: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, f) in frames.iter().enumerate().filter(|(_, f)| is_token(f)) {
        assert_eq!(f.id, None, "a token frame has no id: {f:?}");
        let d = data(f);
        let mut keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["delta", "itemId", "phase", "runId"], "{d}");
        assert_eq!(d["runId"], run, "{d}");
        if d["itemId"] == item && d["phase"] == phase {
            out.push((i, d["delta"].as_str().unwrap().to_owned()));
        }
    }
    out
}

/// The position of the first observation frame for which `pred` holds.
fn position(frames: &[Frame], pred: impl Fn(&Value) -> bool) -> usize {
    frames
        .iter()
        .position(|f| !is_token(f) && pred(&data(f)))
        .expect("the observation is in the stream")
}

fn joined(tokens: &[(usize, String)]) -> String {
    tokens.iter().map(|(_, d)| d.as_str()).collect()
}

async fn tokens_stream_live_to_those_who_ask_and_are_never_replayed(backend: Backend, api: Api) {
    let (llm, app) = setup(backend, api, |llm| {
        llm.stream_slowly(20, Duration::from_millis(10));
        llm.push_item("s2", Reply::Text(ANSWER.into()));
    })
    .await;
    let t = app.thread(json!({})).await;
    let mut with = open(&app, &t, "?tokens=true", None).await;
    let mut without = open(&app, &t, "", None).await;
    let (status, run) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "what is 2+2?"}),
        )
        .await;
    assert_eq!(status, 202, "{run}");
    let run_id = run["runId"].as_str().unwrap();
    let frames = frames_until(&mut with, "RUN_COMPLETED").await;

    // The plan, as its JSON is written, before PLAN is committed.
    let plan = tokens_of(&frames, run_id, Value::Null, "plan");
    assert!(plan.len() >= 10, "{plan:?}");
    let plan_at = position(&frames, |o| o["type"] == "PLAN");
    assert!(plan.iter().all(|(i, _)| *i < plan_at));
    let written: Value = serde_json::from_str(&joined(&plan)).unwrap();
    assert_eq!(written["todoList"].as_array().unwrap().len(), 2);

    // Item s2's answer, in pieces, before s2 is committed completed; the pieces are the result.
    let s2 = tokens_of(&frames, run_id, json!("s2"), "execute");
    assert!(s2.len() >= 10, "{s2:?}");
    let s2_done = position(&frames, |o| {
        o["type"] == "ITEM_STATUS_CHANGE"
            && o["content"]["itemId"] == "s2"
            && o["content"]["status"] == "completed"
    });
    assert!(
        s2.iter().all(|(i, _)| *i < s2_done),
        "deltas come before the commit"
    );
    assert_eq!(joined(&s2), ANSWER);
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(state["stepOutputs"]["s2"], ANSWER);

    // The synthesis' JSON, before FINAL_RESPONSE, which holds the response it wrote.
    let synthesis = tokens_of(&frames, run_id, Value::Null, "synthesize");
    let final_at = position(&frames, |o| o["type"] == "FINAL_RESPONSE");
    assert!(!synthesis.is_empty() && synthesis.iter().all(|(i, _)| *i < final_at));
    let written: Value = serde_json::from_str(&joined(&synthesis)).unwrap();
    assert_eq!(
        written["response"],
        data(&frames[final_at])["content"]["response"]
    );
    let observations: Vec<&Frame> = frames.iter().filter(|f| !is_token(f)).collect();

    // A client that did not ask gets the same observations and no token.
    let plain = frames_until(&mut without, "RUN_COMPLETED").await;
    assert!(!plain.iter().any(is_token));
    assert_eq!(plain.len(), observations.len());

    // A replay from the start (asking for tokens, even) has the log and no token.
    let mut replay = open(&app, &t, "?tokens=true", Some("0")).await;
    let replayed = frames_until(&mut replay, "RUN_COMPLETED").await;
    assert!(!replayed.iter().any(is_token));
    let ids = |fs: &[&Frame]| fs.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&replayed.iter().collect::<Vec<_>>()),
        ids(&observations)
    );
    assert!(llm.requests().iter().all(|r| r["stream"] == true));
    app.stop().await;
}

async fn streamed_runs_and_resumes_carry_their_tokens(backend: Backend, api: Api) {
    let (_llm, app) = setup(backend, api, |llm| {
        llm.stream_slowly(20, Duration::from_millis(5));
    })
    .await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    // The run streams until it suspends at s1's calculator call.
    let resp = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs?tokens=true")))
        .header("accept", "text/event-stream")
        .json(&json!({"query": "what is 2+2?"}))
        .send()
        .await
        .unwrap();
    let frames = frames_until(&mut SseReader::new(resp), "RUN_SUSPENDED").await;
    let run_id = data(&frames[0])["runId"].as_str().unwrap().to_owned();
    let plan = tokens_of(&frames, &run_id, Value::Null, "plan");
    assert!(!plan.is_empty(), "the plan streamed");
    let plan_at = position(&frames, |o| o["type"] == "PLAN");
    assert!(plan.iter().all(|(i, _)| *i < plan_at));
    let suspended = position(&frames, |o| o["type"] == "AGENT_SUSPENDED");
    let suspension = data(&frames[suspended])["content"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();

    // Resumed with a stream: s1's answer after the tool ran, s2, the synthesis.
    let resp = app
        .client
        .post(app.url(&format!("/v1/suspensions/{suspension}/resume?tokens=true")))
        .header("accept", "text/event-stream")
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    let frames = frames_until(&mut SseReader::new(resp), "RUN_COMPLETED").await;
    let s1 = tokens_of(&frames, &run_id, json!("s1"), "execute");
    let s1_done = position(&frames, |o| {
        o["type"] == "ITEM_STATUS_CHANGE"
            && o["content"]["itemId"] == "s1"
            && o["content"]["status"] == "completed"
    });
    assert!(!s1.is_empty() && s1.iter().all(|(i, _)| *i < s1_done));
    assert_eq!(
        joined(&s1),
        "tool said {\"expression\":\"2+2\",\"result\":4}"
    );
    assert!(!tokens_of(&frames, &run_id, Value::Null, "synthesize").is_empty());
    // Without tokens=true, a streamed run has none (on a thread that asks for no approval).
    let t = app.thread(json!({})).await;
    let resp = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs")))
        .header("accept", "text/event-stream")
        .json(&json!({"query": "and again?"}))
        .send()
        .await
        .unwrap();
    let frames = frames_until(&mut SseReader::new(resp), "RUN_COMPLETED").await;
    assert!(
        frames
            .iter()
            .any(|f| f.event.as_deref() == Some("FINAL_RESPONSE"))
    );
    assert!(!frames.iter().any(is_token));
    app.stop().await;
}

macro_rules! each_api_and_store {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::Api;
            use crate::helpers::Backend;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn openai_postgres() {
                super::$body(Backend::Postgres, Api::OpenAi).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn openai_sqlite() {
                super::$body(Backend::Sqlite, Api::OpenAi).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn anthropic_postgres() {
                super::$body(Backend::Postgres, Api::Anthropic).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn anthropic_sqlite() {
                super::$body(Backend::Sqlite, Api::Anthropic).await
            }
        }
    };
}

each_api_and_store!(
    live,
    tokens_stream_live_to_those_who_ask_and_are_never_replayed
);
each_api_and_store!(streamed_runs, streamed_runs_and_resumes_carry_their_tokens);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_its_tokens_never_holds_the_run_back() {
    let long: String = "word ".repeat(2000);
    let (_llm, app) = setup(Backend::Sqlite, Api::OpenAi, |llm| {
        // 10,000 deltas, far more than a subscriber may fall behind by.
        llm.stream_slowly(10_000, Duration::ZERO);
        llm.push_item("s2", Reply::Text(long.clone()));
    })
    .await;
    let t = app.thread(json!({})).await;
    let mut idle = open(&app, &t, "?tokens=true", None).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    // Read late, the stream still has every observation, in order.
    let frames = frames_until(&mut idle, "RUN_COMPLETED").await;
    let seqs: Vec<i64> = frames
        .iter()
        .filter(|f| !is_token(f))
        .map(|f| data(f)["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    assert_eq!(
        frames.iter().filter(|f| !is_token(f)).count(),
        app.observations(&t).await.len()
    );
    // What it got of s2's deltas sits where they were written: after s2 started, before it
    // completed.
    let run_id = run["runId"].as_str().unwrap();
    let s2 = tokens_of(&frames, run_id, json!("s2"), "execute");
    assert!(!s2.is_empty());
    let status_at = |status: &'static str| {
        position(&frames, move |o| {
            o["type"] == "ITEM_STATUS_CHANGE"
                && o["content"]["itemId"] == "s2"
                && o["content"]["status"] == status
        })
    };
    let (started, done) = (status_at("in_progress"), status_at("completed"));
    assert!(s2.iter().all(|(i, _)| started < *i && *i < done));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_model_streams_its_replies_word_by_word() {
    let app = crate::helpers::spawn(Backend::Sqlite, None).await;
    let t = app.thread(json!({})).await;
    let mut sse = open(&app, &t, "?tokens=true", None).await;
    let run = app.run_wait(&t, "What is 12*(3+4)?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let frames = frames_until(&mut sse, "RUN_COMPLETED").await;
    let synthesis = tokens_of(
        &frames,
        run["runId"].as_str().unwrap(),
        Value::Null,
        "synthesize",
    );
    assert!(synthesis.len() > 3, "word by word: {synthesis:?}");
    let written: Value = serde_json::from_str(&joined(&synthesis)).unwrap();
    assert_eq!(written["response"], run["finalResponse"]["response"]);
    app.stop().await;
}

/// A stream of `thread`'s events served by `p` (`query` appended), after observation `after`.
async fn open_on(p: &crate::process::Proc, thread: &str, query: &str, after: i64) -> SseReader {
    let resp = p
        .client
        .get(p.url(&format!("/v1/threads/{thread}/events{query}")))
        .header("accept", "text/event-stream")
        .header("last-event-id", after.to_string())
        .send()
        .await
        .unwrap();
    SseReader::new(resp)
}

/// The value of an unlabelled series in `p`'s `/metrics`.
async fn metric(p: &crate::process::Proc, name: &str) -> f64 {
    let text = p
        .client
        .get(p.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reach_a_stream_on_another_replica_only_while_someone_there_listens() {
    use crate::process::{Proc, env_for};
    let db = crate::db::fresh_postgres_url().await;
    let llm = FakeLlm::start().await;
    llm.stream_slowly(20, Duration::from_millis(10));
    llm.push_item("s2", Reply::Text("not streamed anywhere".into()));
    llm.push_item("s2", Reply::Text(ANSWER.into()));
    let mut env = env_for(&db, &llm.url);
    // p1 drives every run; p2 only serves the API.
    let p1 = Proc::start(&env).await;
    env.push(("PES_WORKER_CONCURRENCY", "0".into()));
    let p2 = Proc::start(&env).await;
    // Everything the replicas tell each other, in the order Postgres delivers it.
    let mut listener = sqlx::postgres::PgListener::connect(&db).await.unwrap();
    listener.listen("pes").await.unwrap();
    let (tx, mut notes) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let listening = tokio::spawn(async move {
        while let Ok(n) = listener.recv().await {
            let _ = tx.send(serde_json::from_str(n.payload()).unwrap());
        }
    });
    for t in ["quiet", "relay"] {
        let (status, _) = p2.post("/v1/threads", json!({"threadId": t})).await;
        assert_eq!(status, 201);
    }

    // Run A: a client on p2 watches without asking for tokens, nobody else watches.
    let mut quiet = open_on(&p2, "quiet", "", 0).await;
    let (status, a) = p1
        .post("/v1/threads/quiet/runs", json!({"query": "first"}))
        .await;
    assert_eq!(status, 202, "{a}");
    let frames = frames_until(&mut quiet, "RUN_COMPLETED").await;
    assert!(!frames.iter().any(is_token));
    assert!(
        frames
            .iter()
            .any(|f| f.event.as_deref() == Some("ITEM_STATUS_CHANGE"))
    );
    assert_eq!(metric(&p1, "pes_token_remote_threads").await, 0.0);

    // Run B: a client on p2 asks for tokens, another does not; p1 learns of the first before
    // the run starts.
    let mut plain = open_on(&p2, "relay", "", 0).await;
    let mut with = open_on(&p2, "relay", "?tokens=true", 0).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric(&p1, "pes_token_remote_threads").await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "p1 never heard of p2's stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, b) = p1
        .post("/v1/threads/relay/runs", json!({"query": "what is 2+2?"}))
        .await;
    assert_eq!(status, 202, "{b}");
    let run_b = b["runId"].as_str().unwrap();
    let frames = frames_until(&mut with, "RUN_COMPLETED").await;
    assert_eq!(data(frames.last().unwrap())["runId"], run_b);
    // tokens_of checks every token frame: no id, run B's, the documented fields only.
    let plan = tokens_of(&frames, run_b, Value::Null, "plan");
    let plan_at = position(&frames, |o| o["type"] == "PLAN" && o["runId"] == run_b);
    assert!(
        !plan.is_empty() && plan.iter().all(|(i, _)| *i < plan_at),
        "{plan:?}"
    );
    let written: Value = serde_json::from_str(&joined(&plan)).unwrap();
    assert_eq!(written["todoList"].as_array().unwrap().len(), 2);
    // s2's answer: after s2 started (the observation it was written after), before it completed,
    // in several pieces as it was written, joining into what was committed.
    let s2 = tokens_of(&frames, run_b, json!("s2"), "execute");
    let s2_at = |status: &'static str| {
        position(&frames, move |o| {
            o["runId"] == run_b
                && o["type"] == "ITEM_STATUS_CHANGE"
                && o["content"]["itemId"] == "s2"
                && o["content"]["status"] == status
        })
    };
    let (started, done) = (s2_at("in_progress"), s2_at("completed"));
    assert!(s2.len() >= 2, "live, not all at once: {s2:?}");
    assert!(s2.iter().all(|(i, _)| started < *i && *i < done), "{s2:?}");
    assert_eq!(joined(&s2), ANSWER);
    let synthesis = tokens_of(&frames, run_b, Value::Null, "synthesize");
    let final_at = position(&frames, |o| {
        o["type"] == "FINAL_RESPONSE" && o["runId"] == run_b
    });
    assert!(!synthesis.is_empty() && synthesis.iter().all(|(i, _)| *i < final_at));
    let written: Value = serde_json::from_str(&joined(&synthesis)).unwrap();
    assert_eq!(
        written["response"],
        data(&frames[final_at])["content"]["response"]
    );
    // The client that did not ask still gets none.
    let frames = frames_until(&mut plain, "RUN_COMPLETED").await;
    assert!(!frames.iter().any(is_token));
    assert_eq!(data(frames.last().unwrap())["runId"], run_b);

    // On the wire: token payloads only for run B (none while nobody listened to run A), sent
    // before run B's end was committed, all counted by p1.
    let end_seq = data(frames.last().unwrap())["seq"].as_i64().unwrap();
    let mut token_notes = Vec::new();
    let mut wanted = 0;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), notes.recv())
            .await
            .expect("run B's end is notified")
            .unwrap();
        match n["k"].as_str() {
            Some("t") => token_notes.push(n),
            Some("w") => wanted += 1,
            Some("o") if n["thread"] == "relay" && n["seq"].as_i64() >= Some(end_seq) => break,
            _ => {}
        }
    }
    assert!(wanted >= 1, "p2 announced its stream");
    assert!(!token_notes.is_empty());
    for n in &token_notes {
        assert_eq!(n["thread"], "relay", "{n}");
        for d in n["deltas"].as_array().unwrap() {
            assert_eq!(d["r"], run_b, "only run B's deltas crossed: {n}");
        }
    }
    assert_eq!(
        metric(&p1, "pes_token_relay_payloads_total").await,
        token_notes.len() as f64
    );
    assert_eq!(metric(&p1, "pes_token_relay_dropped_total").await, 0.0);
    assert_eq!(metric(&p2, "pes_token_relay_payloads_total").await, 0.0);
    listening.abort();
    p2.kill9().await;
    p1.kill9().await;
}
