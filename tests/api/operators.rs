//! Operators and tenants: a tenant's daily budget is the operator's to raise, never the tenant's.
//! An operator key (`PES_OPERATOR_KEYS`) acts on `/v1/admin/*` only (a tenant's spend, raising
//! its day, deciding a suspension on it) and is refused on the tenant routes; a tenant key is
//! refused on `/v1/admin/*`, and may reject a suspension on its day but never approve it,
//! whatever the door (REST, AG-UI, MCP). Raises are bounded and finite (422 `invalid_raise`).
//! The fake model reports 1,500 tokens a call; an unscripted run makes five calls (7,500).

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::{
    Backend, TestApp, assert_problem, completed_or_failed, database_url, metered_llm, read,
    settled, spawn_config, test_config,
};
use crate::mcp_server::{message, raw};

const KEYS: &str = "kc:tenantC,kd:tenantD";
const OPERATOR: &str = "op-key";
/// The probe's budget: a day so small that a tenant's first model call is past it.
const BUDGETS: &str = r#"{"tenantC": {"maxTokens": 50}, "tenantD": {"maxTokens": 50}}"#;

fn config(url: &str, llm: &FakeLlm) -> pes_server::config::Config {
    let mut c = test_config(url, Some(llm));
    c.api_keys = Some(KEYS.into());
    c.operator_keys = Some(OPERATOR.into());
    c.tenant_budgets = Some(BUDGETS.into());
    c
}

async fn post_raw(app: &TestApp, key: Option<&str>, path: &str, body: String) -> (u16, Value) {
    let mut req = app
        .client
        .post(app.url(path))
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    read(req.send().await.unwrap()).await
}

/// A run of `key`'s tenant on `thread`, waited for until it ends or suspends.
async fn run_as(app: &TestApp, key: &str, thread: &str, body: Value) -> Value {
    let mut body = body;
    body["ifNotExists"] = json!("create");
    let (s, run) = app
        .post_as(key, &format!("/v1/threads/{thread}/runs/wait"), body)
        .await;
    assert_eq!(s, 200, "{run}");
    run
}

/// A run that stops at once on its tenant's day: its suspension id.
async fn stopped_on_the_day(app: &TestApp, key: &str, thread: &str) -> (String, String) {
    let run = run_as(app, key, thread, json!({"query": "what is 2+2?"})).await;
    assert_eq!(run["status"], "suspended", "{run}");
    let s = &run["suspension"];
    assert_eq!(
        (
            s["kind"].as_str(),
            s["toolCall"]["arguments"]["scope"].as_str()
        ),
        (Some("budget"), Some("tenant")),
        "{s}"
    );
    (
        run["runId"].as_str().unwrap().to_owned(),
        s["suspensionId"].as_str().unwrap().to_owned(),
    )
}

async fn run_status(app: &TestApp, key: &str, thread: &str, run_id: &str) -> Value {
    let (_, run) = app
        .get_as(key, &format!("/v1/threads/{thread}/runs/{run_id}"))
        .await;
    run["status"].clone()
}

