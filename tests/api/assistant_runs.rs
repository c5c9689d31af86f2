//! What using an assistant does to runs: the effective config (assistant version, then thread, then
//! run), the version recorded on the run and in `RUN_STARTED`, roll back and forward, `locked`
//! fields, the tool policy floors, pruning and deletion.

use serde_json::{Value, json};

use crate::assistants::{create, delete, put};
use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::{Backend, TestApp, assert_problem, send, spawn, spawn_with};

/// Post a query and wait for its run to end or suspend.
async fn run_with(app: &TestApp, thread: &str, body: Value) -> Value {
    let (s, run) = app
        .post(&format!("/v1/threads/{thread}/runs/wait"), body)
        .await;
    assert_eq!(s, 200, "{run}");
    run
}

/// The `RUN_STARTED` content of `run`.
async fn started(app: &TestApp, thread: &str, run: &Value) -> Value {
    app.observations(thread)
        .await
        .into_iter()
        .find(|o| o["type"] == "RUN_STARTED" && o["runId"] == run["runId"])
        .expect("the run started")["content"]
        .clone()
}

/// The last plan request the model got, as text.
fn last_plan(llm: &FakeLlm) -> String {
    llm.requests_of("plan").last().unwrap().to_string()
}

/// The run ran with `version` of `assistant`: on the run and in its `RUN_STARTED`, whose
/// `model` (a config field) is the one returned.
async fn ran_with(
    app: &TestApp,
    thread: &str,
    run: &Value,
    assistant: &str,
    version: i64,
) -> Value {
    assert_eq!(run["status"], "completed", "{run}");
    let want = json!({"assistantId": assistant, "version": version});
    assert_eq!(run["assistant"], want, "{run}");
    let content = started(app, thread, run).await;
    assert_eq!(content["assistant"], want, "{content}");
    content["model"].clone()
}

