//! The retention routes: `/storage` counts what a thread stores, per tenant; `/threads/prune`
//! deletes a tenant's idle threads (or, dry, only names them), bounded; bad input is a clear
//! problem, and a thread whose id is `prune` stays reachable.

use std::time::Duration;

use serde_json::{Value, json};

use super::{gone, kept, metric, stream, thread_as, until_deleted};
use crate::both_stores;
use crate::fake_llm::{FakeLlm, plan};
use crate::helpers::assert_problem;
use crate::helpers::{Backend, TestApp, read, spawn_with};

fn footprint(s: &Value, kind: &str) -> (u64, u64) {
    (
        s[kind]["rows"].as_u64().unwrap(),
        s[kind]["bytes"].as_u64().unwrap(),
    )
}

async fn storage_counts_grow_with_a_run_and_are_per_tenant(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("ka:acme,kb:globex".into())
    })
    .await;
    let t = thread_as(&app, "ka", json!({})).await;
    let path = format!("/v1/threads/{t}/storage");
    let (s, empty) = app.get_as("ka", &path).await;
    assert_eq!(s, 200, "{empty}");
    assert_eq!(empty["threadId"], t);
    for kind in [
        "observations",
        "messages",
        "items",
        "runs",
        "history",
        "total",
    ] {
        assert_eq!(footprint(&empty, kind), (0, 0), "{kind}: {empty}");
    }
    let (s, run) = app
        .post_as(
            "ka",
            &format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "what is 2+2?"}),
        )
        .await;
    assert_eq!(
        (s, run["status"].as_str()),
        (200, Some("completed")),
        "{run}"
    );
    let (_, one) = app.get_as("ka", &path).await;
    let (_, obs) = app
        .get_as("ka", &format!("/v1/threads/{t}/observations?limit=1000"))
        .await;
    let obs = obs["items"].as_array().unwrap();
    let (rows, bytes) = footprint(&one, "observations");
    assert_eq!(rows, obs.len() as u64);
    // At least the titles and the contents as JSON (how each store writes JSON out differs).
    let least: usize = obs
        .iter()
        .map(|o| o["title"].as_str().unwrap().len() + o["content"].to_string().len())
        .sum();
    assert!(bytes >= least as u64, "{bytes} < {least}");
    let (_, messages) = app
        .get_as("ka", &format!("/v1/threads/{t}/messages?limit=200"))
        .await;
    let messages = messages["items"].as_array().unwrap();
    assert_eq!(footprint(&one, "messages").0, messages.len() as u64);
    let said: usize = messages
        .iter()
        .map(|m| m["content"].as_str().unwrap().len())
        .sum();
    assert!(footprint(&one, "messages").1 >= said as u64);
    assert_eq!(footprint(&one, "items").0, 2, "the fake plan has two items");
    assert_eq!(footprint(&one, "runs").0, 1);
    for kind in ["items", "runs", "history"] {
        assert!(footprint(&one, kind).1 > 0, "{kind}: {one}");
    }
    // History: at least a commit per state change and a version of each item.
    assert!(footprint(&one, "history").0 > 2, "{one}");
    let sum = |i: usize| -> u64 {
        ["observations", "messages", "items", "runs", "history"]
            .iter()
            .map(|k| {
                let f = footprint(&one, k);
                if i == 0 { f.0 } else { f.1 }
            })
            .sum()
    };
    assert_eq!(footprint(&one, "total"), (sum(0), sum(1)));
    app.post_as(
        "ka",
        &format!("/v1/threads/{t}/runs/wait"),
        json!({"query": "and 3+3?"}),
    )
    .await;
    let (_, two) = app.get_as("ka", &path).await;
    for kind in ["observations", "messages", "runs"] {
        let (before, after) = (footprint(&one, kind), footprint(&two, kind));
        assert!(
            after.0 > before.0 && after.1 > before.1,
            "{kind} grows: {before:?} → {after:?}"
        );
    }
    // Another tenant's view: no such thread.
    let (s, body) = app.get_as("kb", &path).await;
    assert_problem(&(s, body), 404, "thread_not_found");
    let (s, body) = app.get_as("ka", "/v1/threads/nope/storage").await;
    assert_problem(&(s, body), 404, "thread_not_found");
    let (s, body) = app.get_as("ka", "/v1/threads/has%20space/storage").await;
    assert_problem(&(s, body), 404, "thread_not_found");

    // A deleted thread takes its history with it (the version tables hold no foreign key on
    // Postgres): a new thread under the same id starts with none, and its past holds nothing
    // of the old one's.
    let (s, _) = app.delete_as("ka", &format!("/v1/threads/{t}")).await;
    assert_eq!(s, 204);
    let again = thread_as(&app, "ka", json!({"threadId": t})).await;
    assert_eq!(again, t);
    let (_, fresh) = app.get_as("ka", &path).await;
    assert_eq!(footprint(&fresh, "history"), (0, 0), "{fresh}");
    assert_eq!(footprint(&fresh, "observations"), (0, 0), "{fresh}");
    let (s, points) = app.get_as("ka", &format!("/v1/threads/{t}/history")).await;
    assert_eq!(s, 200, "{points}");
    assert_eq!(points["items"], json!([]), "{points}");
    app.post_as(
        "ka",
        &format!("/v1/threads/{t}/runs/wait"),
        json!({"query": "what is 2+2?"}),
    )
    .await;
    let (_, after) = app.get_as("ka", &path).await;
    let (_, early) = app
        .get_as("ka", &format!("/v1/threads/{t}/state?atSeq=1"))
        .await;
    // One run's history, not two: the old thread's versions are gone, so the state after the
    // first observation has no item yet.
    assert_eq!(footprint(&after, "history").0, footprint(&one, "history").0);
    assert_eq!(early["todoList"], json!([]), "{early}");
    app.stop().await;
}
both_stores!(storage, storage_counts_grow_with_a_run_and_are_per_tenant);

