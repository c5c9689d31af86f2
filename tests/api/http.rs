//! The HTTP contract: threads CRUD and pagination, bad input as problem+json, authentication and
//! tenants, multitask strategies, cancel, SSE replay and live delivery, the OpenAPI document.

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, SseReader, assert_problem, spawn, spawn_with};

async fn threads_can_be_created_listed_updated_and_deleted(backend: Backend) {
    let app = spawn(backend, None).await;
    let (s, t) = app
        .post(
            "/v1/threads",
            json!({"threadId": "t-1", "metadata": {"a": 1}, "config": {"maxIterations": 3}}),
        )
        .await;
    assert_eq!(s, 201, "{t}");
    assert_eq!(t["threadId"], "t-1");
    assert_eq!(t["status"], "idle");
    assert_eq!(t["config"]["maxIterations"], 3);
    let (s, body) = app.post("/v1/threads", json!({"threadId": "t-1"})).await;
    assert_problem(&(s, body), 409, "thread_exists");
    let (s, t) = app.post("/v1/threads", json!({})).await;
    assert_eq!(s, 201);
    assert_eq!(
        t["threadId"].as_str().unwrap().len(),
        36,
        "a server-made UUID"
    );
    for i in 0..5 {
        app.thread(json!({"threadId": format!("p-{i}")})).await;
    }
    // Pages of 3, newest first, no duplicates, all 7 threads.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/threads?limit=3&cursor={c}"),
            None => "/v1/threads?limit=3".to_owned(),
        };
        let (s, page) = app.get(&path).await;
        assert_eq!(s, 200, "{page}");
        for t in page["items"].as_array().unwrap() {
            seen.push(t["threadId"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert_eq!(seen[0], "p-4");
    let mut dedup = seen.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), 7);

    let r = app
        .client
        .patch(app.url("/v1/threads/t-1"))
        .json(&json!({"metadata": {"b": 2}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, t) = app.get("/v1/threads/t-1").await;
    assert_eq!(t["metadata"], json!({"b": 2}));
    assert_eq!(
        t["config"]["maxIterations"], 3,
        "config untouched by a metadata patch"
    );

    let r = app
        .client
        .delete(app.url("/v1/threads/t-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (s, body) = app.get("/v1/threads/t-1").await;
    assert_problem(&(s, body), 404, "thread_not_found");
    let (s, body) = app.get("/v1/threads/t-1/observations").await;
    assert_problem(&(s, body), 404, "thread_not_found");
    app.stop().await;
}
both_stores!(
    threads_crud,
    threads_can_be_created_listed_updated_and_deleted
);

async fn bad_input_gets_problem_details_and_the_service_stays_healthy(backend: Backend) {
    let app = spawn(backend, None).await;
    let t = app.thread(json!({"threadId": "keep"})).await;
    app.run_wait(&t, "1+1").await;
    let before = app.observations(&t).await;

    // Malformed JSON.
    let r = app
        .client
        .post(app.url("/v1/threads"))
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    let (s, b) = crate::helpers::read(r).await;
    assert_problem(&(s, b), 400, "malformed_json");
    // Wrong content type.
    let r = app
        .client
        .post(app.url("/v1/threads"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    let (s, b) = crate::helpers::read(r).await;
    assert_problem(&(s, b), 415, "unsupported_media_type");
    // Missing field, wrong type, unknown field, bad id, bad config.
    let (s, b) = app.post(&format!("/v1/threads/{t}/runs"), json!({})).await;
    assert_problem(&(s, b.clone()), 422, "validation_failed");
    assert!(b["detail"].as_str().unwrap().contains("query"), "{b}");
    let (s, b) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": 5}))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "x", "bogus": 1}),
        )
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "   "}))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post("/v1/threads", json!({"threadId": "has space"}))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post("/v1/threads", json!({"config": {"maxIterations": 0}}))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post("/v1/threads", json!({"config": {"tools": ["nope"]}}))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app.post("/v1/threads", json!({"metadata": [1, 2]})).await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "x", "multitaskStrategy": "explode"}),
        )
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    // Unknown ids.
    let (s, b) = app
        .post("/v1/threads/missing/runs", json!({"query": "x"}))
        .await;
    assert_problem(&(s, b), 404, "thread_not_found");
    let (s, b) = app.get(&format!("/v1/threads/{t}/runs/not-a-uuid")).await;
    assert_problem(&(s, b), 404, "run_not_found");
    let (s, b) = app
        .get(&format!(
            "/v1/threads/{t}/runs/01934b5e-0000-7000-8000-000000000000"
        ))
        .await;
    assert_problem(&(s, b), 404, "run_not_found");
    let (s, b) = app
        .get("/v1/suspensions/01934b5e-0000-7000-8000-000000000000")
        .await;
    assert_problem(&(s, b), 404, "suspension_not_found");
    // Bad query parameters and cursors.
    let (s, b) = app.get("/v1/threads?limit=0").await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app.get("/v1/threads?cursor=zz").await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .get(&format!("/v1/threads/{t}/observations?type=NOPE"))
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let r = app
        .client
        .get(app.url(&format!("/v1/threads/{t}/events")))
        .header("last-event-id", "abc")
        .send()
        .await
        .unwrap();
    let (s, b) = crate::helpers::read(r).await;
    assert_problem(&(s, b), 400, "invalid_header");
    // A 20 MB body.
    let big = format!("{{\"query\": \"{}\"}}", "x".repeat(20 * 1024 * 1024));
    let r = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs")))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await;
    if let Ok(r) = r {
        let (s, b) = crate::helpers::read(r).await;
        assert_problem(&(s, b), 413, "payload_too_large");
    }
    // Unknown routes and methods.
    let (s, b) = app.get("/v1/nothing-here").await;
    assert_problem(&(s, b), 404, "route_not_found");
    let r = app.client.put(app.url("/v1/threads")).send().await.unwrap();
    let (s, b) = crate::helpers::read(r).await;
    assert_problem(&(s, b), 405, "method_not_allowed");

    // Still healthy, nothing lost.
    let (s, _) = app.get("/healthz").await;
    assert_eq!(s, 200);
    let (s, ready) = app.get("/readyz").await;
    assert_eq!(s, 200, "{ready}");
    assert_eq!(app.observations(&t).await, before);
    let run = app.run_wait(&t, "2+2").await;
    assert_eq!(run["status"], "completed");
    app.stop().await;
}
both_stores!(
    bad_input,
    bad_input_gets_problem_details_and_the_service_stays_healthy
);

