//! Which models a tenant may name (`PES_ALLOWED_MODELS`: by default the configured model and
//! the priced ones), and no dollar limit over a model without a price (`model_unpriced`), so a
//! tenant can neither spend the operator's key on any model it likes nor escape a dollar cap.

use serde_json::json;

use crate::both_stores;
use crate::helpers::{Backend, spawn_with};

/// The probe: prices for `offline` only and a `*` tenant budget of $0.01 that fails. A default
/// run fails `budget_exceeded`; naming a model nobody priced is refused, on a run, a thread and
/// an assistant.
async fn an_unpriced_model_escapes_no_dollar_cap(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.allowed_models = None;
        c.model_prices = Some(r#"{"offline": {"input": 1000, "output": 1000}}"#.into());
        c.tenant_budgets = Some(r#"{"*": {"maxCostUsd": 0.01, "onExceed": "fail"}}"#.into());
    })
    .await;
    let (s, run) = app
        .post(
            "/v1/threads/m1/runs/wait",
            json!({"query": "What is 6*7?", "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "budget_exceeded", "{run}");

    let (s, p) = app
        .post(
            "/v1/threads/m2/runs/wait",
            json!({"query": "What is 6*7?", "ifNotExists": "create",
                   "config": {"model": "some-unpriced-model"}}),
        )
        .await;
    assert_eq!(s, 422, "{p}");
    assert_eq!(p["code"], "model_not_allowed", "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("some-unpriced-model") && detail.contains("PES_ALLOWED_MODELS"),
        "{detail}"
    );
    let (_, threads) = app.get("/v1/threads").await;
    assert!(
        threads["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["threadId"] != "m2"),
        "nothing was made: {threads}"
    );
    let (s, p) = app
        .post(
            "/v1/threads",
            json!({"config": {"model": "some-unpriced-model"}}),
        )
        .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("model_not_allowed")),
        "{p}"
    );
    let (s, p) = app
        .post(
            "/v1/assistants",
            json!({"assistantId": "a", "name": "A", "config": {"model": "gpt-anything"}}),
        )
        .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("model_not_allowed")),
        "{p}"
    );
    // The priced model is allowed by name.
    let (s, p) = app
        .post("/v1/threads", json!({"config": {"model": "offline"}}))
        .await;
    assert_eq!(s, 201, "{p}");
    app.stop().await;
}
both_stores!(unpriced_escape, an_unpriced_model_escapes_no_dollar_cap);

/// An operator who allows a model it did not price: runs on it go on without a dollar limit,
/// and are refused at enqueue (`model_unpriced`) under any dollar limit, the run's, the
/// thread's or the tenant's.
async fn a_dollar_limit_over_an_unpriced_model_is_refused_at_enqueue(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.allowed_models = Some("offline, unpriced-one".into());
        c.model_prices = Some(r#"{"offline": {"input": 1, "output": 1}}"#.into());
        c.api_keys = Some("ka:acme,kb:bank".into());
        c.tenant_budgets = Some(r#"{"bank": {"maxCostUsd": 100}}"#.into());
    })
    .await;
    let post = |key: &'static str, path: String, body: serde_json::Value| {
        let app = &app;
        async move {
            let r = app
                .client
                .post(app.url(&path))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            crate::helpers::read(r).await
        }
    };
    // No dollar limit: the unpriced model runs.
    let (s, run) = post(
        "ka",
        "/v1/threads/u1/runs/wait".into(),
        json!({"query": "What is 1+1?", "ifNotExists": "create",
               "config": {"model": "unpriced-one"}}),
    )
    .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    // The run's own dollar limit.
    let (s, p) = post(
        "ka",
        "/v1/threads/u1/runs".into(),
        json!({"query": "again", "config": {"model": "unpriced-one",
               "budget": {"maxCostUsd": 1}}}),
    )
    .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("model_unpriced")),
        "{p}"
    );
    // The thread's: its model and its limit, the run naming neither.
    let (s, t) = post(
        "ka",
        "/v1/threads".into(),
        json!({"threadId": "u2", "config": {"model": "unpriced-one",
               "budget": {"maxCostUsd": 1}}}),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    let (s, p) = post("ka", "/v1/threads/u2/runs".into(), json!({"query": "hi"})).await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("model_unpriced")),
        "{p}"
    );
    // The tenant's daily budget: bank may not use the unpriced model at all, acme may.
    let (s, p) = post(
        "kb",
        "/v1/threads/u3/runs".into(),
        json!({"query": "hi", "ifNotExists": "create", "config": {"model": "unpriced-one"}}),
    )
    .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("model_unpriced")),
        "{p}"
    );
    assert!(
        p["detail"].as_str().unwrap().contains("daily budget"),
        "{p}"
    );
    let (s, run) = post(
        "kb",
        "/v1/threads/u3/runs/wait".into(),
        json!({"query": "What is 1+1?", "ifNotExists": "create"}),
    )
    .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(
        run["status"], "completed",
        "the priced default model runs: {run}"
    );
    app.stop().await;
}
both_stores!(
    unpriced_refused,
    a_dollar_limit_over_an_unpriced_model_is_refused_at_enqueue
);
