//! The agent end to end over HTTP with the fake LLM: plan → execute → synthesize, the observation
//! tree, refinement, dependency order, TAEF, provider retries and JSON repair.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, spawn};

/// The `id`s of a list of items.
fn ids_of(items: &Value) -> Vec<String> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

fn types(obs: &[Value]) -> Vec<String> {
    obs.iter()
        .map(|o| o["type"].as_str().unwrap().to_owned())
        .collect()
}

async fn full_run_plans_executes_and_answers(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({"metadata": {"user": "u1"}})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["finalResponse"]["response"], "final answer");
    assert_eq!(
        run["usage"]["llmCalls"], 5,
        "plan + 2 calls for s1 + 1 for s2 + synthesis: {run}"
    );
    assert!(run["endedAt"].is_string());

    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let items = state["todoList"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|i| i["status"] == "completed"), "{state}");
    assert_eq!(items[0]["toolResults"][0]["output"]["result"], 4);
    assert_eq!(items[0]["validationStatus"], "passed");
    assert_eq!(
        state["stepOutputs"]["s1"],
        "tool said {\"expression\":\"2+2\",\"result\":4}"
    );
    assert_eq!(state["title"], "Test plan");
    assert_eq!(state["isPaused"], false);

    let (_, msgs) = app.get(&format!("/v1/threads/{t}/messages")).await;
    let roles: Vec<_> = msgs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].clone())
        .collect();
    assert_eq!(
        roles,
        vec![
            json!("user"),
            json!("assistant"),
            json!("tool"),
            json!("assistant")
        ]
    );
    assert_eq!(msgs["items"][3]["content"], "final answer");

    // The tool call the model asked for went out as a native tool call with the item's tools.
    let exec = llm.requests_of("execute");
    assert!(
        exec[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "calculator")
    );
    assert_eq!(
        llm.requests_of("plan")[0]["response_format"]["json_schema"]["strict"],
        true
    );

    let obs = app.observations(&t).await;
    let seqs: Vec<i64> = obs.iter().map(|o| o["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=obs.len() as i64).collect::<Vec<_>>(),
        "seq is gap-free from 1"
    );
    let ty = types(&obs);
    assert_eq!(ty.first().unwrap(), "RUN_STARTED");
    assert_eq!(ty.last().unwrap(), "RUN_COMPLETED");
    for needed in [
        "INTENT",
        "TITLE",
        "PLAN",
        "ITEM_STATUS_CHANGE",
        "TOOL_CALL",
        "TOOL_EXECUTION",
        "THOUGHTS",
        "SYNTHESIS",
        "FINAL_RESPONSE",
    ] {
        assert!(ty.iter().any(|t| t == needed), "missing {needed}: {ty:?}");
    }
    app.stop().await;
}
both_stores!(full_run, full_run_plans_executes_and_answers);

async fn observations_form_a_parent_tree(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    app.run_wait(&t, "what is 2+2?").await;
    let obs = app.observations(&t).await;
    let run_level = [
        "RUN_STARTED",
        "INTENT",
        "TITLE",
        "PLAN",
        "PLAN_UPDATE",
        "SYNTHESIS",
        "FINAL_RESPONSE",
        "RUN_COMPLETED",
    ];
    let item_level = [
        "ITEM_STATUS_CHANGE",
        "THOUGHTS",
        "TOOL_CALL",
        "TOOL_EXECUTION",
    ];
    for o in &obs {
        let ty = o["type"].as_str().unwrap();
        if run_level.contains(&ty) {
            assert!(o["parentId"].is_null(), "{o}");
        } else if item_level.contains(&ty) {
            let p = o["parentId"].as_str().unwrap();
            assert!(p == "s1" || p == "s2", "{o}");
        }
        assert!(o["runId"].is_string());
        assert_eq!(o["threadId"], t);
    }
    let tool_obs: Vec<_> = obs
        .iter()
        .filter(|o| o["type"] == "TOOL_CALL" || o["type"] == "TOOL_EXECUTION")
        .collect();
    assert_eq!(tool_obs.len(), 2);
    assert!(tool_obs.iter().all(|o| o["parentId"] == "s1"));
    assert_eq!(
        tool_obs[0]["content"]["toolCallId"],
        tool_obs[1]["content"]["toolCallId"]
    );
    assert_eq!(tool_obs[1]["content"]["status"], "success");
    // Item status changes tell the previous status too.
    let first = obs
        .iter()
        .find(|o| o["type"] == "ITEM_STATUS_CHANGE")
        .unwrap();
    assert_eq!(
        first["content"],
        json!({"itemId": "s1", "status": "in_progress", "previousStatus": "pending"})
    );
    // The filter by parent returns exactly the item's subtree.
    let (_, page) = app
        .get(&format!("/v1/threads/{t}/observations?parentId=s1"))
        .await;
    assert!(
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["parentId"] == "s1")
    );
    let (_, page) = app
        .get(&format!(
            "/v1/threads/{t}/observations?type=TOOL_CALL,TOOL_EXECUTION"
        ))
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    app.stop().await;
}
both_stores!(observation_tree, observations_form_a_parent_tree);