/// The probe: tenant C, stopped on its day, approved its own raise of 2^64-1 tokens (and 1e15 /
/// 1e300) and its run completed. Now no door lets a tenant approve it, and the operator's
/// approval raises the day, in the store, for every run of the tenant stopped on it.
async fn a_tenant_cannot_lift_its_own_day_and_the_operator_can(backend: Backend) {
    let llm = metered_llm().await;
    let url = database_url(backend).await;
    let app = spawn_config(config(&url, &llm)).await;
    let (rid_b, sid_b) = stopped_on_the_day(&app, "kc", "t1").await;
    let resume = format!("/v1/suspensions/{sid_b}/resume");
    for raise in [
        json!({"tokens": 18446744073709551615u64}),
        json!({"tokens": 1e15, "usd": 1e300}),
        json!({"tokens": 100}),
    ] {
        let got = app
            .post_as(
                "kc",
                &resume,
                json!({"decision": "approve", "raiseBy": raise}),
            )
            .await;
        assert_problem(&got, 403, "operator_only");
    }
    // The AG-UI door: a resume entry that approves.
    let agui = json!({"threadId": "t1", "messages": [], "resume": [{"interruptId": sid_b,
        "status": "resolved", "payload": {"decision": "approve", "raiseBy": {"tokens": 100}}}]});
    let got = app.post_as("kc", "/v1/ag-ui", agui).await;
    assert_problem(&got, 403, "operator_only");
    // The MCP door: the `resume` tool.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "resume", "arguments": {"suspensionId": sid_b, "decision": "approve"}}});
    let (_, _, body) = raw(
        &app,
        &call,
        &[
            ("mcp-protocol-version", "2025-06-18"),
            ("authorization", "Bearer kc"),
        ],
    )
    .await;
    let error = &message(&body)["error"];
    assert_eq!(error["data"]["code"], "operator_only", "{body}");
    assert_eq!(run_status(&app, "kc", "t1", &rid_b).await, "suspended");

    // A second run of the tenant stops on the same day.
    let (rid_c, sid_c) = stopped_on_the_day(&app, "kc", "t2").await;
    let (s, day) = app
        .get_as(OPERATOR, "/v1/admin/tenants/tenantC/spend")
        .await;
    assert_eq!(s, 200, "{day}");
    assert_eq!(day["tenant"], "tenantC");
    assert_eq!(day["spentTokens"], 0, "{day}");
    assert_eq!(day["budget"]["maxTokens"], 50, "{day}");
    assert_eq!(day["budgetEntry"], "tenantC", "{day}");
    assert_eq!(day["limitTokens"], 50, "{day}");
    assert_eq!(day["raises"], json!([]), "{day}");

    // The operator approves one: the day is raised, and both runs go on.
    let (s, run) = app
        .post_as(
            OPERATOR,
            &format!("/v1/admin/suspensions/{sid_b}/resume"),
            json!({"decision": "approve", "raiseBy": {"tokens": 100000}, "reason": "month end"}),
        )
        .await;
    assert_eq!(s, 202, "{run}");
    assert_eq!(run["runId"], rid_b.as_str());
    let b = app
        .wait_run_as("kc", "t1", &rid_b, completed_or_failed)
        .await;
    assert_eq!(b["status"], "completed", "{b}");
    let c = app
        .wait_run_as("kc", "t2", &rid_c, completed_or_failed)
        .await;
    assert_eq!(c["status"], "completed", "{c}");
    let (_, one) = app.get_as("kc", &format!("/v1/suspensions/{sid_c}")).await;
    assert_eq!(one["decision"], "approve", "{one}");
    // Deciding again is a conflict.
    let got = app
        .post_as(
            OPERATOR,
            &format!("/v1/admin/suspensions/{sid_b}/resume"),
            json!({"decision": "approve", "raiseBy": {"tokens": 100000}}),
        )
        .await;
    assert_eq!(got.0, 409, "{}", got.1);
    let (_, day) = app
        .get_as(OPERATOR, "/v1/admin/tenants/tenantC/spend")
        .await;
    assert_eq!(day["raisedTokens"], 100000, "{day}");
    assert_eq!(day["limitTokens"], 100050, "{day}");
    assert_eq!(day["spentTokens"], 15000, "{day}");
    let raises = day["raises"].as_array().unwrap();
    assert_eq!(raises.len(), 1, "the raise was made once: {day}");
    assert_eq!(raises[0]["tokens"], 100000);
    assert_eq!(raises[0]["suspensionId"], sid_b.as_str());

    // Tenant D may reject a suspension on its day: the run fails.
    let (rid, sid) = stopped_on_the_day(&app, "kd", "t1").await;
    let (s, p) = app
        .post_as(
            "kd",
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "reject"}),
        )
        .await;
    assert_eq!(s, 202, "{p}");
    let failed = app.wait_run_as("kd", "t1", &rid, completed_or_failed).await;
    assert_eq!(failed["error"]["code"], "budget_exceeded", "{failed}");

    // The operator raises tenant D's day directly: its stopped run goes on.
    let (rid, _) = stopped_on_the_day(&app, "kd", "t2").await;
    let raises = "/v1/admin/tenants/tenantD/budget-raises";
    for bad in [
        json!({"tokens": 18446744073709551615u64}),
        json!({"tokens": 1e15, "usd": 1e300}),
        json!({"tokens": 10_000_001}),
        json!({"usd": 1000.5}),
        json!({"tokens": -1}),
        json!({"usd": 0}),
        json!({"tokens": 2.5}),
        json!({}),
    ] {
        let got = app.post_as(OPERATOR, raises, bad.clone()).await;
        assert_problem(&got, 422, "invalid_raise");
    }
    for bad in [
        r#"{"usd": NaN}"#,
        r#"{"tokens": Infinity}"#,
        r#"{"usd": 1e999}"#,
    ] {
        let got = post_raw(&app, Some(OPERATOR), raises, bad.into()).await;
        assert_problem(&got, 422, "invalid_raise");
    }
    let got = app
        .post_as(
            OPERATOR,
            "/v1/admin/tenants/nobody/budget-raises",
            json!({"tokens": 5}),
        )
        .await;
    assert_problem(&got, 404, "tenant_not_found");
    assert_eq!(run_status(&app, "kd", "t2", &rid).await, "suspended");
    let (s, made) = app
        .post_as(OPERATOR, raises, json!({"tokens": 100000}))
        .await;
    assert_eq!(s, 201, "{made}");
    assert_eq!(made["raise"]["tokens"], 100000, "{made}");
    let resumed: Vec<&str> = made["resumed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(resumed, [rid.as_str()], "{made}");
    assert_eq!(made["spend"]["limitTokens"], 100050, "{made}");
    let done = app.wait_run_as("kd", "t2", &rid, completed_or_failed).await;
    assert_eq!(done["status"], "completed", "{done}");
    // Tenant C's day is its own: D's raise is not C's.
    let (_, day) = app
        .get_as(OPERATOR, "/v1/admin/tenants/tenantC/spend")
        .await;
    assert_eq!(day["raisedTokens"], 100000, "{day}");
    app.stop().await;
}
both_stores!(
    operator_raises,
    a_tenant_cannot_lift_its_own_day_and_the_operator_can
);