async fn api_keys_separate_tenants(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into())
    })
    .await;
    let (s, b) = app.post("/v1/threads", json!({})).await;
    assert_problem(&(s, b), 401, "unauthorized");
    let auth = |k: &str| format!("Bearer {k}");
    let r = app
        .client
        .post(app.url("/v1/threads"))
        .header("authorization", auth("ka"))
        .json(&json!({"threadId": "shared"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // Tenant B does not see it, and may use the same id.
    let r = app
        .client
        .get(app.url("/v1/threads/shared"))
        .header("authorization", auth("kb"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = app
        .client
        .post(app.url("/v1/threads"))
        .header("authorization", auth("kb"))
        .json(&json!({"threadId": "shared"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = app
        .client
        .get(app.url("/v1/threads"))
        .header("authorization", auth("wrong"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Health, readiness and docs need no key.
    for p in ["/healthz", "/readyz", "/openapi.json", "/metrics"] {
        let (s, _) = app.get(p).await;
        assert_eq!(s, 200, "{p}");
    }
    app.stop().await;
}
both_stores!(auth, api_keys_separate_tenants);

async fn multitask_reject_enqueue_idempotency_and_cancel(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    // The first run's plan waits, so the thread stays busy.
    llm.push(
        "plan",
        Reply::Delay(
            Duration::from_millis(800),
            Box::new(plan(&[("a", "x", &[], &[])])),
        ),
    );
    let t = app.thread(json!({})).await;
    let (s, first) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "one", "idempotencyKey": "k1"}),
        )
        .await;
    assert_eq!(s, 202, "{first}");
    let (s, again) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "one", "idempotencyKey": "k1"}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(again["runId"], first["runId"]);
    let (s, b) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "two", "multitaskStrategy": "reject"}),
        )
        .await;
    assert_problem(&(s, b), 409, "thread_busy");
    let (s, queued) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "three"}))
        .await;
    assert_eq!(s, 202);
    assert_eq!(queued["status"], "queued");
    let (_, thread) = app.get(&format!("/v1/threads/{t}")).await;
    assert_eq!(thread["status"], "busy");
    // Cancel the queued one.
    let qid = queued["runId"].as_str().unwrap();
    let (s, c) = app
        .post(&format!("/v1/threads/{t}/runs/{qid}/cancel"), json!({}))
        .await;
    assert_eq!(s, 202, "{c}");
    assert_eq!(c["status"], "cancelled");
    let (s, b) = app
        .post(&format!("/v1/threads/{t}/runs/{qid}/cancel"), json!({}))
        .await;
    assert_problem(&(s, b), 409, "conflict");
    let fid = first["runId"].as_str().unwrap();
    let done = app.wait_run(&t, fid, |r| r["status"] == "completed").await;
    assert_eq!(done["status"], "completed");
    let (_, runs) = app.get(&format!("/v1/threads/{t}/runs")).await;
    let statuses: Vec<_> = runs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].clone())
        .collect();
    assert_eq!(statuses, vec![json!("cancelled"), json!("completed")]);
    let obs = app.observations(&t).await;
    assert!(
        obs.iter()
            .any(|o| o["type"] == "RUN_CANCELLED" && o["runId"] == qid)
    );
    app.stop().await;
}
both_stores!(multitask, multitask_reject_enqueue_idempotency_and_cancel);

