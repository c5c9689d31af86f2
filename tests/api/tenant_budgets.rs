//! Per-tenant daily budgets (`PES_TENANT_BUDGETS`): a tenant over what it may spend today is
//! stopped at its next model call (suspend or fail), other tenants are not; the day's spend is the
//! store's, so it survives a restart and two replicas share it. The fake model reports 1,500
//! tokens a call, and an unscripted run makes five calls (7,500 tokens): with a daily limit of
//! 9,000 a tenant's first run completes and its second stops after its plan (9,000 spent).

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, phase_of, plan};
use crate::helpers::{
    Backend, TestApp, completed_or_failed, database_url, metered_llm, spawn_config, test_config,
    total_tokens,
};

const CALL: u64 = 1500;
const KEYS: &str = "ka:acme,kb:globex,kc:initech";
const BUDGETS: &str =
    r#"{"*": {"maxTokens": 9000}, "initech": {"maxTokens": 9000, "onExceed": "fail"}}"#;

fn config(url: &str, llm: &FakeLlm) -> pes_server::config::Config {
    let mut c = test_config(url, Some(llm));
    c.api_keys = Some(KEYS.into());
    c.tenant_budgets = Some(BUDGETS.into());
    c.operator_keys = Some("op".into());
    c
}

/// A run of `key`'s tenant on thread `thread`, waited for until it ends or suspends.
async fn run_as(app: &TestApp, key: &str, thread: &str, query: &str) -> Value {
    let (s, run) = app
        .post_as(
            key,
            &format!("/v1/threads/{thread}/runs/wait"),
            json!({"query": query, "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    run
}

/// The thread's `BUDGET` observations, as `key`'s tenant reads them.
async fn budget_obs(app: &TestApp, key: &str, thread: &str) -> Vec<Value> {
    let (s, page) = app
        .get_as(
            key,
            &format!("/v1/threads/{thread}/observations?limit=1000"),
        )
        .await;
    assert_eq!(s, 200, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "BUDGET")
        .cloned()
        .collect()
}

/// The tenant's second run stops at its limit with a `budget` suspension that names the tenant.
async fn assert_stopped_by_the_tenant(app: &TestApp, key: &str, thread: &str, run: &Value) {
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(total_tokens(run), CALL, "only its plan fitted: {run}");
    let s = &run["suspension"];
    assert_eq!(s["kind"], "budget", "{s}");
    assert_eq!(s["toolCall"]["arguments"]["scope"], "tenant", "{s}");
    assert!(
        s["question"]
            .as_str()
            .unwrap()
            .contains("tenant's daily budget"),
        "{s}"
    );
    let b = budget_obs(app, key, thread).await;
    let last = b.last().expect("a BUDGET observation at the limit");
    assert_eq!(last["content"]["state"], "exceeded", "{last}");
    assert_eq!(last["content"]["scope"], "tenant", "{last}");
    assert_eq!(last["content"]["spentTokens"], 9000, "{last}");
    assert_eq!(last["content"]["limitTokens"], 9000, "{last}");
    assert_eq!(last["parentId"], Value::Null);
}

async fn a_tenant_over_its_day_is_stopped_and_others_are_not(backend: Backend) {
    let llm = metered_llm().await;
    let url = database_url(backend).await;
    let app = spawn_config(config(&url, &llm)).await;

    // acme: the first run fits (with the 80 % warning of the tenant's day), the second stops.
    let first = run_as(&app, "ka", "t1", "what is 2+2?").await;
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(total_tokens(&first), 5 * CALL);
    let warned = budget_obs(&app, "ka", "t1").await;
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0]["content"]["state"], "warning");
    assert_eq!(warned[0]["content"]["scope"], "tenant");
    let second = run_as(&app, "ka", "t2", "what is 3+3?").await;
    assert_stopped_by_the_tenant(&app, "ka", "t2", &second).await;
    let calls = llm.calls();

    // A new run of a tenant already over its day starts and stops at its first model call.
    let third = run_as(&app, "ka", "t3", "what is 4+4?").await;
    assert_eq!(third["status"], "suspended", "{third}");
    assert_eq!(total_tokens(&third), 0, "{third}");
    assert_eq!(llm.calls(), calls, "no model call past the tenant's limit");
    assert_eq!(
        third["suspension"]["toolCall"]["arguments"]["scope"],
        "tenant"
    );

    // globex spends from its own day: acme's spend is not its.
    let other = run_as(&app, "kb", "t1", "what is 2+2?").await;
    assert_eq!(other["status"], "completed", "{other}");

    // The tenant cannot raise its own day; the operator's raise lets both stopped runs go on.
    let sid = second["suspension"]["suspensionId"].as_str().unwrap();
    let (code, p) = app
        .post_as(
            "ka",
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve", "raiseBy": {"tokens": 100000}}),
        )
        .await;
    assert_eq!(
        (code, p["code"].as_str()),
        (403, Some("operator_only")),
        "{p}"
    );
    let (code, p) = app
        .post_as(
            "op",
            &format!("/v1/admin/suspensions/{sid}/resume"),
            json!({"decision": "approve", "raiseBy": {"tokens": 100000}}),
        )
        .await;
    assert_eq!(code, 202, "{p}");
    let rid = second["runId"].as_str().unwrap();
    let done = app.wait_run_as("ka", "t2", rid, completed_or_failed).await;
    assert_eq!(done["status"], "completed", "{done}");
    let rid3 = third["runId"].as_str().unwrap();
    let done = app.wait_run_as("ka", "t3", rid3, completed_or_failed).await;
    assert_eq!(done["status"], "completed", "{done}");

    // initech's day fails its run instead.
    let first = run_as(&app, "kc", "t1", "what is 2+2?").await;
    assert_eq!(first["status"], "completed", "{first}");
    let failed = run_as(&app, "kc", "t2", "what is 3+3?").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "budget_exceeded", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tenant's daily budget"),
        "{failed}"
    );
    assert_eq!(total_tokens(&failed), CALL);
    let b = budget_obs(&app, "kc", "t2").await;
    assert_eq!(b.last().unwrap()["content"]["scope"], "tenant");
    app.stop().await;
}
both_stores!(stopped, a_tenant_over_its_day_is_stopped_and_others_are_not);