/// An operator key acts on `/v1/admin/*` only, a tenant key never there; without operator keys
/// nobody is the operator, except on a service without any key, whose one person is both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_act_only_where_they_belong() {
    let llm = metered_llm().await;
    let url = database_url(Backend::Sqlite).await;
    let app = spawn_config(config(&url, &llm)).await;
    let spend = "/v1/admin/tenants/tenantC/spend";
    let got = app.get_as(OPERATOR, "/v1/threads").await;
    assert_problem(&got, 401, "unauthorized");
    let got = app.post_as(OPERATOR, "/v1/threads", json!({})).await;
    assert_problem(&got, 401, "unauthorized");
    assert!(
        got.1["detail"].as_str().unwrap().contains("/v1/admin"),
        "{}",
        got.1
    );
    assert_problem(&app.get_as("kc", spend).await, 403, "operator_only");
    let got = app
        .post_as(
            "kc",
            "/v1/admin/tenants/tenantC/budget-raises",
            json!({"tokens": 5}),
        )
        .await;
    assert_problem(&got, 403, "operator_only");
    assert_problem(&app.get(spend).await, 401, "unauthorized");
    assert_problem(&app.get_as("nope", spend).await, 401, "unauthorized");
    assert_eq!(app.get_as(OPERATOR, spend).await.0, 200);
    let (s, t) = app.get_as("kc", "/v1/threads").await;
    assert_eq!(s, 200, "{t}");
    app.stop().await;

    // Tenant keys and no operator key: nobody is the operator.
    let mut c = config(&database_url(Backend::Sqlite).await, &llm);
    c.operator_keys = None;
    let app = spawn_config(c).await;
    assert_problem(&app.get_as("kc", spend).await, 403, "operator_only");
    assert_problem(&app.get(spend).await, 403, "operator_only");
    app.stop().await;

    // No keys at all: the local person is the operator (of the one tenant there is).
    let app = spawn_config(test_config(
        &database_url(Backend::Sqlite).await,
        Some(&llm),
    ))
    .await;
    let (s, day) = app.get("/v1/admin/tenants/default/spend").await;
    assert_eq!(s, 200, "{day}");
    assert_eq!(day["tenant"], "default");
    assert_problem(&app.get(spend).await, 404, "tenant_not_found");
    app.stop().await;

    // A key that is both the operator's and a tenant's stops the start.
    let mut c = config(&database_url(Backend::Sqlite).await, &llm);
    c.operator_keys = Some("op-key, kd".into());
    let Err(e) = pes_server::App::build(c).await else {
        panic!("a key in both lists was taken");
    };
    let msg = format!("{e:#}");
    assert!(
        msg.contains("PES_OPERATOR_KEYS") && !msg.contains("kd"),
        "{msg}"
    );
}