async fn cancelling_a_running_run_stops_it(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push("plan", plan(&[("a", "slow", &[], &[])]));
    llm.push(
        "execute",
        Reply::Delay(
            Duration::from_secs(20),
            Box::new(Reply::Text("late".into())),
        ),
    );
    let t = app.thread(json!({})).await;
    let (_, run) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "q"}))
        .await;
    let id = run["runId"].as_str().unwrap().to_owned();
    // Wait until the item is in progress (the slow model call is under way).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while llm.requests_of("execute").is_empty() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = tokio::time::Instant::now();
    let (s, _) = app
        .post(&format!("/v1/threads/{t}/runs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(s, 202);
    let run = app.wait_run(&t, &id, |r| r["status"] == "cancelled").await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "cancelled in {:?}",
        started.elapsed()
    );
    assert!(run["endedAt"].is_string());
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(
        state["todoList"][0]["status"], "cancelled",
        "the interrupted item ends with its run: no later run takes it up"
    );
    assert_eq!(state["todoList"][0]["error"]["code"], "run_cancelled");
    let obs = app.observations(&t).await;
    assert_eq!(obs.last().unwrap()["type"], "RUN_CANCELLED");
    app.stop().await;
}
both_stores!(cancel_running, cancelling_a_running_run_stops_it);

async fn sse_replay_after_last_event_id_equals_the_json_list(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    app.run_wait(&t, "q").await;
    let all = app.observations(&t).await;
    let last = all.last().unwrap()["seq"].as_i64().unwrap();
    for (header, query) in [(Some("3"), ""), (None, "?after=5"), (Some("4"), "?after=9")] {
        let mut req = app
            .client
            .get(app.url(&format!("/v1/threads/{t}/events{query}")));
        if let Some(h) = header {
            req = req.header("last-event-id", h);
        }
        let mut sse = SseReader::new(req.send().await.unwrap());
        let got = sse.until("RUN_COMPLETED").await;
        let from: i64 = header.map(|h| h.parse().unwrap()).unwrap_or(5);
        let expected: Vec<Value> = all
            .iter()
            .filter(|o| o["seq"].as_i64().unwrap() > from)
            .cloned()
            .collect();
        assert_eq!(got, expected, "replay after {from}");
        assert_eq!(got.last().unwrap()["seq"], last);
    }
    // Filters apply to the stream too.
    let r = app
        .client
        .get(app.url(&format!(
            "/v1/threads/{t}/events?types=TOOL_EXECUTION,RUN_COMPLETED"
        )))
        .send()
        .await
        .unwrap();
    let got = SseReader::new(r).until("RUN_COMPLETED").await;
    assert_eq!(got.len(), 2);
    app.stop().await;
}
both_stores!(
    sse_replay,
    sse_replay_after_last_event_id_equals_the_json_list
);

