//! Contract fixes found by trying the service as a new user and as an attacker: NUL characters,
//! forged cursors, out-of-range numbers, bodies of the wrong shape, bad `Last-Event-ID` headers,
//! and streams of deleted threads. Each answer is a 4xx problem+json (never a 500 or a panic),
//! the same on both stores, and nothing stored is lost.

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::assert_problem;
use crate::helpers::{Backend, SseReader, TestApp, read, spawn, spawn_config, test_config};

async fn send_raw(app: &TestApp, method: &str, path: &str, body: &str) -> (u16, Value) {
    let req = match method {
        "POST" => app.client.post(app.url(path)),
        "PATCH" => app.client.patch(app.url(path)),
        other => panic!("{other}"),
    };
    let r = req
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    read(r).await
}

/// A thread with one completed run, and a thread whose run waits for approval; returns
/// (completed thread, suspension id).
async fn seed(app: &TestApp) -> (String, String) {
    let t = app
        .thread(json!({"threadId": "keep", "metadata": {"k": "v"}}))
        .await;
    app.run_wait(&t, "what is 2+3?").await;
    let s = app
        .thread(json!({"threadId": "waits", "config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&s, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    (t, sid)
}

async fn nul_characters_are_refused_alike_and_nothing_is_lost(backend: Backend) {
    let app = spawn(backend, None).await;
    let (t, sid) = seed(&app).await;
    let before = app.observations(&t).await;
    let nul = "a\u{0}b";
    let bodies: Vec<(&str, String, Value)> = vec![
        ("POST", "/v1/threads".into(), json!({"threadId": nul})),
        (
            "POST",
            "/v1/threads".into(),
            json!({"metadata": {"x": nul}}),
        ),
        ("POST", "/v1/threads".into(), json!({"metadata": {nul: 1}})),
        (
            "POST",
            "/v1/threads".into(),
            json!({"config": {"systemPrompt": nul}}),
        ),
        (
            "PATCH",
            format!("/v1/threads/{t}"),
            json!({"metadata": {"x": [nul]}}),
        ),
        (
            "POST",
            format!("/v1/threads/{t}/runs"),
            json!({"query": nul}),
        ),
        (
            "POST",
            format!("/v1/threads/{t}/runs"),
            json!({"query": "hi", "idempotencyKey": nul}),
        ),
        (
            "POST",
            format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "hi", "config": {"persona": {"name": nul}}}),
        ),
        (
            "POST",
            format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "reject", "reason": nul}),
        ),
        (
            "POST",
            format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "respond", "response": {"v": nul}}),
        ),
    ];
    for (method, path, body) in bodies {
        let (s, b) = send_raw(&app, method, &path, &body.to_string()).await;
        assert_problem(&(s, b.clone()), 422, "validation_failed");
        assert!(b["detail"].as_str().unwrap().contains("NUL"), "{path}: {b}");
    }
    for path in [
        format!("/v1/threads/{t}/observations?parentId=%00"),
        format!("/v1/threads/{t}/observations?type=PLAN%00"),
        format!("/v1/threads/{t}/events?parentId=a%00"),
        "/v1/threads?cursor=%00".to_owned(),
        format!("/v1/threads/{t}/runs?cursor=00"),
    ] {
        let (s, b) = app.get(&path).await;
        assert_problem(&(s, b), 422, "validation_failed");
    }
    // Nothing changed: the suspension still waits, the thread and its log are intact.
    let (s, susp) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(
        (s, susp["status"].as_str()),
        (200, Some("pending")),
        "{susp}"
    );
    let (_, thread) = app.get(&format!("/v1/threads/{t}")).await;
    assert_eq!(thread["metadata"], json!({"k": "v"}));
    assert_eq!(app.observations(&t).await, before);
    app.stop().await;
}
both_stores!(nul, nul_characters_are_refused_alike_and_nothing_is_lost);

