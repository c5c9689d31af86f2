//! Budgets: a run stops before the model call that would pass its `maxTokens` or `maxCostUsd`,
//! suspends (`budget` suspension: approve with a raise, or reject) or fails, reports `BUDGET` at
//! 80 % and at the limit, prices its usage by `PES_MODEL_PRICES`, shares one budget between its
//! parallel items, and keeps its spend across a crash. The fake model reports 1,000 prompt and
//! 500 completion tokens per call here: 1,500 a call.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{Reply, plan};
use crate::helpers::{Backend, metered_llm, of_type, spawn, spawn_with, total_tokens};
use crate::process::{Proc, env_for};

/// Tokens every call of the fake model uses here.
const CALL: u64 = 1500;

/// A run's body: a question that takes five calls unscripted, under `budget`.
fn budgeted(budget: Value) -> Value {
    json!({"query": "what is 2+2?", "config": {"budget": budget}})
}

async fn suspends_at_the_limit_and_a_raise_goes_on(backend: Backend) {
    let llm = metered_llm().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    let run = app
        .run_wait_with(&t, budgeted(json!({"maxTokens": 4000})))
        .await;
    assert_eq!(run["status"], "suspended", "{run}");
    let spent = total_tokens(&run);
    // Stopped before passing the limit by more than one call, and no call after the stop.
    assert!(spent <= 4000 + CALL, "spent {spent}");
    assert!(spent >= CALL, "the plan was made: {run}");
    let calls = run["usage"]["llmCalls"].as_u64().unwrap();
    assert_eq!(
        llm.calls(),
        calls,
        "every call the model answered is counted"
    );
    assert_eq!(spent, calls * CALL);
    let s = &run["suspension"];
    assert_eq!(s["kind"], "budget", "{s}");
    assert_eq!(s["allowedDecisions"], json!(["approve", "reject"]));
    let obs = app.observations(&t).await;
    let budget = of_type(&obs, "BUDGET");
    let last = budget.last().expect("a BUDGET observation at the limit");
    assert_eq!(last["parentId"], Value::Null);
    assert_eq!(last["content"]["state"], "exceeded");
    assert_eq!(last["content"]["spentTokens"], spent);
    assert_eq!(last["content"]["limitTokens"], 4000);
    let end = obs.last().unwrap();
    assert_eq!(end["type"], "RUN_SUSPENDED");
    assert_eq!(end["content"]["suspensionIds"], json!([s["suspensionId"]]));

    let sid = s["suspensionId"].as_str().unwrap();
    // A budget approval needs its raise; a raise goes with nothing else.
    let (code, p) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(code, 422, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("raiseBy"), "{p}");
    let (code, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve", "raiseBy": {"tokens": 0}}),
        )
        .await;
    assert_eq!(code, 422);
    let (code, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "reject", "raiseBy": {"tokens": 10}}),
        )
        .await;
    assert_eq!(code, 422);
    let (code, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve", "raiseBy": {"tokens": 100000}}),
        )
        .await;
    assert_eq!(code, 202);
    let rid = run["runId"].as_str().unwrap();
    let done = app
        .wait_run(&t, rid, |r| {
            r["status"] == "completed" || r["status"] == "failed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(total_tokens(&done) > spent);
    let (_, one) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(one["decision"], "approve");
    assert_eq!(one["raiseBy"]["tokens"], 100000);
    let obs = app.observations(&t).await;
    let resumed = of_type(&obs, "AGENT_RESUMED");
    assert_eq!(resumed[0]["parentId"], Value::Null, "a budget is the run's");
    app.stop().await;
}
both_stores!(suspend_and_raise, suspends_at_the_limit_and_a_raise_goes_on);

async fn reject_fails_the_run_budget_exceeded(backend: Backend) {
    let llm = metered_llm().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app
        .thread(json!({"config": {"budget": {"maxTokens": 1}}}))
        .await;
    let (s, run) = app
        .post(
            &format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "what is 2+2?"}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(llm.calls(), 0, "not even the plan fits");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (code, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "reject", "reason": "too dear"}),
        )
        .await;
    assert_eq!(code, 202);
    let rid = run["runId"].as_str().unwrap();
    let done = app
        .wait_run(&t, rid, |r| {
            r["status"] == "failed" || r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["error"]["code"], "budget_exceeded", "{done}");
    assert_eq!(llm.calls(), 0);
    app.stop().await;
}
both_stores!(reject, reject_fails_the_run_budget_exceeded);

async fn fail_mode_fails_at_once(backend: Backend) {
    let llm = metered_llm().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    let run = app
        .run_wait_with(&t, budgeted(json!({"maxTokens": 2500, "onExceed": "fail"})))
        .await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "budget_exceeded");
    assert!(total_tokens(&run) <= 2500 + CALL);
    assert_eq!(llm.calls(), run["usage"]["llmCalls"].as_u64().unwrap());
    let obs = app.observations(&t).await;
    assert!(of_type(&obs, "AGENT_SUSPENDED").is_empty());
    let b = of_type(&obs, "BUDGET");
    assert_eq!(b.last().unwrap()["content"]["state"], "exceeded");
    // A budget that cannot be a budget is refused.
    for bad in [
        json!({"maxTokens": 0}),
        json!({"maxCostUsd": -1}),
        json!({"onExceed": "pray"}),
    ] {
        let (s, p) = app
            .post(
                &format!("/v1/threads/{t}/runs"),
                json!({"query": "x", "config": {"budget": bad}}),
            )
            .await;
        assert_eq!(s, 422, "{bad}: {p}");
    }
    app.stop().await;
}
both_stores!(fail_mode, fail_mode_fails_at_once);

