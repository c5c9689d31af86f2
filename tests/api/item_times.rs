//! The seed's millisecond times on todo items: every item in the state carries `createdTimestamp`
//! and `updatedTimestamp` (Unix ms, integers) equal to its RFC 3339 `createdAt`/`updatedAt`, and
//! `updatedTimestamp` moves when the item's status changes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::{Backend, TestApp, spawn};

/// The item's (createdTimestamp, updatedTimestamp), after checking that they are integers equal
/// to its RFC 3339 times.
fn millis_of(item: &Value) -> (i64, i64) {
    let ms = |rfc: &str, stamp: &str| {
        let at: DateTime<Utc> = item[rfc]
            .as_str()
            .unwrap_or_else(|| panic!("{rfc} is a string: {item}"))
            .parse()
            .unwrap();
        let n = item[stamp]
            .as_i64()
            .unwrap_or_else(|| panic!("{stamp} is an integer: {item}"));
        assert!(item[stamp].is_i64() || item[stamp].is_u64(), "{item}");
        assert_eq!(n, at.timestamp_millis(), "{stamp} equals {rfc}: {item}");
        n
    };
    (
        ms("createdAt", "createdTimestamp"),
        ms("updatedAt", "updatedTimestamp"),
    )
}

async fn first_item(app: &TestApp, t: &str) -> Value {
    let (s, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(s, 200, "{state}");
    state["todoList"][0].clone()
}

async fn todo_items_carry_millisecond_times_that_move_with_status(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");

    let waiting = first_item(&app, &t).await;
    assert_eq!(waiting["status"], "waiting", "{waiting}");
    let (created, updated) = millis_of(&waiting);
    assert!(created <= updated, "{waiting}");

    // Let the wall clock pass the item's last change, so a later change gets a later millisecond.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while Utc::now().timestamp_millis() <= updated {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the clock stood still"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let rid = run["runId"].as_str().unwrap();
    app.wait_run(&t, rid, |r| r["status"] == "completed").await;

    let done = first_item(&app, &t).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (created_after, updated_after) = millis_of(&done);
    assert_eq!(created_after, created, "the creation time never moves");
    assert!(
        updated_after > updated,
        "updatedTimestamp moved with the status change: {updated} -> {updated_after}"
    );
    app.stop().await;
}

both_stores!(
    todo_item_times,
    todo_items_carry_millisecond_times_that_move_with_status
);
