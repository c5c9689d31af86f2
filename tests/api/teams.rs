//! Team items over HTTP: a team is planned when it is ready (`PLAN` under the team item, children
//! `<teamId>.<childId>` with `parentItemId`), its children run under the same rules, it completes
//! when they do, and a team deeper than `maxTeamDepth` fails with the reason.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, phase_of, plan_item};
use crate::helpers::{Backend, spawn};

/// A plan reply whose items are `(id, description, kind, dependencies)`.
fn plan_with(items: &[(&str, &str, &str, &[&str])]) -> Reply {
    Reply::Json(json!({
        "title": "Team plan", "intent": "test teams", "plan": "teams and leaves",
        "todoList": items.iter().map(|(id, desc, kind, deps)| {
            let mut item = plan_item(id, desc, &[], deps);
            item["kind"] = json!(kind);
            item
        }).collect::<Vec<_>>(),
    }))
}

fn item<'a>(state: &'a Value, id: &str) -> &'a Value {
    state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id)
        .unwrap_or_else(|| panic!("no item {id} in {state}"))
}

both_stores!(planned, team_is_planned_and_completes_with_its_children);
async fn team_is_planned_and_completes_with_its_children(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan_with(&[
            ("t", "Research the topic", "team", &[]),
            ("x", "Write it up", "leaf", &["t"]),
        ]),
    );
    llm.push(
        "plan",
        plan_with(&[
            ("a", "Look at side A", "leaf", &[]),
            ("b", "Look at side B", "leaf", &[]),
            ("c", "Compare A and B", "leaf", &["a", "b"]),
        ]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "research it").await;
    assert_eq!(run["status"], "completed", "{run}");

    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    for id in ["t", "t.a", "t.b", "t.c", "x"] {
        assert_eq!(item(&state, id)["status"], "completed", "{id}: {state}");
    }
    assert_eq!(item(&state, "t")["kind"], "team");
    assert_eq!(item(&state, "t.a")["parentItemId"], "t");
    assert_eq!(item(&state, "t.c")["dependencies"], json!(["t.a", "t.b"]));
    assert_eq!(item(&state, "x")["parentItemId"], Value::Null);
    // The team's result is its children's outputs.
    let team_result = item(&state, "t")["result"].as_str().unwrap();
    for child in ["[t.a]", "[t.b]", "[t.c]"] {
        assert!(team_result.contains(child), "{team_result}");
    }

    let obs = app.observations(&t).await;
    let plans: Vec<&Value> = obs.iter().filter(|o| o["type"] == "PLAN").collect();
    assert_eq!(plans.len(), 2, "the run's plan and the team's");
    assert_eq!(plans[0]["parentId"], Value::Null);
    assert_eq!(plans[1]["parentId"], "t");
    assert_eq!(plans[1]["content"]["teamId"], "t");
    let ids: Vec<&str> = plans[1]["content"]["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t.a", "t.b", "t.c"]);
    // The team was planned for its own goal, after the run's plan.
    let plan_requests = llm.requests_of("plan");
    assert_eq!(plan_requests.len(), 2);
    let team_req = plan_requests[1]["messages"].to_string();
    assert!(team_req.contains("Research the topic"), "{team_req}");
    assert!(team_req.contains("sub-goal [t]"), "{team_req}");
    // x (depends on the team) started only after every child completed.
    let seq_of = |id: &str, status: &str| {
        obs.iter()
            .find(|o| {
                o["type"] == "ITEM_STATUS_CHANGE"
                    && o["content"]["itemId"] == id
                    && o["content"]["status"] == status
            })
            .map(|o| o["seq"].as_i64().unwrap())
            .unwrap_or_else(|| panic!("{id} never became {status}"))
    };
    let x_started = seq_of("x", "in_progress");
    for child in ["t.a", "t.b", "t.c"] {
        assert!(seq_of(child, "completed") < x_started);
    }
    assert!(seq_of("t", "completed") < x_started);
    // Children that need each other's results waited for them.
    assert!(seq_of("t.a", "completed") < seq_of("t.c", "in_progress"));
    assert!(seq_of("t.b", "completed") < seq_of("t.c", "in_progress"));
}

