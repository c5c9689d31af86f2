//! `/metrics`: a page that parses strictly as Prometheus text, whose counters move with a run
//! (runs by status, model calls and tokens, tool calls by tool, item and run durations) and whose
//! gauges show what waits (queued runs, pending suspensions, stream subscribers). Each app has
//! its own recorder, so these counts are this app's alone.

use std::time::Duration;

use serde_json::json;

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::{Backend, SseReader, TestApp, spawn};
use crate::prom::{self, Page};

/// `GET /metrics`, parsed strictly.
pub async fn scrape(app: &TestApp) -> Page {
    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    prom::parse(&r.text().await.unwrap())
}

/// Scrape until `pred` holds (the worker counts a run's end just after its last commit, which a
/// waiting client may see first), with a deadline.
pub async fn scrape_until(app: &TestApp, pred: impl Fn(&Page) -> bool) -> Page {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = scrape(app).await;
        if pred(&page) {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/metrics never showed it: {page:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_run_moves_the_counters(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let before = scrape(&app).await;
    for status in ["completed", "failed", "cancelled", "suspended", "released"] {
        assert_eq!(before.value("pes_runs_total", &[("status", status)]), 0.0);
    }
    assert_eq!(before.value("pes_leases_lost_total", &[]), 0.0);
    assert_eq!(before.types["pes_runs_total"], "counter");
    assert_eq!(before.types["pes_runs_queued"], "gauge");

    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let page = scrape_until(&app, |p| {
        p.value("pes_runs_total", &[("status", "completed")]) == 1.0
    })
    .await;

    assert_eq!(page.value("pes_runs_claimed_total", &[]), 1.0);
    assert_eq!(
        page.value("pes_run_duration_seconds_count", &[("status", "completed")]),
        1.0
    );
    let calls = llm.requests().len() as f64;
    assert!(calls >= 4.0, "plan, two items, synthesis: {calls}");
    let model = [
        ("provider", "openai"),
        ("model", "fake-model"),
        ("outcome", "ok"),
    ];
    assert_eq!(page.value("pes_model_calls_total", &model), calls);
    assert_eq!(
        page.value("pes_model_call_duration_seconds_count", &model),
        calls
    );
    let tokens = |kind| {
        page.value(
            "pes_model_tokens_total",
            &[
                ("provider", "openai"),
                ("model", "fake-model"),
                ("kind", kind),
            ],
        )
    };
    // The fake model reports 10 prompt and 5 completion tokens per call.
    assert_eq!(tokens("prompt"), 10.0 * calls);
    assert_eq!(tokens("completion"), 5.0 * calls);
    let tool = [("tool", "calculator"), ("outcome", "ok")];
    assert_eq!(page.value("pes_tool_calls_total", &tool), 1.0);
    assert_eq!(
        page.value("pes_tool_call_duration_seconds_count", &tool),
        1.0
    );
    assert_eq!(page.types["pes_item_duration_seconds"], "histogram");
    assert_eq!(
        page.value(
            "pes_item_duration_seconds_count",
            &[("status", "completed")]
        ),
        2.0,
        "both items"
    );
    assert!(page.value("pes_commits_total", &[]) >= 3.0);
    assert_eq!(page.value("pes_runs_in_flight", &[]), 0.0);
    assert_eq!(page.value("pes_runs_queued", &[]), 0.0);
    assert_eq!(page.value("pes_suspensions_pending", &[]), 0.0);
    for family in [
        "pes_runs_total",
        "pes_model_calls_total",
        "pes_tool_calls_total",
    ] {
        assert!(!page.helps[family].is_empty(), "{family} is described");
    }
    // Low cardinality: no series names a thread or a run.
    let run_id = run["runId"].as_str().unwrap();
    for (_, labels) in page.samples.keys() {
        assert!(
            labels.values().all(|v| v != &t && v != run_id),
            "{labels:?}"
        );
    }
    app.stop().await;
}
both_stores!(counters, a_run_moves_the_counters);

async fn the_gauges_show_what_waits(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    // A second run of the thread waits in the queue behind the suspended one (the thread no
    // longer asks for approval: a run may not drop the thread's own).
    let r = app
        .client
        .patch(app.url(&format!("/v1/threads/{t}")))
        .json(&json!({"config": {"requireApproval": []}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (s, queued) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "and 3+3?"}),
        )
        .await;
    assert_eq!(s, 202, "{queued}");
    let events = SseReader::new(
        app.client
            .get(app.url(&format!("/v1/threads/{t}/events")))
            .send()
            .await
            .unwrap(),
    );
    let page = scrape_until(&app, |p| {
        p.value("pes_runs_total", &[("status", "suspended")]) == 1.0
            && p.value("pes_stream_subscribers", &[]) >= 1.0
    })
    .await;
    assert_eq!(page.value("pes_suspensions_pending", &[]), 1.0);
    assert_eq!(page.value("pes_runs_queued", &[]), 1.0);
    assert_eq!(page.value("pes_streamed_threads", &[]), 1.0);
    assert_eq!(page.value("pes_runs_in_flight", &[]), 0.0);

    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202);
    let page = scrape_until(&app, |p| {
        p.value("pes_runs_total", &[("status", "completed")]) == 2.0
    })
    .await;
    assert_eq!(page.value("pes_suspensions_pending", &[]), 0.0);
    assert_eq!(page.value("pes_runs_queued", &[]), 0.0);
    drop(events);
    app.stop().await;
}
both_stores!(gauges, the_gauges_show_what_waits);
