//! A run's end ends its work: when a run is cancelled (suspended, queued again after a decision,
//! or running) or fails, its unfinished items become `cancelled` and its pending suspensions are
//! resolved as cancelled, so no later run executes a call that waited for a decision nobody
//! took, and a later run plans for its own query only.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, item_of, plan};
use crate::helpers::{Backend, TestApp, of_type, spawn, statuses};

async fn cancel(app: &TestApp, t: &str, run: &str) {
    let (s, b) = app
        .post(&format!("/v1/threads/{t}/runs/{run}/cancel"), json!({}))
        .await;
    assert_eq!(s, 202, "{b}");
}

/// The probe, with the offline model: a suspended run is cancelled, and the next run on the
/// thread neither executes the call that waited for approval nor plans the old question again.
async fn a_cancelled_suspension_is_never_executed_by_the_next_run(backend: Backend) {
    let app = spawn(backend, None).await;
    let (s, run) = app
        .post(
            "/v1/threads/cx/runs/wait",
            json!({"query": "What is 6*7?", "ifNotExists": "create",
                   "config": {"requireApproval": ["calculator"]}}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "suspended", "{run}");
    let rid = run["runId"].as_str().unwrap();
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    cancel(&app, "cx", rid).await;
    let (_, done) = app.get(&format!("/v1/threads/cx/runs/{rid}")).await;
    assert_eq!(done["status"], "cancelled", "{done}");

    // The run's work ended with it: every item cancelled, the suspension too.
    let items = statuses(&app, None, "cx").await;
    assert!(!items.is_empty());
    assert!(
        items.iter().all(|(_, s)| s == "cancelled"),
        "every item ends with the run: {items:?}"
    );
    let (_, sus) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(sus["status"], "cancelled", "{sus}");
    let (_, pending) = app.get("/v1/threads/cx/suspensions").await;
    assert_eq!(pending["items"], json!([]), "{pending}");
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 409, "nobody decides a cancelled suspension: {b}");
    let log = app.observations("cx").await;
    let changes: Vec<&Value> = of_type(&log, "ITEM_STATUS_CHANGE")
        .into_iter()
        .filter(|o| o["content"]["status"] == "cancelled")
        .collect();
    assert_eq!(changes.len(), items.len(), "an ITEM_STATUS_CHANGE each");
    let cancelled_at = log
        .iter()
        .position(|o| o["type"] == "RUN_CANCELLED")
        .unwrap();
    assert!(
        changes
            .iter()
            .all(|c| c["seq"].as_i64() < log[cancelled_at]["seq"].as_i64()),
        "the items end before the run's RUN_CANCELLED"
    );

    // The next run plans for its own question and runs only its own call.
    let (s, next) = app
        .post(
            "/v1/threads/cx/runs/wait",
            json!({"query": "What is 2+3?", "config": {"requireApproval": []}}),
        )
        .await;
    assert_eq!(s, 200, "{next}");
    assert_eq!(next["status"], "completed", "{next}");
    let log = app.observations("cx").await;
    let next_id = next["runId"].as_str().unwrap();
    let executed: Vec<&Value> = of_type(&log, "TOOL_EXECUTION")
        .into_iter()
        .filter(|o| o["runId"] == next_id)
        .collect();
    assert_eq!(executed.len(), 1, "{executed:?}");
    assert_eq!(
        executed[0]["content"]["output"]["expression"], "2+3",
        "{executed:?}"
    );
    assert!(
        of_type(&log, "TOOL_EXECUTION")
            .iter()
            .all(|e| e["content"]["output"]["expression"] != "6*7"),
        "the call that waited for approval never ran"
    );
    let answer = next["finalResponse"]["response"].as_str().unwrap();
    assert!(!answer.contains("6*7"), "{answer}");
    app.stop().await;
}
both_stores!(
    cancelled_suspension,
    a_cancelled_suspension_is_never_executed_by_the_next_run
);

/// A running run is cancelled while one item waits for a person and another is in a model
/// call: both items end, the pending suspension is cancelled with them.
async fn a_running_run_ends_its_waiting_and_working_items(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[
            ("a", "Compute it", &["calculator"], &[]),
            ("b", "Think long", &[], &[]),
            ("c", "Answer", &[], &["a", "b"]),
        ]),
    );
    llm.push_item(
        "a",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "6*7"}))]),
    );
    llm.hold_if(|r| item_of(r).as_deref() == Some("b"));
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let (s, run) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "go"}))
        .await;
    assert_eq!(s, 202, "{run}");
    let rid = run["runId"].as_str().unwrap().to_owned();
    let suspended = app
        .wait_observation(&t, |o| o["type"] == "AGENT_SUSPENDED")
        .await;
    let sid = suspended["content"]["suspensionId"].as_str().unwrap();
    llm.wait_for_request(|r| item_of(r).as_deref() == Some("b"))
        .await;
    cancel(&app, &t, &rid).await;
    let done = app.wait_run(&t, &rid, |r| r["status"] == "cancelled").await;
    assert_eq!(done["status"], "cancelled");
    llm.release();
    let items = statuses(&app, None, &t).await;
    assert_eq!(
        items,
        vec![
            ("a".to_owned(), "cancelled".to_owned()),
            ("b".to_owned(), "cancelled".to_owned()),
            ("c".to_owned(), "cancelled".to_owned()),
        ]
    );
    let (_, sus) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(sus["status"], "cancelled", "{sus}");
    app.stop().await;
}
both_stores!(
    running_cancel,
    a_running_run_ends_its_waiting_and_working_items
);

/// A run approved (so queued again) and cancelled before it goes on: the call never runs, now or
/// in the next run; a failed run ends its other items too.
async fn queued_again_and_failed_runs_end_their_items(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    // Hold every model call, so the approved run stays queued or running but makes no step.
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let rid = run["runId"].as_str().unwrap().to_owned();
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    llm.hold();
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    cancel(&app, &t, &rid).await;
    app.wait_run(&t, &rid, |r| r["status"] == "cancelled").await;
    llm.release();
    assert!(
        statuses(&app, None, &t)
            .await
            .iter()
            .all(|(_, s)| s == "cancelled")
    );
    let log = app.observations(&t).await;
    assert!(
        of_type(&log, "TOOL_EXECUTION")
            .iter()
            .all(|e| e["content"]["status"] != "success"),
        "{log:?}"
    );

    // A run that fails on its budget after planning: the items it had not finished are
    // cancelled with it, none left pending for a later run.
    let t2 = app
        .thread(json!({"config": {"budget": {"maxTokens": 2500, "onExceed": "fail"}}}))
        .await;
    llm.set_usage(1000, 1000);
    llm.push(
        "plan",
        plan(&[
            ("x", "One", &[], &[]),
            ("y", "Two", &[], &[]),
            ("z", "After both", &[], &["x", "y"]),
        ]),
    );
    let (s, run) = app
        .post(
            &format!("/v1/threads/{t2}/runs/wait"),
            json!({"query": "go"}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "budget_exceeded", "{run}");
    let items = statuses(&app, None, &t2).await;
    assert_eq!(items.len(), 3, "{items:?}");
    assert!(
        items.iter().all(|(_, s)| s == "cancelled" || s == "failed"),
        "{items:?}"
    );
    app.stop().await;
}
both_stores!(
    queued_and_failed,
    queued_again_and_failed_runs_end_their_items
);