async fn forged_cursors_and_out_of_range_numbers_are_422(backend: Backend) {
    let app = spawn(backend, None).await;
    let (t, _) = seed(&app).await;
    // A multibyte cursor once panicked the handler (byte-index slicing); a hex cursor whose id is
    // not a UUID once answered 500.
    let not_a_uuid: String = "1700000000000000:nope"
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    for path in [
        "/v1/threads?cursor=%F0%9F%98%80".to_owned(),
        "/v1/threads?cursor=%C3%A91".to_owned(),
        format!("/v1/threads/{t}/runs?cursor=%F0%9F%98%80"),
        format!("/v1/threads/{t}/messages?cursor=%F0%9F%98%80"),
        format!("/v1/threads/{t}/runs?cursor={not_a_uuid}"),
        format!("/v1/threads/{t}/messages?cursor={not_a_uuid}"),
        "/v1/threads?limit=201".to_owned(),
        "/v1/threads?limit=-1".to_owned(),
        "/v1/threads?limit=99999999999".to_owned(),
        format!("/v1/threads/{t}/observations?after=-1"),
        format!("/v1/threads/{t}/observations?after=99999999999999999999"),
        format!("/v1/threads/{t}/observations?limit=1001"),
    ] {
        let (s, b) = app.get(&path).await;
        assert_problem(&(s, b), 422, "validation_failed");
    }
    // A suspension TTL of 1e13 s was accepted, then panicked the worker on the date overflow for
    // ever; every number a client gives has a documented range.
    for config in [
        json!({"suspensionTtlSeconds": 10_000_000_000_000_u64}),
        json!({"suspensionTtlSeconds": 31_536_001}),
        json!({"suspensionTtlSeconds": -1}),
        json!({"maxIterations": 51}),
        json!({"maxItems": 0}),
    ] {
        let (s, b) = app.post("/v1/threads", json!({"config": config})).await;
        assert_problem(&(s, b), 422, "validation_failed");
        let (s, b) = app
            .post(
                &format!("/v1/threads/{t}/runs"),
                json!({"query": "1+1", "config": config}),
            )
            .await;
        assert_problem(&(s, b), 422, "validation_failed");
        let (s, b) = send_raw(
            &app,
            "PATCH",
            &format!("/v1/threads/{t}"),
            &json!({"config": config}).to_string(),
        )
        .await;
        assert_problem(&(s, b), 422, "validation_failed");
    }
    // The longest TTL allowed works end to end.
    let u = app
        .thread(json!({"config": {"requireApproval": ["calculator"], "suspensionTtlSeconds": 31_536_000}}))
        .await;
    let run = app.run_wait(&u, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    assert!(run["suspension"]["expiresAt"].is_string(), "{run}");
    let (s, _) = app.get("/healthz").await;
    assert_eq!(s, 200);
    app.stop().await;
}
both_stores!(bounds, forged_cursors_and_out_of_range_numbers_are_422);

async fn bodies_must_be_objects_and_syntax_errors_are_400(backend: Backend) {
    let app = spawn(backend, None).await;
    let (t, sid) = seed(&app).await;
    let runs = format!("/v1/threads/{t}/runs");
    let resume = format!("/v1/suspensions/{sid}/resume");
    // Valid JSON of the wrong shape: 422 on every route that takes a body.
    for (method, path, body) in [
        ("POST", runs.as_str(), r#""hello""#),
        ("POST", runs.as_str(), r#"["hello"]"#),
        ("POST", runs.as_str(), "null"),
        ("POST", "/v1/threads", "42"),
        ("PATCH", &format!("/v1/threads/{t}"), "[]"),
        ("POST", &resume, r#"{"decision": 5}"#),
        (
            "POST",
            &resume,
            r#"{"decision": "approve", "modifiedArgs": {"expression": "9"}}"#,
        ),
        (
            "POST",
            &resume,
            r#"{"decision": "approve", "response": "x"}"#,
        ),
    ] {
        let (s, b) = send_raw(&app, method, path, body).await;
        assert_problem(&(s, b), 422, "validation_failed");
    }
    // Not JSON at all: 400 malformed_json, on every route that takes a body.
    for (method, path, body) in [
        ("POST", runs.as_str(), r#"{"query":}"#),
        ("POST", runs.as_str(), "[1,"),
        ("POST", "/v1/threads", "{"),
        ("PATCH", &format!("/v1/threads/{t}"), "{nope}"),
        ("POST", &resume, r#"{"decision": "approve""#),
    ] {
        let (s, b) = send_raw(&app, method, path, body).await;
        assert_problem(&(s, b), 400, "malformed_json");
    }
    // ifNotExists: create with an id that cannot be a thread id is a bad request body, not a
    // missing thread.
    let (s, b) = app
        .post(
            "/v1/threads/has%20space/runs",
            json!({"query": "1+1", "ifNotExists": "create"}),
        )
        .await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app
        .post("/v1/threads/has%20space/runs", json!({"query": "1+1"}))
        .await;
    assert_problem(&(s, b), 404, "thread_not_found");
    // Nothing ran: the suspension still waits for a valid decision, and approve still works.
    let (s, run) = app.post(&resume, json!({"decision": "approve"})).await;
    assert_eq!(s, 202, "{run}");
    app.stop().await;
}
both_stores!(bodies, bodies_must_be_objects_and_syntax_errors_are_400);

async fn a_malformed_last_event_id_is_400(backend: Backend) {
    let app = spawn(backend, None).await;
    let t = app.thread(json!({})).await;
    for bad in ["abc", "-1", "99999999999999999999", "1.5", ""] {
        let r = app
            .client
            .get(app.url(&format!("/v1/threads/{t}/events")))
            .header("last-event-id", bad)
            .send()
            .await
            .unwrap();
        let (s, b) = read(r).await;
        assert_problem(&(s, b), 400, "invalid_header");
    }
    app.stop().await;
}
both_stores!(last_event_id, a_malformed_last_event_id_is_400);

/// Read frames until a `THREAD_DELETED` frame, then expect the end of the stream; returns the
/// observations seen before it.
async fn until_deleted(sse: &mut SseReader, thread: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let f = sse
            .next(Duration::from_secs(20))
            .await
            .expect("the stream ended without a THREAD_DELETED frame");
        if f.comment {
            continue;
        }
        if f.event.as_deref() == Some("THREAD_DELETED") {
            assert_eq!(f.id, None, "not an observation: no id");
            let v: Value = serde_json::from_str(&f.data).unwrap();
            assert_eq!(v["threadId"], thread);
            assert!(
                sse.next(Duration::from_secs(5)).await.is_none(),
                "the stream ends after THREAD_DELETED"
            );
            return seen;
        }
        seen.push(serde_json::from_str(&f.data).unwrap());
    }
}

async fn a_stream_ends_when_its_thread_is_deleted_and_never_shows_a_new_one(backend: Backend) {
    let app = spawn(backend, None).await;
    let t = app.thread(json!({"threadId": "gone"})).await;
    app.run_wait(&t, "what is 2+3?").await;
    let count = app.observations(&t).await.len();
    let open = || async {
        SseReader::new(
            app.client
                .get(app.url(&format!("/v1/threads/{t}/events")))
                .send()
                .await
                .unwrap(),
        )
    };
    let mut sse = open().await;
    let mut replayed = Vec::new();
    while replayed.len() < count {
        let f = sse.next(Duration::from_secs(10)).await.unwrap();
        if !f.comment {
            replayed.push(f);
        }
    }
    let (s, _) = app
        .client
        .delete(app.url(&format!("/v1/threads/{t}")))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(s, 204);
    assert!(until_deleted(&mut sse, &t).await.is_empty());
    // The same id again is another thread: a new stream shows only its own log.
    app.thread(json!({"threadId": "gone"})).await;
    app.run_wait(&t, "what is 1+1?").await;
    let fresh = app.observations(&t).await;
    assert_eq!(fresh[0]["seq"], 1);
    app.stop().await;
}
both_stores!(
    deleted_stream,
    a_stream_ends_when_its_thread_is_deleted_and_never_shows_a_new_one
);

/// Two replicas on one Postgres database: a thread deleted on one ends the streams the other
/// serves, even when it is created again at once and its new log outruns the old stream's seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_deleted_on_another_replica_ends_its_streams() {
    let url = crate::helpers::database_url(Backend::Postgres).await;
    let a = spawn_config(test_config(&url, None)).await;
    let b = spawn_config(test_config(&url, None)).await;
    let t = a.thread(json!({"threadId": "shared"})).await;
    a.run_wait(&t, "what is 2+3?").await;
    let first = a.observations(&t).await;
    let last = first.last().unwrap()["seq"].as_i64().unwrap();
    let mut sse = SseReader::new(
        b.client
            .get(b.url(&format!("/v1/threads/{t}/events?after={last}")))
            .send()
            .await
            .unwrap(),
    );
    let r = a
        .client
        .delete(a.url(&format!("/v1/threads/{t}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    // Created again and run twice, so the new thread's seq passes the old stream's position.
    a.thread(json!({"threadId": "shared"})).await;
    a.run_wait(&t, "what is 1+1?").await;
    a.run_wait(&t, "what is 2+2?").await;
    let shown = until_deleted(&mut sse, &t).await;
    assert!(shown.is_empty(), "the new thread's log leaked: {shown:?}");
    a.stop().await;
    b.stop().await;
}

/// A model that writes a NUL (in a plan, a tool call's arguments, an answer) must not wedge its
/// run on Postgres, where no `text` or `jsonb` can hold one: what a model writes is stored with
/// U+FFFD in its place, on both stores alike.
async fn a_model_that_writes_nul_characters_does_not_wedge_its_run(backend: Backend) {
    let llm = crate::fake_llm::FakeLlm::start().await;
    let app = crate::helpers::spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        crate::fake_llm::plan(&[("s1", "Compute\u{0} 2+2", &["calculator"], &[])]),
    );
    llm.push(
        "execute",
        crate::fake_llm::Reply::ToolCalls(vec![(
            "calculator".into(),
            json!({"expression": "2+2\u{0}"}),
        )]),
    );
    llm.push("execute", crate::fake_llm::Reply::Text("four\u{0}".into()));
    llm.push(
        "synthesis",
        crate::fake_llm::Reply::Json(
            json!({"response": "it is\u{0} 4", "sources": null, "suggestions": ["a\u{0}"]}),
        ),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["finalResponse"]["response"], "it is\u{FFFD} 4");
    assert_eq!(run["finalResponse"]["sources"], json!([]), "null is empty");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(state["todoList"][0]["description"], "Compute\u{FFFD} 2+2");
    assert_eq!(state["todoList"][0]["result"], "four\u{FFFD}");
    let obs = app.observations(&t).await;
    let exec = obs.iter().find(|o| o["type"] == "TOOL_EXECUTION").unwrap();
    assert_eq!(exec["content"]["status"], "error", "{exec}");
    assert!(!exec.to_string().contains("\\u0000"), "{exec}");
    app.stop().await;
}
both_stores!(
    model_nul,
    a_model_that_writes_nul_characters_does_not_wedge_its_run
);
