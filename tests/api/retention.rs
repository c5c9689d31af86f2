//! Retention: a thread idle past its time-to-live (its config's, its assistant's, the server's
//! default) is deleted by the sweeper and its streams end with `THREAD_DELETED`; a thread with a
//! running or suspended run is kept; two replicas on one Postgres delete each thread once. The
//! routes (`/storage`, `/threads/prune`, bad input) are in `routes`.

mod routes;

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::assert_problem;
use crate::helpers::{
    Backend, SseReader, TestApp, database_url, read, spawn_config, spawn_with, test_config,
};

/// The value of an unlabelled series on `/metrics`.
pub(super) async fn metric(app: &TestApp, name: &str) -> f64 {
    let text = app
        .client
        .get(app.url("/metrics"))
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

/// Wait until the sweeper has completed `n` more passes (each looks at every thread once).
async fn passes(app: &TestApp, n: f64) {
    let target = metric(app, "pes_retention_passes_total").await + n;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric(app, "pes_retention_passes_total").await < target {
        assert!(tokio::time::Instant::now() < deadline, "no sweeper pass");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET `path` with the default tenant, or as `key`.
async fn get(app: &TestApp, key: Option<&str>, path: &str) -> (u16, Value) {
    match key {
        Some(k) => app.get_as(k, path).await,
        None => app.get(path).await,
    }
}

/// Wait until the thread is gone (404), with a deadline.
pub(super) async fn gone(app: &TestApp, key: Option<&str>, thread: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (s, body) = get(app, key, &format!("/v1/threads/{thread}")).await;
        if s == 404 {
            return;
        }
        assert_eq!(s, 200, "{body}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "thread {thread} was never deleted: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The thread is still there.
pub(super) async fn kept(app: &TestApp, key: Option<&str>, thread: &str) {
    let (s, body) = get(app, key, &format!("/v1/threads/{thread}")).await;
    assert_eq!(s, 200, "thread {thread} should be kept: {body}");
}

/// PATCH a thread's config.
async fn set_config(app: &TestApp, thread: &str, config: Value) {
    let r = app
        .client
        .patch(app.url(&format!("/v1/threads/{thread}")))
        .json(&json!({ "config": config }))
        .send()
        .await
        .unwrap();
    let (s, body) = read(r).await;
    assert_eq!(s, 200, "{body}");
}

/// Create a thread as `key`; its id.
pub(super) async fn thread_as(app: &TestApp, key: &str, body: Value) -> String {
    let (s, t) = app.post_as(key, "/v1/threads", body).await;
    assert_eq!(s, 201, "{t}");
    t["threadId"].as_str().unwrap().to_owned()
}

/// The thread's event stream, from after `after` (as `key` when given).
pub(super) async fn stream(
    app: &TestApp,
    key: Option<&str>,
    thread: &str,
    after: i64,
) -> SseReader {
    let mut req = app
        .client
        .get(app.url(&format!("/v1/threads/{thread}/events?after={after}")));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    SseReader::new(req.send().await.unwrap())
}

/// Read a stream until its `THREAD_DELETED` frame, which must be its last; the observations
/// seen before it.
pub(super) async fn until_deleted(sse: &mut SseReader, thread: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let f = sse
            .next(Duration::from_secs(30))
            .await
            .expect("the stream ended without a THREAD_DELETED frame");
        if f.comment {
            continue;
        }
        if f.event.as_deref() == Some("THREAD_DELETED") {
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

fn last_seq(obs: &[Value]) -> i64 {
    obs.last().map_or(0, |o| o["seq"].as_i64().unwrap())
}

async fn a_thread_idle_past_its_ttl_is_deleted_and_its_stream_ends(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.retention_interval_seconds = 1).await;
    let t = app.thread(json!({"config": {"ttlSeconds": 3600}})).await;
    // No TTL anywhere (the server's default is off): kept whatever its age.
    let forever = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let mut sse = stream(&app, None, &t, last_seq(&obs)).await;
    // The stream is open: now one idle second is enough.
    set_config(&app, &t, json!({"ttlSeconds": 1})).await;
    let (_, shown) = app.get(&format!("/v1/threads/{t}")).await;
    assert_eq!(shown["config"]["ttlSeconds"], 1, "{shown}");
    let shown = until_deleted(&mut sse, &t).await;
    assert!(
        shown.is_empty(),
        "nothing new before the deletion: {shown:?}"
    );
    let (s, body) = app.get(&format!("/v1/threads/{t}")).await;
    assert_problem(&(s, body), 404, "thread_not_found");
    let (s, body) = app.get(&format!("/v1/threads/{t}/runs")).await;
    assert_problem(&(s, body), 404, "thread_not_found");
    assert_eq!(metric(&app, "pes_threads_expired_total").await, 1.0);
    passes(&app, 2.0).await;
    kept(&app, None, &forever).await;
    assert_eq!(metric(&app, "pes_threads_expired_total").await, 1.0);
    app.stop().await;
}
both_stores!(
    ttl_of_a_thread,
    a_thread_idle_past_its_ttl_is_deleted_and_its_stream_ends
);

async fn the_server_default_ttl_deletes_idle_threads_unless_they_set_their_own(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.thread_ttl_seconds = 1;
        c.retention_interval_seconds = 1;
    })
    .await;
    crate::assistants::create(
        &app,
        json!({"assistantId": "long-lived", "name": "Long", "config": {"ttlSeconds": 3600}}),
    )
    .await;
    let plain = app.thread(json!({"config": {"ttlSeconds": 3600}})).await;
    let mut sse = stream(&app, None, &plain, 0).await;
    // Its own TTL dropped: the server's default applies.
    set_config(&app, &plain, json!({})).await;
    let never = app.thread(json!({"config": {"ttlSeconds": 0}})).await;
    let hour = app.thread(json!({"config": {"ttlSeconds": 3600}})).await;
    let assisted = app.thread(json!({"assistantId": "long-lived"})).await;
    assert!(until_deleted(&mut sse, &plain).await.is_empty());
    gone(&app, None, &plain).await;
    // Two more passes, each at least a second after every thread's last activity.
    passes(&app, 2.0).await;
    for t in [&never, &hour, &assisted] {
        kept(&app, None, t).await;
    }
    app.stop().await;
}
both_stores!(
    ttl_by_default,
    the_server_default_ttl_deletes_idle_threads_unless_they_set_their_own
);

async fn an_assistants_ttl_applies_to_its_threads_and_a_locked_ttl_wins(backend: Backend) {
    let app = spawn_with(backend, None, |c| c.retention_interval_seconds = 1).await;
    crate::assistants::create(
        &app,
        json!({"assistantId": "brief", "name": "Brief", "config": {"ttlSeconds": 1}}),
    )
    .await;
    crate::assistants::create(&app, json!({"assistantId": "z", "name": "Z", "config": {}})).await;
    let short = app.thread(json!({"assistantId": "brief"})).await;
    let own = app
        .thread(json!({"assistantId": "brief", "config": {"ttlSeconds": 3600}}))
        .await;
    let follows = app
        .thread(json!({"assistantId": "z", "config": {"ttlSeconds": 3600}}))
        .await;
    let pinned = app
        .thread(json!({"assistantId": "z", "assistantVersion": 1, "config": {"ttlSeconds": 3600}}))
        .await;
    gone(&app, None, &short).await;
    // Version 2 of `z` locks a one-second TTL: the thread that follows `z` takes it, whatever it
    // set before; the one pinned to version 1 keeps its own.
    let r = app
        .client
        .put(app.url("/v1/assistants/z"))
        .json(&json!({"config": {"ttlSeconds": 1}, "locked": ["ttlSeconds"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let refused = app
        .post(
            "/v1/threads",
            json!({"assistantId": "z", "config": {"ttlSeconds": 3600}}),
        )
        .await;
    assert_problem(&refused, 422, "field_locked");
    gone(&app, None, &follows).await;
    passes(&app, 2.0).await;
    kept(&app, None, &own).await;
    kept(&app, None, &pinned).await;
    app.stop().await;
}
both_stores!(
    ttl_of_an_assistant,
    an_assistants_ttl_applies_to_its_threads_and_a_locked_ttl_wins
);

async fn a_thread_with_a_running_or_suspended_run_is_kept_past_its_ttl(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.thread_ttl_seconds = 1;
        c.retention_interval_seconds = 1;
    })
    .await;
    let waiting = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&waiting, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let suspended_run = run["runId"].as_str().unwrap().to_owned();
    llm.hold();
    let busy = app.thread(json!({})).await;
    let (s, running) = app
        .post(
            &format!("/v1/threads/{busy}/runs"),
            json!({"query": "what is 2+2?"}),
        )
        .await;
    assert_eq!(s, 202, "{running}");
    llm.wait_in_flight(1).await;
    let idle = app.thread(json!({})).await;
    gone(&app, None, &idle).await;
    // Three passes after the idle thread went: well past the TTL of the other two.
    passes(&app, 3.0).await;
    kept(&app, None, &waiting).await;
    kept(&app, None, &busy).await;
    let (_, t) = app.get(&format!("/v1/threads/{busy}")).await;
    assert_eq!(t["status"], "busy", "{t}");
    // Once their runs end, the clock starts from the end.
    llm.release();
    let run_id = running["runId"].as_str().unwrap();
    app.wait_run(&busy, run_id, |r| r["status"] == "completed")
        .await;
    let r = app
        .client
        .post(app.url(&format!(
            "/v1/threads/{waiting}/runs/{suspended_run}/cancel"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    gone(&app, None, &busy).await;
    gone(&app, None, &waiting).await;
    app.stop().await;
}
both_stores!(
    active_runs_keep_threads,
    a_thread_with_a_running_or_suspended_run_is_kept_past_its_ttl
);

/// Two replicas on one Postgres start sweeping at the same moment, in small batches, threads
/// that have all expired already (a third replica, whose sweeper would wait a day, made them and
/// streams them): both find the same threads, yet each is deleted once — the replicas'
/// counters add up to the number of threads — and every stream ends with one `THREAD_DELETED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_postgres_delete_each_expired_thread_once() {
    let url = database_url(Backend::Postgres).await;
    let replica = |interval: u64| {
        let mut c = test_config(&url, None);
        c.retention_interval_seconds = interval;
        c.retention_batch = 8;
        c
    };
    let c = spawn_config(replica(86_400)).await;
    let mut threads = Vec::new();
    for i in 0..24 {
        threads.push(
            c.thread(json!({"threadId": format!("t-{i}"), "config": {"ttlSeconds": 1}}))
                .await,
        );
    }
    let mut streams = Vec::new();
    for t in threads.iter().take(8) {
        streams.push((t.clone(), stream(&c, None, t, 0).await));
    }
    // Every thread has been idle for its second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, r) = c
            .post(
                "/v1/threads/prune",
                json!({"olderThanSeconds": 1, "dryRun": true}),
            )
            .await;
        if r["matched"] == 24 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (a, b) = tokio::join!(spawn_config(replica(1)), spawn_config(replica(1)));
    for (t, sse) in &mut streams {
        assert!(until_deleted(sse, t).await.is_empty());
    }
    for t in &threads {
        gone(&c, None, t).await;
    }
    let on_a = metric(&a, "pes_threads_expired_total").await;
    let on_b = metric(&b, "pes_threads_expired_total").await;
    assert_eq!(
        on_a + on_b,
        24.0,
        "each thread deleted once: {on_a} on A, {on_b} on B"
    );
    assert_eq!(metric(&c, "pes_threads_expired_total").await, 0.0);
    a.stop().await;
    b.stop().await;
    c.stop().await;
}