async fn rolling_back_and_forward_changes_what_later_runs_run(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    create(
        &app,
        json!({"assistantId": "helper", "name": "Helper",
               "config": {"model": "model-one", "systemPrompt": "PROMPT-ONE"}}),
    )
    .await;
    put(
        &app,
        "/v1/assistants/helper",
        json!({"config": {"model": "model-two", "systemPrompt": "PROMPT-TWO"}}),
    )
    .await;
    let (s, thread) = app
        .post("/v1/threads", json!({"assistantId": "helper"}))
        .await;
    assert_eq!(s, 201, "{thread}");
    assert_eq!(
        (
            thread["assistantId"].clone(),
            thread["assistantVersion"].clone()
        ),
        (json!("helper"), Value::Null)
    );
    let t = thread["threadId"].as_str().unwrap().to_owned();

    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(ran_with(&app, &t, &run, "helper", 2).await, "model-two");
    assert!(last_plan(&llm).contains("PROMPT-TWO"));

    // Roll back: the next run runs version 1.
    let (s, back) = app
        .post("/v1/assistants/helper/current", json!({"version": 1}))
        .await;
    assert_eq!(
        (s, back["currentVersion"].clone()),
        (200, json!(1)),
        "{back}"
    );
    let run = app.run_wait(&t, "what is 3+3?").await;
    assert_eq!(ran_with(&app, &t, &run, "helper", 1).await, "model-one");
    let plan = last_plan(&llm);
    assert!(
        plan.contains("PROMPT-ONE") && !plan.contains("PROMPT-TWO"),
        "{plan}"
    );

    // And forward again.
    app.post("/v1/assistants/helper/current", json!({"version": 2}))
        .await;
    let run = app.run_wait(&t, "what is 4+4?").await;
    assert_eq!(ran_with(&app, &t, &run, "helper", 2).await, "model-two");

    // A pinned thread keeps its version whatever is current; its own config overlays it.
    let pinned = app
        .thread(json!({"assistantId": "helper", "assistantVersion": 1, "config": {"model": "thread-model"}}))
        .await;
    let run = app.run_wait(&pinned, "q").await;
    assert_eq!(
        ran_with(&app, &pinned, &run, "helper", 1).await,
        "thread-model"
    );
    assert!(last_plan(&llm).contains("PROMPT-ONE"));
    // A run may name a version of the thread's assistant, and overlay its own config.
    let run = run_with(
        &app,
        &pinned,
        json!({"query": "q", "assistantVersion": 2, "config": {"model": "run-model"}}),
    )
    .await;
    assert_eq!(
        ran_with(&app, &pinned, &run, "helper", 2).await,
        "run-model"
    );
    assert!(last_plan(&llm).contains("PROMPT-TWO"));

    // A run names an assistant its thread does not use.
    let plain = app.thread(json!({})).await;
    let run = run_with(&app, &plain, json!({"query": "q", "assistantId": "helper"})).await;
    assert_eq!(ran_with(&app, &plain, &run, "helper", 2).await, "model-two");
    let run = app.run_wait(&plain, "q").await;
    assert_eq!(run["assistant"], Value::Null);
    assert_eq!(started(&app, &plain, &run).await["assistant"], Value::Null);

    // PATCH: unpin (follows current), then detach.
    let path = format!("/v1/threads/{pinned}");
    let patch = |body: Value| send(&app, reqwest::Method::PATCH, &path, None, Some(body));
    let (s, th) = patch(json!({"assistantVersion": null})).await;
    assert_eq!(
        (s, th["assistantVersion"].clone(), th["assistantId"].clone()),
        (200, Value::Null, json!("helper")),
        "{th}"
    );
    assert_eq!(
        th["config"],
        json!({"model": "thread-model"}),
        "the config is left as it was"
    );
    let run = app.run_wait(&pinned, "q").await;
    assert_eq!(
        ran_with(&app, &pinned, &run, "helper", 2).await,
        "thread-model"
    );
    let (s, th) = patch(json!({"assistantId": null})).await;
    assert_eq!((s, th["assistantId"].clone()), (200, Value::Null), "{th}");
    let run = app.run_wait(&pinned, "q").await;
    assert_eq!(run["assistant"], Value::Null);
    assert!(
        !last_plan(&llm).contains("PROMPT-"),
        "no assistant's prompt any more"
    );
    app.stop().await;
}
both_stores!(
    roll_back,
    rolling_back_and_forward_changes_what_later_runs_run
);

