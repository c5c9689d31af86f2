//! Observation sizes that must not grow with the thread: `PLAN` and `PLAN_UPDATE` carry their
//! diff in full but the todo list only as a summary, whatever the finished items hold.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, spawn};

const MARKER: &str = "LARGE-RESULT-MARKER";

/// Fields an item summary holds, and nothing else.
const SUMMARY_FIELDS: [&str; 9] = [
    "dependencies",
    "description",
    "id",
    "kind",
    "parentItemId",
    "requiredTools",
    "role",
    "status",
    "stepType",
];

fn keys(item: &Value) -> Vec<String> {
    let mut k: Vec<String> = item.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

async fn plan_update_stays_small_after_a_large_result(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push("plan", plan(&[("big", "Write a long report", &[], &[])]));
    let large = format!("{MARKER} {}", "lorem ipsum ".repeat(25_000));
    llm.push("execute", Reply::Text(large.clone()));
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "write the report").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(
        state["todoList"][0]["result"], large,
        "the state keeps the whole result"
    );

    // A one-word follow-up that adds one item.
    llm.push(
        "plan",
        plan(&[
            ("big", "Write a long report", &[], &[]),
            ("short", "Say thanks", &[], &["big"]),
        ]),
    );
    let run = app.run_wait(&t, "thanks").await;
    assert_eq!(run["status"], "completed", "{run}");

    let obs = app.observations(&t).await;
    let update = obs
        .iter()
        .find(|o| o["type"] == "PLAN_UPDATE")
        .expect("the follow-up refined the plan");
    let text = update.to_string();
    assert!(
        text.len() < 4096,
        "PLAN_UPDATE is {} bytes: {text:.2000}",
        text.len()
    );
    assert!(!text.contains(MARKER), "no result text in PLAN_UPDATE");
    let c = &update["content"];
    // The diff in full: the added item as a whole item.
    assert_eq!(c["added"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c["added"][0]["id"], "short");
    assert_eq!(c["added"][0]["expectedOutcome"], "a result");
    assert_eq!(c["added"][0]["status"], "pending");
    assert_eq!(c["changed"], json!([]));
    assert_eq!(c["removed"], json!([]));
    // The list as a summary: ids, descriptions, statuses, dependencies, stepType, requiredTools.
    let list = c["todoList"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    for item in list {
        assert_eq!(keys(item), SUMMARY_FIELDS, "{item}");
    }
    assert_eq!(
        list[0],
        json!({"id": "big", "description": "Write a long report", "status": "completed",
               "dependencies": [], "stepType": "reasoning", "requiredTools": [],
               "kind": "leaf", "parentItemId": null, "role": null})
    );
    assert_eq!(list[1]["dependencies"], json!(["big"]));

    // PLAN (the first run) is a summary too.
    let first = obs.iter().find(|o| o["type"] == "PLAN").unwrap();
    assert_eq!(first["content"]["plan"], "Do the items in order");
    for item in first["content"]["todoList"].as_array().unwrap() {
        assert_eq!(keys(item), SUMMARY_FIELDS, "{item}");
    }
    app.stop().await;
}
both_stores!(
    plan_update_is_small,
    plan_update_stays_small_after_a_large_result
);