both_stores!(
    too_deep,
    a_team_beyond_max_team_depth_fails_and_cancels_its_dependents
);
async fn a_team_beyond_max_team_depth_fails_and_cancels_its_dependents(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan_with(&[
            ("outer", "Big sub-goal", "team", &[]),
            ("free", "Independent work", "leaf", &[]),
            ("after", "Needs the sub-goal", "leaf", &["outer"]),
        ]),
    );
    // The outer team (depth 1) plans a team inside it (depth 2), beyond maxTeamDepth 1.
    llm.push(
        "plan",
        plan_with(&[
            ("inner", "Nested sub-goal", "team", &[]),
            ("leaf", "Plain step", "leaf", &[]),
        ]),
    );
    let t = app.thread(json!({"config": {"maxTeamDepth": 1}})).await;
    let run = app.run_wait(&t, "nest it").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let inner = item(&state, "outer.inner");
    assert_eq!(inner["status"], "failed", "{state}");
    assert_eq!(inner["error"]["code"], "team_too_deep");
    assert_eq!(item(&state, "outer.leaf")["status"], "completed");
    let outer = item(&state, "outer");
    assert_eq!(outer["status"], "failed");
    assert_eq!(outer["error"]["code"], "team_failed");
    assert!(
        outer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("outer.inner"),
        "{outer}"
    );
    assert_eq!(item(&state, "free")["status"], "completed");
    let after = item(&state, "after");
    assert_eq!(after["status"], "cancelled");
    assert_eq!(after["error"]["code"], "dependency_failed");
    assert!(
        after["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`outer`")
    );
    // Only two plan requests: the nested team was never planned.
    assert_eq!(llm.requests_of("plan").len(), 2);
    // maxTeamDepth 0: no team at all is planned.
    llm.push("plan", plan_with(&[("solo", "A team", "team", &[])]));
    let t0 = app.thread(json!({"config": {"maxTeamDepth": 0}})).await;
    let run = app.run_wait(&t0, "no teams").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t0}/state")).await;
    assert_eq!(item(&state, "solo")["error"]["code"], "team_too_deep");
    let system = llm.requests_of("plan")[2]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(system.contains("no teams"), "{system}");
}

both_stores!(repair, an_invalid_team_plan_gets_one_repair);
async fn an_invalid_team_plan_gets_one_repair(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push("plan", plan_with(&[("t", "Sub-goal", "team", &[])]));
    // A cycle, then a valid plan.
    llm.push(
        "plan",
        plan_with(&[("a", "A", "leaf", &["b"]), ("b", "B", "leaf", &["a"])]),
    );
    llm.push("plan", plan_with(&[("a", "A", "leaf", &[])]));
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "repair it").await;
    assert_eq!(run["status"], "completed", "{run}");
    let reqs = llm.requests_of("plan");
    assert_eq!(reqs.len(), 3);
    assert!(reqs[2]["messages"].to_string().contains("cycle"));
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(item(&state, "t.a")["status"], "completed");
    assert!(
        reqs.iter().all(|r| phase_of(r) == "plan"),
        "plan requests are pes_plan requests"
    );
}

// A team's child is not offered `update_plan`, and a call of it anyway changes nothing of the
// run's plan (it is the model's error to read).
both_stores!(no_plan_updates, a_team_child_cannot_change_the_runs_plan);
async fn a_team_child_cannot_change_the_runs_plan(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan_with(&[
            ("t", "Research", "team", &[]),
            ("x", "Write it up", "leaf", &["t"]),
        ]),
    );
    llm.push("plan", plan_with(&[("a", "Look at A", "leaf", &[])]));
    let replacement = json!({"todoList": [plan_item("z", "something else", &[], &[])]});
    llm.push_item(
        "t.a",
        Reply::ToolCalls(vec![("update_plan".into(), replacement)]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "research it").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let ids: Vec<&str> = state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t", "x", "t.a"], "{state}");
    let first = llm
        .requests_of("execute")
        .into_iter()
        .find(|r| {
            r["messages"][1]["content"]
                .as_str()
                .is_some_and(|c| c.contains("Your item [t.a]"))
        })
        .unwrap();
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap())
                .collect()
        })
        .unwrap_or_default();
    assert!(!offered.contains(&"update_plan"), "{offered:?}");
    let obs = app.observations(&t).await;
    let err = obs
        .iter()
        .find(|o| o["type"] == "TOOL_EXECUTION" && o["content"]["name"] == "update_plan")
        .unwrap();
    assert!(
        err["content"]["error"]
            .as_str()
            .unwrap()
            .contains("not available to an item of a team"),
        "{err}"
    );
    app.stop().await;
}
