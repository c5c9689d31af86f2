//! Token streaming over HTTP, with a fake model that writes slowly, on both providers: deltas
//! arrive live (before the commit of what they make), carry their run, item and phase, have no
//! `id:`, reach only clients that asked, are never replayed, and join into what was committed.

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
    // Without tokens=true, a streamed run has none.
    let resp = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs")))
        .header("accept", "text/event-stream")
        .json(&json!({"query": "and again?", "config": {"requireApproval": []}}))
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