fn ids(result: &Value) -> Vec<String> {
    let mut ids: Vec<String> = result["threadIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

async fn prune_dry_run_names_threads_without_deleting_then_prune_deletes_them(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
        c.prune_max_threads = 2;
    })
    .await;
    let prune = |body: Value| app.post_as("ka", "/v1/threads/prune", body);
    // Age: a thread is matched once it has been idle long enough, and a newer one is not.
    let old = thread_as(&app, "ka", json!({"threadId": "old"})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (s, r) = prune(json!({"olderThanSeconds": 2, "dryRun": true})).await;
        assert_eq!(s, 200, "{r}");
        if r["threadIds"] == json!([old]) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new = thread_as(&app, "ka", json!({"threadId": "new"})).await;
    let (_, r) = prune(json!({"olderThanSeconds": 2, "dryRun": true})).await;
    assert_eq!(
        r["threadIds"],
        json!([old]),
        "not `{new}`, idle for less than 2 s"
    );
    // A failed run (status `error`) and a suspended one (never pruned).
    llm.push("plan", plan(&[("a", "x", &[], &["zz"])]));
    llm.push("plan", plan(&[("a", "x", &[], &["zz"])]));
    let failed = thread_as(&app, "ka", json!({"threadId": "failed"})).await;
    let (_, run) = app
        .post_as(
            "ka",
            &format!("/v1/threads/{failed}/runs/wait"),
            json!({"query": "q"}),
        )
        .await;
    assert_eq!(run["status"], "failed", "{run}");
    let waiting = thread_as(
        &app,
        "ka",
        json!({"threadId": "waiting", "config": {"requireApproval": ["calculator"]}}),
    )
    .await;
    let (_, run) = app
        .post_as(
            "ka",
            &format!("/v1/threads/{waiting}/runs/wait"),
            json!({"query": "what is 2+2?"}),
        )
        .await;
    assert_eq!(run["status"], "suspended", "{run}");
    let extra = thread_as(&app, "ka", json!({"threadId": "extra"})).await;
    let other = thread_as(&app, "kb", json!({"threadId": "theirs"})).await;

    let (s, r) = prune(json!({"olderThanSeconds": 3600, "dryRun": true})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r,
        json!({"matched": 0, "more": false, "dryRun": true, "threadIds": []})
    );
    let (_, r) = prune(json!({"olderThanSeconds": 0, "status": "error", "dryRun": true})).await;
    assert_eq!(
        (r["matched"].as_u64(), ids(&r)),
        (Some(1), vec![failed.clone()])
    );
    let (_, r) = prune(json!({"olderThanSeconds": 0, "status": "idle", "dryRun": true})).await;
    assert_eq!(r["matched"], 2, "capped at PES_PRUNE_MAX_THREADS: {r}");
    assert_eq!(r["more"], true, "{r}");
    for t in [&old, &new, &failed, &waiting, &extra] {
        kept(&app, Some("ka"), t).await;
    }

    // Deleting: its stream ends, and the bound holds per call.
    let mut sse = stream(&app, Some("ka"), &old, 0).await;
    let (s, r) = prune(json!({"olderThanSeconds": 0, "status": "error"})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r,
        json!({"deleted": 1, "more": false, "dryRun": false, "threadIds": ["failed"]})
    );
    // Oldest activity first, two per call.
    let (_, r) = prune(json!({"olderThanSeconds": 0})).await;
    assert_eq!(
        r,
        json!({"deleted": 2, "more": true, "dryRun": false, "threadIds": ["old", "new"]})
    );
    until_deleted(&mut sse, &old).await;
    let (_, r) = prune(json!({"olderThanSeconds": 0})).await;
    assert_eq!(
        r,
        json!({"deleted": 1, "more": false, "dryRun": false, "threadIds": ["extra"]})
    );
    let (_, r) = prune(json!({"olderThanSeconds": 0})).await;
    assert_eq!(
        r,
        json!({"deleted": 0, "more": false, "dryRun": false, "threadIds": []})
    );
    for t in [&old, &new, &failed, &extra] {
        gone(&app, Some("ka"), t).await;
    }
    kept(&app, Some("ka"), &waiting).await;
    kept(&app, Some("kb"), &other).await;
    assert_eq!(metric(&app, "pes_threads_pruned_total").await, 4.0);
    app.stop().await;
}
both_stores!(
    prune,
    prune_dry_run_names_threads_without_deleting_then_prune_deletes_them
);

/// A raw request with a JSON content type.
async fn send(app: &TestApp, method: reqwest::Method, path: &str, body: &str) -> (u16, Value) {
    let r = app
        .client
        .request(method, app.url(path))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    read(r).await
}

async fn bad_retention_input_is_a_clear_problem(backend: Backend) {
    let app = spawn_with(backend, None, |_| {}).await;
    for body in [
        "{}",
        r#"{"olderThanSeconds": -1}"#,
        r#"{"olderThanSeconds": "60"}"#,
        r#"{"olderThanSeconds": 1.5}"#,
        r#"{"olderThanSeconds": 315360001}"#,
        r#"{"olderThanSeconds": 60, "status": "busy"}"#,
        r#"{"olderThanSeconds": 60, "status": "suspended"}"#,
        r#"{"olderThanSeconds": 60, "status": "bogus"}"#,
        r#"{"olderThanSeconds": 60, "dryRun": "yes"}"#,
        r#"{"olderThanSeconds": 60, "limit": 5}"#,
        "[]",
    ] {
        let (s, b) = send(&app, reqwest::Method::POST, "/v1/threads/prune", body).await;
        assert_problem(&(s, b), 422, "validation_failed");
    }
    let (s, b) = send(&app, reqwest::Method::POST, "/v1/threads/prune", "{").await;
    assert_problem(&(s, b), 400, "malformed_json");
    let r = app
        .client
        .post(app.url("/v1/threads/prune"))
        .header("content-type", "text/plain")
        .body(r#"{"olderThanSeconds": 0}"#)
        .send()
        .await
        .unwrap();
    let (s, b) = read(r).await;
    assert_problem(&(s, b), 415, "unsupported_media_type");
    // A TTL is a thread's (or an assistant's), within ten years.
    let (s, b) = app
        .post(
            "/v1/threads",
            json!({"config": {"ttlSeconds": 315_360_001u64}}),
        )
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post("/v1/threads", json!({"config": {"ttlSeconds": -5}}))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let t = app.thread(json!({})).await;
    let (s, b) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "hi", "config": {"ttlSeconds": 60}}),
        )
        .await;
    assert_problem(&(s, b.clone()), 422, "validation_failed");
    assert!(
        b["detail"].as_str().unwrap().contains("thread setting"),
        "{b}"
    );
    let (s, b) = app.get("/v1/threads/prune/storage").await;
    assert_problem(&(s, b), 404, "thread_not_found");
    // The prune route does not hide a thread whose id is `prune`.
    let (s, b) = app.get("/v1/threads/prune").await;
    assert_problem(&(s, b), 404, "thread_not_found");
    app.thread(json!({"threadId": "prune"})).await;
    let (s, b) = app.get("/v1/threads/prune").await;
    assert_eq!((s, b["threadId"].as_str()), (200, Some("prune")), "{b}");
    let (s, b) = send(
        &app,
        reqwest::Method::PATCH,
        "/v1/threads/prune",
        r#"{"metadata": {"kept": true}}"#,
    )
    .await;
    assert_eq!((s, &b["metadata"]), (200, &json!({"kept": true})), "{b}");
    let (s, _) = app.get("/v1/threads/prune/storage").await;
    assert_eq!(s, 200);
    let (s, _) = send(&app, reqwest::Method::DELETE, "/v1/threads/prune", "").await;
    assert_eq!(s, 204);
    let (s, b) = app.get("/v1/threads/prune").await;
    assert_problem(&(s, b), 404, "thread_not_found");
    // What the path is for is POST: other methods are refused, naming it.
    for method in [reqwest::Method::PUT, reqwest::Method::OPTIONS] {
        let r = app
            .client
            .request(method, app.url("/v1/threads/prune"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["allow"], "POST");
        let (s, b) = read(r).await;
        assert_problem(&(s, b.clone()), 405, "method_not_allowed");
        assert!(
            b["detail"].as_str().unwrap().ends_with("allowed: POST"),
            "{b}"
        );
    }
    app.stop().await;
}
both_stores!(bad_input, bad_retention_input_is_a_clear_problem);