async fn follow_up_query_refines_the_plan(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    app.run_wait(&t, "what is 2+2?").await;
    let executes_before = llm.requests_of("execute").len();
    llm.push(
        "plan",
        plan(&[
            ("s1", "Compute 2+2", &["calculator"], &[]),
            ("s2", "Explain the result", &[], &["s1"]),
            ("s3", "Double it", &[], &["s1"]),
        ]),
    );
    let run = app.run_wait(&t, "now double it").await;
    assert_eq!(run["status"], "completed", "{run}");
    // Only the new item ran.
    assert_eq!(llm.requests_of("execute").len(), executes_before + 1);
    // The planner saw the existing list and the conversation.
    let refine_req = llm.requests_of("plan")[1].to_string();
    assert!(refine_req.contains("already has a plan"), "{refine_req}");
    assert!(refine_req.contains("what is 2+2?"));

    let obs = app.observations(&t).await;
    let update = obs
        .iter()
        .find(|o| o["type"] == "PLAN_UPDATE")
        .expect("PLAN_UPDATE");
    assert_eq!(ids_of(&update["content"]["added"]), ["s3"]);
    assert_eq!(update["content"]["added"][0]["description"], "Double it");
    assert_eq!(update["content"]["removed"], json!([]));
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let ids: Vec<_> = state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!("s1"), json!("s2"), json!("s3")]);
    assert!(
        state["todoList"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["status"] == "completed")
    );
    // s1 ran once in all: its attempts stayed 1.
    assert_eq!(state["todoList"][0]["attempts"], 1);
    app.stop().await;
}
both_stores!(refinement, follow_up_query_refines_the_plan);

async fn items_run_in_dependency_order(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[
            ("c", "third", &[], &["a", "b"]),
            ("a", "second", &[], &["b"]),
            ("b", "first", &[], &[]),
        ]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "order please").await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let started: Vec<_> = obs
        .iter()
        .filter(|o| o["type"] == "ITEM_STATUS_CHANGE" && o["content"]["status"] == "in_progress")
        .map(|o| o["parentId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(started, vec!["b", "a", "c"]);
    // The later items saw the earlier items' outputs.
    let exec = llm.requests_of("execute");
    assert!(
        exec[2]["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("[b] first: done")
    );
    app.stop().await;
}
both_stores!(dependency_order, items_run_in_dependency_order);

async fn invalid_plans_get_one_repair_request(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    // A cycle, then a valid plan.
    llm.push(
        "plan",
        plan(&[("a", "x", &[], &["b"]), ("b", "y", &[], &["a"])]),
    );
    llm.push("plan", plan(&[("a", "x", &[], &[])]));
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    let plans = llm.requests_of("plan");
    assert_eq!(plans.len(), 2);
    let last = plans[1]["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(last.contains("cycle"), "{last}");

    // Unknown dependency twice: the run fails and says why.
    llm.push("plan", plan(&[("a", "x", &[], &["zz"])]));
    llm.push("plan", plan(&[("a", "x", &[], &["zz"])]));
    let t2 = app.thread(json!({})).await;
    let run = app.run_wait(&t2, "q").await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "invalid_plan");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown item `zz`")
    );
    let obs = app.observations(&t2).await;
    let ty = types(&obs);
    assert_eq!(ty.last().unwrap(), "RUN_FAILED");
    let err = obs.iter().find(|o| o["type"] == "ERROR").unwrap();
    assert_eq!(err["content"]["phase"], "plan");
    assert!(err["parentId"].is_null());
    let (_, thread) = app.get(&format!("/v1/threads/{t2}")).await;
    assert_eq!(thread["status"], "error");
    app.stop().await;
}
both_stores!(plan_repair, invalid_plans_get_one_repair_request);

async fn invalid_json_gets_one_repair_then_fails_with_what_the_model_said(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push("plan", Reply::Text("this is not json".into()));
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    let second = llm.requests_of("plan")[1].to_string();
    assert!(
        second.contains("not valid"),
        "the repair request says what was wrong: {second}"
    );

    llm.push("synthesis", Reply::Text("nope".into()));
    llm.push("synthesis", Reply::Text("still nope".into()));
    let t2 = app.thread(json!({})).await;
    let run = app.run_wait(&t2, "q").await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "llm_invalid_output");
    let obs = app.observations(&t2).await;
    let err = obs.iter().find(|o| o["type"] == "ERROR").unwrap();
    assert_eq!(err["content"]["phase"], "synthesize");
    assert!(
        err["content"]["message"]
            .as_str()
            .unwrap()
            .contains("still nope"),
        "{err}"
    );
    app.stop().await;
}
both_stores!(
    json_repair,
    invalid_json_gets_one_repair_then_fails_with_what_the_model_said
);