async fn the_days_spend_survives_a_restart(backend: Backend) {
    let llm = metered_llm().await;
    let url = database_url(backend).await;
    let app = spawn_config(config(&url, &llm)).await;
    let first = run_as(&app, "ka", "t1", "what is 2+2?").await;
    assert_eq!(first["status"], "completed", "{first}");
    app.stop().await;

    // A new process knows nothing in memory: the store says what acme spent today.
    let app = spawn_config(config(&url, &llm)).await;
    let second = run_as(&app, "ka", "t2", "what is 3+3?").await;
    assert_stopped_by_the_tenant(&app, "ka", "t2", &second).await;
    app.stop().await;
}
both_stores!(restart, the_days_spend_survives_a_restart);

/// Two runs of one tenant, four parallel items each, at once: their calls share the tenant's day
/// as one run's items share its budget, so together they never pass the limit (without the
/// shared holds each run would count only its own calls in flight: 15,000 tokens).
async fn parallel_runs_share_the_tenants_day(backend: Backend) {
    let llm = metered_llm().await;
    let four = || {
        plan(&[
            ("a", "think a", &[], &[]),
            ("b", "think b", &[], &[]),
            ("c", "think c", &[], &[]),
            ("d", "think d", &[], &[]),
        ])
    };
    llm.push("plan", four());
    llm.push("plan", four());
    for id in ["a", "b", "c", "d"] {
        llm.set_item_default(id, Reply::Text(format!("answer {id}")));
    }
    // Every item's call waits until what was admitted is in flight.
    llm.hold_if(|r| phase_of(r) == "execute");
    let url = database_url(backend).await;
    let app = spawn_config(config(&url, &llm)).await;
    let mut runs = Vec::new();
    for t in ["p1", "p2"] {
        let (s, run) = app.post_as(
            "ka",
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "think", "ifNotExists": "create", "config": {"maxParallelItems": 4}}),
        )
        .await;
        assert_eq!(s, 202, "{run}");
        runs.push((t, run["runId"].as_str().unwrap().to_owned()));
    }
    // Two plans and eight items want 15,000: once the calls that fit are in flight, the next is
    // refused (a `BUDGET` at the limit), then the held calls answer.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut refused = false;
        for (t, _) in &runs {
            refused |= budget_obs(&app, "ka", t)
                .await
                .iter()
                .any(|o| o["content"]["state"] == "exceeded");
        }
        if refused {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call was refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    llm.release();
    let mut spent = 0;
    for (t, rid) in &runs {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let run = loop {
            let (_, run) = app
                .get_as("ka", &format!("/v1/threads/{t}/runs/{rid}"))
                .await;
            if run["status"] != "running" && run["status"] != "queued" {
                break run;
            }
            assert!(tokio::time::Instant::now() < deadline, "{run}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!(run["status"], "suspended", "{run}");
        spent += total_tokens(&run);
    }
    // At most one call's misestimate past the limit (a plan's prompt is counted before its
    // reply says what it cost).
    assert!(spent <= 9000 + CALL, "the tenant spent {spent} of 9,000");
    assert_eq!(llm.calls() * CALL, spent);
    app.stop().await;
}
both_stores!(parallel, parallel_runs_share_the_tenants_day);

/// Two replicas on one Postgres: replica A spends most of acme's day, then (A's one worker slot
/// held by another tenant's run) replica B, which never ran anything of acme's, drives acme's
/// next run and stops it at the limit: B read A's spend from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_tenants_day() {
    let llm = metered_llm().await;
    llm.hold_if(|r| r.to_string().contains("HOLD-ME"));
    let url = database_url(Backend::Postgres).await;
    let mut on_a = config(&url, &llm);
    on_a.worker_concurrency = 1;
    let a = spawn_config(on_a).await;
    let first = run_as(&a, "ka", "t1", "what is 2+2?").await;
    assert_eq!(first["status"], "completed", "{first}");
    // A's only slot: a globex run whose model call is held.
    let (s, held) = a
        .post_as(
            "kb",
            "/v1/threads/held/runs",
            json!({"query": "HOLD-ME please", "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 202, "{held}");
    llm.wait_for_request(|r| r.to_string().contains("HOLD-ME"))
        .await;

    let mut on_b = config(&url, &llm);
    on_b.worker_concurrency = 1;
    let b = spawn_config(on_b).await;
    let second = run_as(&b, "ka", "t2", "what is 3+3?").await;
    assert_stopped_by_the_tenant(&b, "ka", "t2", &second).await;

    llm.release();
    let rid = held["runId"].as_str().unwrap();
    let done = a.wait_run_as("kb", "held", rid, completed_or_failed).await;
    assert_eq!(done["status"], "completed", "{done}");
    b.stop().await;
    a.stop().await;
}

/// A `PES_TENANT_BUDGETS` that does not parse, or is out of range, stops the start and says why.
#[tokio::test]
async fn a_bad_setting_stops_the_start() {
    let url = database_url(Backend::Sqlite).await;
    for (bad, says) in [
        ("{not json", "PES_TENANT_BUDGETS is not a JSON object"),
        (r#"{"*": {"maxTokens": 0}}"#, "maxTokens must be between"),
        (r#"{"a": {"onExceed": "pause"}}"#, "PES_TENANT_BUDGETS"),
    ] {
        let mut c = test_config(&url, None);
        c.tenant_budgets = Some(bad.into());
        let Err(e) = pes_server::App::build(c).await else {
            panic!("{bad} was taken");
        };
        let msg = format!("{e:#}");
        assert!(msg.contains(says), "{bad}: {msg}");
    }
}