async fn a_locked_field_is_refused_by_name_and_the_floors_hold(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    create(
        &app,
        json!({"assistantId": "strict", "name": "Strict",
               "config": {"systemPrompt": "FIXED", "tools": ["calculator", "current_time"],
                          "requireApproval": ["calculator"]},
               "locked": ["systemPrompt", "model"]}),
    )
    .await;
    let thread = |config: Value| {
        app.post(
            "/v1/threads",
            json!({"assistantId": "strict", "config": config}),
        )
    };
    let (s, p) = thread(json!({"systemPrompt": "mine"})).await;
    assert_problem(&(s, p.clone()), 422, "field_locked");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("config.systemPrompt"),
        "{p}"
    );
    let (_, p) = thread(json!({"systemPrompt": "mine", "model": "m", "maxItems": 3})).await;
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("config.systemPrompt, config.model") && !detail.contains("maxItems"),
        "{p}"
    );
    // The assistant's tool policy is a floor for its threads.
    let (s, p) = thread(json!({"requireApproval": []})).await;
    assert_problem(&(s, p.clone()), 422, "policy_floor");
    assert!(
        p["detail"].as_str().unwrap().contains("`calculator`"),
        "{p}"
    );
    assert_problem(
        &thread(json!({"tools": ["ask_user"]})).await,
        422,
        "policy_floor",
    );

    let t = app
        .thread(json!({"assistantId": "strict", "config": {"maxItems": 3}}))
        .await;
    let patch = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/threads/{t}"),
        None,
        Some(json!({"config": {"model": "m"}})),
    )
    .await;
    assert_problem(&patch, 422, "field_locked");
    let runs = format!("/v1/threads/{t}/runs");
    let (s, p) = app
        .post(
            &runs,
            json!({"query": "q", "config": {"systemPrompt": "run"}}),
        )
        .await;
    assert_problem(&(s, p.clone()), 422, "field_locked");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("config.systemPrompt"),
        "{p}"
    );
    assert_problem(
        &app.post(
            &runs,
            json!({"query": "q", "config": {"requireApproval": []}}),
        )
        .await,
        422,
        "policy_floor",
    );
    assert_problem(
        &app.post(
            &runs,
            json!({"query": "q", "config": {"tools": ["ask_user"]}}),
        )
        .await,
        422,
        "policy_floor",
    );
    // A thread without the assistant cannot shed it by naming it on a run either.
    let plain = app
        .thread(json!({"config": {"systemPrompt": "plain"}}))
        .await;
    assert_problem(
        &app.post(
            &format!("/v1/threads/{plain}/runs"),
            json!({"query": "q", "assistantId": "strict", "config": {"model": "m"}}),
        )
        .await,
        422,
        "field_locked",
    );

    // The run itself: the assistant's approval holds and its prompt is the one sent.
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(run["suspension"]["toolCall"]["name"], "calculator");
    assert!(last_plan(&llm).contains("FIXED"));

    // A thread that set a field before a later version locked it runs with the lock's value.
    create(
        &app,
        json!({"assistantId": "open", "name": "Open", "config": {}}),
    )
    .await;
    let early = app
        .thread(json!({"assistantId": "open", "config": {"systemPrompt": "THREAD-PROMPT"}}))
        .await;
    put(
        &app,
        "/v1/assistants/open",
        json!({"config": {"systemPrompt": "LOCKED-PROMPT"}, "locked": ["systemPrompt"]}),
    )
    .await;
    let run = app.run_wait(&early, "q").await;
    assert_eq!(run["status"], "completed", "{run}");
    let plan = last_plan(&llm);
    assert!(
        plan.contains("LOCKED-PROMPT") && !plan.contains("THREAD-PROMPT"),
        "{plan}"
    );
    app.stop().await;
}
both_stores!(
    locked,
    a_locked_field_is_refused_by_name_and_the_floors_hold
);

/// A thread using `assistant` (pinned to `version` when given) whose first run waits for an
/// approval of the calculator; returns (thread, the suspended run).
async fn suspended_run(app: &TestApp, assistant: &str, version: Option<i64>) -> (String, Value) {
    let mut body = json!({"assistantId": assistant});
    if let Some(v) = version {
        body["assistantVersion"] = json!(v);
    }
    let t = app.thread(body).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    (t, run)
}

async fn approve(app: &TestApp, thread: &str, run: &Value) -> Value {
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, p) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{p}");
    let id = run["runId"].as_str().unwrap();
    app.wait_run(thread, id, |r| r["status"] == "completed")
        .await
}