async fn provider_errors_are_retried(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push("plan", Reply::Status(500, "boom".into(), None));
    llm.push(
        "plan",
        Reply::Status(429, "slow down".into(), Some("0".into())),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(llm.requests_of("plan").len(), 3);

    // A permanent rejection fails the run at once, with the provider's words.
    llm.push("plan", Reply::Status(401, "bad key".into(), None));
    let t2 = app.thread(json!({})).await;
    let run = app.run_wait(&t2, "q").await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "llm_rejected");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad key")
    );
    app.stop().await;
}
both_stores!(provider_retry, provider_errors_are_retried);

async fn strict_items_are_retried_until_they_call_their_tools(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push("plan", plan(&[("s1", "Compute 2+2", &["calculator"], &[])]));
    llm.push("execute", Reply::Text("I guess 4".into()));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "2+2"}))]),
    );
    llm.push("execute", Reply::Text("4".into()));
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let item = &state["todoList"][0];
    assert_eq!(item["status"], "completed");
    assert_eq!(item["validationStatus"], "passed");
    assert_eq!(item["attempts"], 2);
    let nudge = llm.requests_of("execute")[1]["messages"].to_string();
    assert!(
        nudge.contains("without calling the required tool"),
        "{nudge}"
    );

    // Never calling it: 1 attempt + 2 retries, then the item fails; the run still synthesizes.
    llm.push("plan", plan(&[("s1", "Compute 2+2", &["calculator"], &[])]));
    for _ in 0..3 {
        llm.push("execute", Reply::Text("no tools for me".into()));
    }
    let t2 = app.thread(json!({})).await;
    let run = app.run_wait(&t2, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t2}/state")).await;
    let item = &state["todoList"][0];
    assert_eq!(item["status"], "failed", "{item}");
    assert_eq!(item["validationStatus"], "failed");
    assert_eq!(item["error"]["code"], "required_tool_not_called");
    let obs = app.observations(&t2).await;
    assert!(
        obs.iter()
            .any(|o| o["type"] == "ERROR" && o["parentId"] == "s1")
    );

    // Advisory mode: the item completes and records the skip.
    llm.push("plan", plan(&[("s1", "Compute 2+2", &["calculator"], &[])]));
    llm.push("execute", Reply::Text("4-ish".into()));
    let t3 = app
        .thread(json!({"config": {"toolValidationMode": "advisory"}}))
        .await;
    app.run_wait(&t3, "q").await;
    let (_, state) = app.get(&format!("/v1/threads/{t3}/state")).await;
    assert_eq!(state["todoList"][0]["status"], "completed");
    assert_eq!(state["todoList"][0]["validationStatus"], "failed");
    app.stop().await;
}
both_stores!(
    taef_strict,
    strict_items_are_retried_until_they_call_their_tools
);

async fn update_plan_changes_items_not_started(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[("a", "first", &[], &[]), ("b", "second", &[], &["a"])]),
    );
    llm.push("execute", Reply::ToolCalls(vec![("update_plan".into(), json!({"todoList": [
        {"id": "c", "description": "instead of b", "stepType": "reasoning", "requiredTools": [], "expectedOutcome": "", "dependencies": ["a"]}
    ]}))]));
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let ids: Vec<_> = state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec!["a", "c"]);
    let obs = app.observations(&t).await;
    let upd = obs.iter().find(|o| o["type"] == "PLAN_UPDATE").unwrap();
    assert_eq!(ids_of(&upd["content"]["added"]), ["c"]);
    assert_eq!(upd["content"]["added"][0]["description"], "instead of b");
    assert_eq!(ids_of(&upd["content"]["removed"]), ["b"]);
    assert_eq!(upd["content"]["removed"][0]["description"], "second");
    assert_eq!(ids_of(&upd["content"]["todoList"]), ["a", "c"]);
    app.stop().await;
}
both_stores!(update_plan, update_plan_changes_items_not_started);

async fn offline_model_runs_the_whole_pipeline(backend: Backend) {
    let app = spawn(backend, None).await;
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "What is 12*(3+4)?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let response = run["finalResponse"]["response"].as_str().unwrap();
    assert!(response.contains("not a real"), "{response}");
    assert!(response.contains("84"), "{response}");
    let obs = app.observations(&t).await;
    assert!(
        obs[0]["content"]["warning"]
            .as_str()
            .unwrap()
            .contains("not a real LLM")
    );
    assert!(
        obs.iter()
            .any(|o| o["type"] == "TOOL_EXECUTION" && o["content"]["output"]["result"] == 84)
    );
    app.stop().await;
}
both_stores!(offline, offline_model_runs_the_whole_pipeline);