async fn a_subscriber_connected_before_the_run_sees_everything_live(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.sse_keepalive_seconds = 1).await;
    let t = app.thread(json!({})).await;
    let r = app
        .client
        .get(app.url(&format!("/v1/threads/{t}/events")))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    // A keep-alive comment arrives while nothing happens.
    let f = sse.next(Duration::from_secs(5)).await.unwrap();
    assert!(f.comment, "{f:?}");
    let (s, _) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "q1"}))
        .await;
    assert_eq!(s, 202);
    let mut got = sse.until("RUN_COMPLETED").await;
    let (s, _) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "q2"}))
        .await;
    assert_eq!(s, 202);
    got.extend(sse.until("RUN_COMPLETED").await);
    assert_eq!(
        got,
        app.observations(&t).await,
        "live stream equals the log: no gap, no duplicate"
    );
    app.stop().await;
}
both_stores!(
    sse_live,
    a_subscriber_connected_before_the_run_sees_everything_live
);

async fn posting_with_accept_event_stream_streams_the_run(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    app.run_wait(&t, "first").await;
    let r = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs")))
        .header("accept", "text/event-stream")
        .json(&json!({"query": "second"}))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    let got = sse.until("RUN_COMPLETED").await;
    assert_eq!(got[0]["type"], "RUN_STARTED");
    assert_eq!(got[0]["content"]["query"], "second");
    let run_id = got[0]["runId"].clone();
    assert!(
        got.iter().all(|o| o["runId"] == run_id),
        "only this run's observations"
    );
    assert!(
        sse.next(Duration::from_secs(5)).await.is_none(),
        "the stream ends with the run"
    );
    app.stop().await;
}
both_stores!(run_stream, posting_with_accept_event_stream_streams_the_run);

#[tokio::test]
async fn the_committed_openapi_document_is_what_the_server_serves() {
    let app = spawn(Backend::Sqlite, None).await;
    let (s, served) = app.get("/openapi.json").await;
    assert_eq!(s, 200);
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        served, committed,
        "regenerate with `cargo run -- openapi > openapi/openapi.json`"
    );
    for path in [
        "/v1/threads",
        "/v1/threads/{threadId}/runs",
        "/v1/threads/{threadId}/events",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
    ] {
        assert!(
            served["paths"][path].is_object(),
            "{path} missing from the document"
        );
    }
    let r = app.client.get(app.url("/docs/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("swagger"));
    app.stop().await;
}

/// Every answer carries `x-request-id` (a fresh UUID, or the client's own id echoed), errors
/// included, so what a client reports can be found in the logs.
async fn every_response_carries_a_request_id(backend: Backend) {
    let app = spawn(backend, None).await;
    let mut ids = std::collections::HashSet::new();
    for (method, path) in [
        (reqwest::Method::GET, "/healthz"),
        (reqwest::Method::GET, "/v1/threads"),
        (reqwest::Method::GET, "/v1/threads/nope/state"),
        (reqwest::Method::POST, "/v1/threads"),
        (reqwest::Method::GET, "/no/such/route"),
    ] {
        let r = app
            .client
            .request(method.clone(), app.url(path))
            .header("content-type", "application/json")
            .body("[1]")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let id = r
            .headers()
            .get("x-request-id")
            .unwrap_or_else(|| panic!("{method} {path} ({status}) has no x-request-id"))
            .to_str()
            .unwrap()
            .to_owned();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{method} {path}: {id}");
        assert!(ids.insert(id), "each request gets its own id");
    }
    let r = app
        .client
        .get(app.url("/v1/threads/nope"))
        .header("x-request-id", "client-chosen-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-request-id"], "client-chosen-42");
}
both_stores!(request_ids, every_response_carries_a_request_id);