async fn warns_at_80_percent(backend: Backend) {
    let llm = metered_llm().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    // Five calls (plan, two for the calculator item, one for the other, synthesis): 7,500 of
    // 9,000 tokens is past 80 % only after the last.
    let run = app
        .run_wait_with(&t, budgeted(json!({"maxTokens": 9000})))
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(total_tokens(&run), 5 * CALL);
    let obs = app.observations(&t).await;
    let b = of_type(&obs, "BUDGET");
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0]["content"]["state"], "warning");
    assert_eq!(b[0]["content"]["spentTokens"], 5 * CALL);
    assert_eq!(b[0]["content"]["limitTokens"], 9000);
    assert_eq!(b[0]["parentId"], Value::Null);
    app.stop().await;
}
both_stores!(warning, warns_at_80_percent);

async fn cost_comes_from_the_price_table(backend: Backend) {
    let llm = metered_llm().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.model_prices = Some(r#"{"fake-model": {"input": 2, "output": 10}}"#.into());
    })
    .await;
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed");
    // 1,000 × $2 + 500 × $10 per million: $0.007 a call, five calls.
    let cost = run["usage"]["costUsd"].as_f64().unwrap();
    assert!((cost - 0.035).abs() < 1e-9, "{cost}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let item = &state["todoList"][0];
    let item_cost = item["usage"]["costUsd"].as_f64().unwrap();
    assert!((item_cost - 0.014).abs() < 1e-9, "two calls: {item}");

    // A dollar budget stops the run.
    let t = app.thread(json!({})).await;
    let run = app
        .run_wait_with(&t, budgeted(json!({"maxCostUsd": 0.02})))
        .await;
    assert_eq!(run["status"], "suspended", "{run}");
    let spent = run["usage"]["costUsd"].as_f64().unwrap();
    assert!(spent <= 0.02 + 0.007 + 1e-9, "{spent}");
    let obs = app.observations(&t).await;
    let b = of_type(&obs, "BUDGET");
    let last = b.last().unwrap();
    assert_eq!(last["content"]["state"], "exceeded");
    assert_eq!(last["content"]["limitUsd"], 0.02);
    app.stop().await;
}
both_stores!(prices, cost_comes_from_the_price_table);

async fn parallel_items_share_the_budget(backend: Backend) {
    let llm = metered_llm().await;
    llm.push(
        "plan",
        plan(&[
            ("a", "think a", &[], &[]),
            ("b", "think b", &[], &[]),
            ("c", "think c", &[], &[]),
            ("d", "think d", &[], &[]),
        ]),
    );
    for id in ["a", "b", "c", "d"] {
        llm.push_item(id, Reply::Text(format!("answer {id}")));
    }
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({"config": {"maxParallelItems": 4}})).await;
    let run = app
        .run_wait_with(&t, budgeted(json!({"maxTokens": 4000})))
        .await;
    assert_eq!(run["status"], "suspended", "{run}");
    // Four items ready at once would spend 1,500 + 4 × 1,500 = 7,500; the budget lets through
    // only what fits, counting the calls in flight.
    let spent = total_tokens(&run);
    assert!(spent <= 4000 + CALL, "spent {spent}: {run}");
    assert_eq!(llm.calls() * CALL, spent);
    app.stop().await;
}
both_stores!(parallel, parallel_items_share_the_budget);

async fn the_spend_survives_kill_9(backend: Backend) {
    let llm = metered_llm().await;
    // The first item's call is held: the process dies with the plan's spend committed.
    llm.hold_if(|r| crate::fake_llm::phase_of(r) == "execute");
    let db = crate::helpers::database_url(backend).await;
    let mut env = env_for(&db, &llm.url);
    env.push(("PES_LEASE_SECONDS", "2".into()));
    let p = Proc::start(&env).await;
    let (s, run) = p
        .post(
            "/v1/threads/crash/runs",
            json!({"query": "2+2", "ifNotExists": "create",
                   "config": {"budget": {"maxTokens": 4000}}}),
        )
        .await;
    assert_eq!(s, 202, "{run}");
    let rid = run["runId"].as_str().unwrap().to_owned();
    llm.wait_for_request(|r| crate::fake_llm::phase_of(r) == "execute")
        .await;
    p.kill9().await;
    llm.release();

    let p = Proc::start(&env).await;
    let done = p
        .wait_for(&format!("/v1/threads/crash/runs/{rid}"), |r| {
            r["status"] == "suspended" || r["status"] == "completed" || r["status"] == "failed"
        })
        .await;
    assert_eq!(done["status"], "suspended", "{done}");
    let spent = total_tokens(&done);
    // The plan's 1,500 tokens were counted again after the crash: a fresh meter would have let
    // the second process spend up to the limit on its own.
    assert!(spent <= 4000 + CALL, "spent {spent}");
    assert!(done["usage"]["llmCalls"].as_u64().unwrap() >= 2, "{done}");
    let (_, obs) = p.get("/v1/threads/crash/observations?limit=1000").await;
    let obs = obs["items"].as_array().unwrap().clone();
    let b = of_type(&obs, "BUDGET");
    assert_eq!(b.last().unwrap()["content"]["spentTokens"], spent);
    p.kill9().await;
}
both_stores!(kill_9, the_spend_survives_kill_9);