/// A run-scope raise is a finite number within `PES_MAX_BUDGET_RAISE_*`: the probe's 2^64-1
/// tokens, 1e15 tokens with $1e300, NaN and the negative are 422 `invalid_raise`, and the run
/// stays suspended; a raise within the bounds goes on.
async fn run_raises_are_bounded_and_finite(backend: Backend) {
    let llm = metered_llm().await;
    let url = database_url(backend).await;
    let mut c = test_config(&url, Some(&llm));
    c.max_budget_raise_tokens = 200_000;
    c.max_budget_raise_usd = 10.0;
    let app = spawn_config(c).await;
    let (s, run) = app
        .post(
            "/v1/threads/t1/runs/wait",
            json!({"query": "what is 2+2?", "ifNotExists": "create",
                   "config": {"budget": {"maxTokens": 2000}}}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(run["suspension"]["toolCall"]["arguments"]["scope"], "run");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let rid = run["runId"].as_str().unwrap();
    let resume = format!("/v1/suspensions/{sid}/resume");
    for raise in [
        json!({"tokens": 18446744073709551615u64}),
        json!({"tokens": 1e15, "usd": 1e300}),
        json!({"tokens": 200_001}),
        json!({"usd": 10.01}),
        json!({"tokens": -5}),
        json!({"usd": -1}),
        json!({"tokens": 1.5}),
        json!({"tokens": "100"}),
        json!({}),
    ] {
        let got = app
            .post(&resume, json!({"decision": "approve", "raiseBy": raise}))
            .await;
        assert_problem(&got, 422, "invalid_raise");
    }
    let got = app.post(&resume, json!({"decision": "approve"})).await;
    assert_problem(&got, 422, "invalid_raise");
    for body in [
        r#"{"decision": "approve", "raiseBy": {"usd": NaN}}"#,
        r#"{"decision": "approve", "raiseBy": {"tokens": -Infinity}}"#,
    ] {
        let got = post_raw(&app, None, &resume, body.into()).await;
        assert_problem(&got, 422, "invalid_raise");
    }
    assert_eq!(run_status(&app, "x", "t1", rid).await, "suspended");
    let (s, p) = app
        .post(
            &resume,
            json!({"decision": "approve", "raiseBy": {"tokens": 200_000, "usd": 10}}),
        )
        .await;
    assert_eq!(s, 202, "{p}");
    let done = app
        .wait_run("t1", rid, |r| {
            r["status"] == "completed" || r["status"] == "failed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    app.stop().await;
}
both_stores!(bounded_raises, run_raises_are_bounded_and_finite);

/// Two replicas on one Postgres: the operator raises a tenant's day through replica A (which
/// drives no runs); replica B, whose gauge read the day before the raise, drives the resumed run
/// to its end and a new run of the tenant too: B read the raise from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_raise_is_seen_by_every_replica() {
    let llm = metered_llm().await;
    let url = database_url(Backend::Postgres).await;
    let mut on_a = config(&url, &llm);
    on_a.worker_concurrency = 0;
    let a = spawn_config(on_a).await;
    let b = spawn_config(config(&url, &llm)).await;
    let (rid, _) = stopped_on_the_day(&b, "kc", "t1").await;
    let (s, made) = a
        .post_as(
            OPERATOR,
            "/v1/admin/tenants/tenantC/budget-raises",
            json!({"tokens": 10000}),
        )
        .await;
    assert_eq!(s, 201, "{made}");
    assert_eq!(made["resumed"][0]["runId"], rid.as_str(), "{made}");
    let done = b.wait_run_as("kc", "t1", &rid, completed_or_failed).await;
    assert_eq!(done["status"], "completed", "{done}");
    // A new run on B fits the raised day too (7,500 spent of 10,050).
    let (s, p) = b
        .post_as(
            "kc",
            "/v1/threads/t2/runs",
            json!({"query": "2+2?", "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 202, "{p}");
    let rid = p["runId"].as_str().unwrap();
    let second = b.wait_run_as("kc", "t2", rid, settled).await;
    // It stops at the raised limit (10,050; one call's misestimate past it at most), not at
    // the configured 50: its plan ran.
    assert_eq!(second["status"], "suspended", "{second}");
    let spent = second["usage"]["totalTokens"].as_u64().unwrap();
    assert!((1500..=3000).contains(&spent), "{second}");
    let (_, day) = b.get_as(OPERATOR, "/v1/admin/tenants/tenantC/spend").await;
    assert_eq!(day["limitTokens"], 10050, "{day}");
    b.stop().await;
    a.stop().await;
}