/// Errors a newcomer meets in the first hour say what to do next.
async fn errors_tell_a_newcomer_what_to_do(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    // A run posted to a thread that does not exist names both ways to create it.
    let (s, b) = app
        .post("/v1/threads/nope/runs", json!({"query": "hi"}))
        .await;
    assert_problem(&(s, b.clone()), 404, "thread_not_found");
    let detail = b["detail"].as_str().unwrap();
    assert!(
        detail.contains("ifNotExists") && detail.contains("POST /v1/threads"),
        "{b}"
    );
    // A type error names the field.
    let t = app.thread(json!({})).await;
    let (s, b) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": 42}))
        .await;
    assert_problem(&(s, b.clone()), 422, "validation_failed");
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("query: invalid type"),
        "{b}"
    );
    // A 405 names the methods the route has, in `detail` and in `Allow`.
    let r = app
        .client
        .put(app.url(&format!("/v1/threads/{t}")))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let allow = r.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("PATCH") && allow.contains("GET"), "{allow}");
    let (s, b) = crate::helpers::read(r).await;
    assert_problem(&(s, b.clone()), 405, "method_not_allowed");
    assert!(b["detail"].as_str().unwrap().contains("PATCH"), "{b}");
    // A `/v1` route without its prefix says so.
    let (s, b) = app.get("/threads").await;
    assert_problem(&(s, b.clone()), 404, "route_not_found");
    assert!(b["detail"].as_str().unwrap().contains("/v1/threads"), "{b}");
    // A 409 on a decided suspension says which decision and when.
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let resume = format!("/v1/suspensions/{sid}/resume");
    let (s, _) = app
        .post(&resume, json!({"decision": "reject", "reason": "not now"}))
        .await;
    assert_eq!(s, 202);
    let (s, b) = app.post(&resume, json!({"decision": "approve"})).await;
    assert_problem(&(s, b.clone()), 409, "suspension_resolved");
    let detail = b["detail"].as_str().unwrap();
    assert!(
        detail.contains("`reject`") && detail.contains("not now"),
        "{b}"
    );
    app.stop().await;
}
both_stores!(newcomer_errors, errors_tell_a_newcomer_what_to_do);

/// What a person recognises a thread by comes with the list, for every thread of the page: its
/// title once a run has planned, and its newest run's query, cut to 200 characters.
async fn the_thread_list_carries_each_threads_title_and_last_query(backend: Backend) {
    let app = spawn(backend, None).await;
    app.thread(json!({"threadId": "fresh"})).await;
    app.thread(json!({"threadId": "asked"})).await;
    let first = app.run_wait("asked", "What is 2+3?").await;
    assert_eq!(first["status"], "completed", "{first}");
    let second = app.run_wait("asked", "And what is 4*5?").await;
    assert_eq!(second["status"], "completed", "{second}");
    // A long query of multi-byte characters: cut by characters, never inside one.
    let long = format!("What is 1+1? {}", "é".repeat(300));
    app.thread(json!({"threadId": "long"})).await;
    app.run_wait("long", &long).await;

    let (s, page) = app.get("/v1/threads").await;
    assert_eq!(s, 200, "{page}");
    let by_id = |id: &str| {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["threadId"] == id)
            .unwrap_or_else(|| panic!("{id} listed: {page}"))
            .clone()
    };
    let fresh = by_id("fresh");
    assert_eq!(fresh["title"], Value::Null, "{fresh}");
    assert_eq!(fresh["lastQuery"], Value::Null, "{fresh}");
    assert_eq!(
        fresh["status"], "idle",
        "still the thread's own fields: {fresh}"
    );
    let asked = by_id("asked");
    assert_eq!(
        asked["lastQuery"], "And what is 4*5?",
        "the newest run's: {asked}"
    );
    let (_, state) = app.get("/v1/threads/asked/state").await;
    assert!(state["title"].is_string(), "{state}");
    assert_eq!(asked["title"], state["title"], "the state's title: {asked}");
    let cut = by_id("long")["lastQuery"].as_str().unwrap().to_owned();
    assert_eq!(cut.chars().count(), 200, "{cut}");
    assert!(long.starts_with(&cut), "a prefix of the query: {cut}");
    app.stop().await;
}
both_stores!(
    thread_list_titles,
    the_thread_list_carries_each_threads_title_and_last_query
);