async fn a_deleted_assistant_lets_its_runs_finish_and_refuses_new_ones(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    create(
        &app,
        json!({"assistantId": "temp", "name": "Temp",
               "config": {"requireApproval": ["calculator"], "model": "temp-model"}}),
    )
    .await;
    let (t, run) = suspended_run(&app, "temp", None).await;
    assert_eq!(delete(&app, "/v1/assistants/temp").await.0, 204);
    assert_problem(
        &app.get("/v1/assistants/temp").await,
        404,
        "assistant_not_found",
    );
    assert_problem(
        &app.get("/v1/assistants/temp/versions").await,
        404,
        "assistant_not_found",
    );
    assert_problem(
        &delete(&app, "/v1/assistants/temp").await,
        404,
        "assistant_not_found",
    );
    let (_, list) = app.get("/v1/assistants").await;
    assert_eq!(list["items"], json!([]));

    // The run enqueued before the delete finishes with its version: after the decision the
    // worker loads it again, and the model still gets the deleted assistant's config.
    let done = approve(&app, &t, &run).await;
    assert_eq!(
        done["assistant"],
        json!({"assistantId": "temp", "version": 1})
    );
    let synthesis = llm.requests_of("synthesis");
    assert_eq!(synthesis.last().unwrap()["model"], "temp-model");

    // New runs of its thread, or naming it, are refused, saying why.
    let runs = format!("/v1/threads/{t}/runs");
    let (s, p) = app.post(&runs, json!({"query": "again"})).await;
    assert_problem(&(s, p.clone()), 422, "assistant_not_found");
    assert!(p["detail"].as_str().unwrap().contains("`temp`"), "{p}");
    let other = app.thread(json!({})).await;
    assert_problem(
        &app.post(
            &format!("/v1/threads/{other}/runs"),
            json!({"query": "q", "assistantId": "temp"}),
        )
        .await,
        422,
        "assistant_not_found",
    );
    // Detached, the thread runs again; created again, the id numbers on.
    send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/threads/{t}"),
        None,
        Some(json!({"assistantId": null})),
    )
    .await;
    assert_eq!(app.run_wait(&t, "q").await["status"], "completed");
    let again = create(
        &app,
        json!({"assistantId": "temp", "name": "Temp", "config": {}}),
    )
    .await;
    assert_eq!(
        (again["version"].clone(), again["currentVersion"].clone()),
        (json!(2), json!(2))
    );
    app.stop().await;
}
both_stores!(
    deleted,
    a_deleted_assistant_lets_its_runs_finish_and_refuses_new_ones
);

async fn versions_past_the_cap_are_pruned_except_those_runs_use(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.assistant_max_versions = 3).await;
    create(
        &app,
        json!({"assistantId": "capped", "name": "Capped",
               "config": {"requireApproval": ["calculator"], "model": "model-1"}}),
    )
    .await;
    // A run of version 1 waits for a person while versions 2 to 5 are made.
    let (t, run) = suspended_run(&app, "capped", Some(1)).await;
    for v in 2..=5 {
        let (s, a) = put(
            &app,
            "/v1/assistants/capped",
            json!({"config": {"model": format!("model-{v}")}}),
        )
        .await;
        assert_eq!((s, a["version"].clone()), (200, json!(v)), "{a}");
    }
    let kept = |page: Value| -> Vec<i64> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version"].as_i64().unwrap())
            .collect()
    };
    let (_, page) = app.get("/v1/assistants/capped/versions").await;
    assert_eq!(
        kept(page),
        vec![5, 4, 1],
        "version 1 is kept while its run waits"
    );
    let done = approve(&app, &t, &run).await;
    assert_eq!(started(&app, &t, &done).await["model"], "model-1");

    // Its run over, the next update prunes it; the thread pinned to it is told so.
    put(
        &app,
        "/v1/assistants/capped",
        json!({"config": {"model": "model-6"}}),
    )
    .await;
    let (_, page) = app.get("/v1/assistants/capped/versions").await;
    assert_eq!(kept(page), vec![6, 5, 4]);
    assert_problem(
        &app.get("/v1/assistants/capped?version=1").await,
        404,
        "assistant_version_not_found",
    );
    let (s, p) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "again"}))
        .await;
    assert_problem(&(s, p.clone()), 422, "assistant_version_not_found");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("PES_ASSISTANT_MAX_VERSIONS"),
        "{p}"
    );
    assert_problem(
        &app.post("/v1/assistants/capped/current", json!({"version": 3}))
            .await,
        422,
        "assistant_version_not_found",
    );
    app.stop().await;
}
both_stores!(
    pruned,
    versions_past_the_cap_are_pruned_except_those_runs_use
);
