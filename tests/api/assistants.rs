//! Assistants over HTTP: create, read, list, versions and `current`, per tenant, atomic across
//! replicas, and every bad request a clear problem. What using one does to runs is in
//! `assistant_runs`.

use futures::future::join_all;
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{
    Backend, TestApp, assert_problem, database_url, read, send, spawn, spawn_config, spawn_with,
    test_config,
};

pub async fn put(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    send(app, Method::PUT, path, None, Some(body)).await
}

pub async fn delete(app: &TestApp, path: &str) -> (u16, Value) {
    send(app, Method::DELETE, path, None, None).await
}

/// Create an assistant; the created one.
pub async fn create(app: &TestApp, body: Value) -> Value {
    let (s, a) = app.post("/v1/assistants", body).await;
    assert_eq!(s, 201, "{a}");
    a
}

fn versions_of(page: &Value) -> Vec<i64> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect()
}

async fn assistants_are_created_versioned_read_and_listed(backend: Backend) {
    let app = spawn(backend, None).await;
    let made = create(
        &app,
        json!({"name": "Helper", "config": {"systemPrompt": "one"}}),
    )
    .await;
    assert!(
        uuid::Uuid::parse_str(made["assistantId"].as_str().unwrap()).is_ok(),
        "{made}"
    );
    assert_eq!(
        (made["version"].clone(), made["currentVersion"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(made["locked"], json!([]));
    assert_eq!(made["description"], Value::Null);

    let s = create(
        &app,
        json!({"assistantId": "support", "name": "Support", "description": "answers customers",
               "config": {"systemPrompt": "v1", "maxIterations": 3}, "locked": ["systemPrompt"]}),
    )
    .await;
    assert_eq!(s["assistantId"], "support");
    let again = app
        .post(
            "/v1/assistants",
            json!({"assistantId": "support", "name": "x", "config": {}}),
        )
        .await;
    assert_problem(&again, 409, "assistant_exists");

    // A PUT is a new version, made current; what it leaves out is kept.
    let (st, v2) = put(
        &app,
        "/v1/assistants/support",
        json!({"config": {"systemPrompt": "v2"}}),
    )
    .await;
    assert_eq!(st, 200, "{v2}");
    assert_eq!(
        (v2["version"].clone(), v2["currentVersion"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(v2["name"], "Support");
    assert_eq!(v2["description"], "answers customers");
    assert_eq!(v2["locked"], json!(["systemPrompt"]));
    assert_eq!(
        v2["config"],
        json!({"systemPrompt": "v2"}),
        "config is replaced whole"
    );
    let (_, v3) = put(
        &app,
        "/v1/assistants/support",
        json!({"name": "Support 3", "config": {"systemPrompt": "v3"}, "locked": []}),
    )
    .await;
    assert_eq!(
        (v3["version"].clone(), v3["name"].clone()),
        (json!(3), json!("Support 3"))
    );
    assert_eq!(v3["locked"], json!([]));

    let (_, cur) = app.get("/v1/assistants/support").await;
    assert_eq!(cur["version"], 3);
    let (st, old) = app.get("/v1/assistants/support?version=1").await;
    assert_eq!(st, 200, "{old}");
    assert_eq!(
        old["config"],
        json!({"systemPrompt": "v1", "maxIterations": 3})
    );
    assert_eq!(
        (old["version"].clone(), old["currentVersion"].clone()),
        (json!(1), json!(3))
    );
    assert_eq!(old["name"], "Support");
    assert_problem(
        &app.get("/v1/assistants/support?version=9").await,
        404,
        "assistant_version_not_found",
    );
    assert_problem(
        &app.get("/v1/assistants/nope").await,
        404,
        "assistant_not_found",
    );

    // Versions, newest first, paged.
    let (_, p1) = app.get("/v1/assistants/support/versions?limit=2").await;
    assert_eq!(versions_of(&p1), vec![3, 2]);
    let cursor = p1["nextCursor"].as_str().expect("a next page").to_owned();
    let (_, p2) = app
        .get(&format!(
            "/v1/assistants/support/versions?limit=2&cursor={cursor}"
        ))
        .await;
    assert_eq!(versions_of(&p2), vec![1]);
    assert_eq!(p2["nextCursor"], Value::Null);
    assert_eq!(p2["items"][0]["config"]["systemPrompt"], "v1");

    // The list: newest first, each at its current version.
    let (_, l1) = app.get("/v1/assistants?limit=1").await;
    assert_eq!(l1["items"][0]["assistantId"], "support");
    assert_eq!(l1["items"][0]["version"], 3);
    let cursor = l1["nextCursor"].as_str().unwrap().to_owned();
    let (_, l2) = app
        .get(&format!("/v1/assistants?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(l2["items"][0]["assistantId"], made["assistantId"]);
    assert_eq!(l2["nextCursor"], Value::Null);

    // Rolling back shows the old version as current, and the list follows.
    let (st, back) = app
        .post("/v1/assistants/support/current", json!({"version": 1}))
        .await;
    assert_eq!(st, 200, "{back}");
    assert_eq!(
        (back["version"].clone(), back["currentVersion"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(back["config"]["systemPrompt"], "v1");
    let (_, l) = app.get("/v1/assistants").await;
    assert_eq!(l["items"][0]["version"], 1);
    assert_problem(
        &app.post("/v1/assistants/support/current", json!({"version": 7}))
            .await,
        422,
        "assistant_version_not_found",
    );
    // A PUT after a roll back numbers on and becomes current.
    let (_, v4) = put(&app, "/v1/assistants/support", json!({"config": {}})).await;
    assert_eq!(
        (v4["version"].clone(), v4["currentVersion"].clone()),
        (json!(4), json!(4))
    );
    assert_eq!(v4["name"], "Support", "kept from the current version (1)");
    app.stop().await;
}
both_stores!(crud, assistants_are_created_versioned_read_and_listed);

async fn another_tenant_sees_no_assistant(backend: Backend) {
    let app = spawn_with(backend, None, |c| c.api_keys = Some("ka:a,kb:b".into())).await;
    let (s, a) = send(
        &app,
        Method::POST,
        "/v1/assistants",
        Some("ka"),
        Some(json!({"assistantId": "mine", "name": "A's", "config": {"systemPrompt": "a"}})),
    )
    .await;
    assert_eq!(s, 201, "{a}");
    let as_b =
        |m: Method, path: &'static str, body: Option<Value>| send(&app, m, path, Some("kb"), body);
    for got in [
        as_b(Method::GET, "/v1/assistants/mine", None).await,
        as_b(Method::GET, "/v1/assistants/mine?version=1", None).await,
        as_b(Method::GET, "/v1/assistants/mine/versions", None).await,
        as_b(
            Method::PUT,
            "/v1/assistants/mine",
            Some(json!({"config": {}})),
        )
        .await,
        as_b(
            Method::POST,
            "/v1/assistants/mine/current",
            Some(json!({"version": 1})),
        )
        .await,
        as_b(Method::DELETE, "/v1/assistants/mine", None).await,
    ] {
        assert_problem(&got, 404, "assistant_not_found");
    }
    let (_, list) = as_b(Method::GET, "/v1/assistants", None).await;
    assert_eq!(list["items"], json!([]), "{list}");
    // Nor can B's threads and runs use it.
    let (_, t) = as_b(Method::POST, "/v1/threads", Some(json!({}))).await;
    let runs = format!("/v1/threads/{}/runs", t["threadId"].as_str().unwrap());
    assert_problem(
        &as_b(
            Method::POST,
            "/v1/threads",
            Some(json!({"assistantId": "mine"})),
        )
        .await,
        422,
        "assistant_not_found",
    );
    assert_problem(
        &send(
            &app,
            Method::POST,
            &runs,
            Some("kb"),
            Some(json!({"query": "q", "assistantId": "mine"})),
        )
        .await,
        422,
        "assistant_not_found",
    );
    // Ids are per tenant: B may have its own `mine`, and A's is untouched.
    let (s, b) = as_b(
        Method::POST,
        "/v1/assistants",
        Some(json!({"assistantId": "mine", "name": "B's", "config": {}})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let (_, still) = send(&app, Method::GET, "/v1/assistants/mine", Some("ka"), None).await;
    assert_eq!(
        (still["name"].clone(), still["version"].clone()),
        (json!("A's"), json!(1))
    );
    let (s, _) = send(&app, Method::GET, "/v1/assistants", None, None).await;
    assert_eq!(s, 401);
    app.stop().await;
}
both_stores!(tenancy, another_tenant_sees_no_assistant);

/// Concurrent PUTs of one assistant, on two replicas of one Postgres (one process on SQLite):
/// every PUT gets its own version, none lost.
async fn concurrent_updates_get_distinct_versions(backend: Backend) {
    let url = database_url(backend).await;
    let first = spawn_config(test_config(&url, None)).await;
    let second = match backend {
        Backend::Postgres => Some(spawn_config(test_config(&url, None)).await),
        Backend::Sqlite => None,
    };
    let apps: Vec<&TestApp> = [Some(&first), second.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    create(
        &first,
        json!({"assistantId": "busy", "name": "Busy", "config": {}}),
    )
    .await;
    let puts = (0..20).map(|i| {
        let app = apps[i % apps.len()];
        async move {
            put(
                app,
                "/v1/assistants/busy",
                json!({"config": {"systemPrompt": format!("p{i}")}}),
            )
            .await
        }
    });
    let mut got: Vec<i64> = join_all(puts)
        .await
        .into_iter()
        .map(|(s, a)| {
            assert_eq!(s, 200, "{a}");
            a["version"].as_i64().unwrap()
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (2..=21).collect::<Vec<_>>());
    let (_, page) = first.get("/v1/assistants/busy/versions?limit=200").await;
    assert_eq!(versions_of(&page), (1..=21).rev().collect::<Vec<_>>());
    let (_, now) = apps[apps.len() - 1].get("/v1/assistants/busy").await;
    assert_eq!(now["currentVersion"], 21);
    for app in [Some(first), second].into_iter().flatten() {
        app.stop().await;
    }
}
both_stores!(concurrent_puts, concurrent_updates_get_distinct_versions);

async fn bad_assistant_input_is_a_clear_problem(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.assistant_max_config_bytes = 1024;
        c.tenant_max_assistants = 3;
    })
    .await;
    let post = |body: Value| app.post("/v1/assistants", body);
    for (body, needle) in [
        (
            json!({"name": "a", "config": {}, "colour": "red"}),
            "colour",
        ),
        (json!({"name": 5, "config": {}}), "name"),
        (json!({"name": "a"}), "config"),
        (json!({"config": {}}), "name"),
        (
            json!({"name": "a", "config": {"temperature": 1}}),
            "temperature",
        ),
        (
            json!({"name": "a", "config": {}, "locked": "model"}),
            "locked",
        ),
        (
            json!({"assistantId": "a b", "name": "a", "config": {}}),
            "assistantId",
        ),
        (json!([1, 2]), "object"),
    ] {
        let got = post(body.clone()).await;
        assert_eq!(got.0, 422, "{body}: {}", got.1);
        assert!(
            got.1["detail"].as_str().unwrap().contains(needle),
            "{body}: {}",
            got.1
        );
    }
    // Every problem of a well-formed body at once, each with its field.
    let (s, p) =
        post(json!({"name": " ", "config": {"maxIterations": 0}, "locked": ["model", "nope"]}))
            .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("validation_failed")),
        "{p}"
    );
    let errors = p["errors"].as_array().unwrap();
    let paths: Vec<&str> = errors.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, vec!["/name", "/locked/1", "/config"], "{p}");
    assert!(
        errors[1]["message"].as_str().unwrap().contains("`nope`"),
        "{p}"
    );
    assert!(
        errors[2]["message"]
            .as_str()
            .unwrap()
            .contains("maxIterations"),
        "{p}"
    );
    let (_, p) = post(json!({"name": "a", "config": {"tools": ["no_such_tool"]}})).await;
    assert!(
        p["detail"].as_str().unwrap().contains("no_such_tool"),
        "{p}"
    );
    // A config past PES_ASSISTANT_MAX_CONFIG_BYTES, and a body past PES_MAX_BODY_BYTES.
    let (s, p) = post(json!({"name": "a", "config": {"systemPrompt": "x".repeat(2000)}})).await;
    assert_eq!(s, 422, "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("PES_ASSISTANT_MAX_CONFIG_BYTES"),
        "{p}"
    );
    let (s, p) = post(json!({"name": "a", "config": {"systemPrompt": "x".repeat(2 << 20)}})).await;
    assert_problem(&(s, p), 413, "payload_too_large");
    let r = app
        .client
        .put(app.url("/v1/assistants/x"))
        .header("content-type", "text/plain")
        .body(r#"{"config": {}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    assert_eq!(r.headers()["content-type"], "application/problem+json");

    create(
        &app,
        json!({"assistantId": "ok", "name": "ok", "config": {}}),
    )
    .await;
    assert_problem(
        &put(
            &app,
            "/v1/assistants/ok",
            json!({"config": {"maxItems": 0}}),
        )
        .await,
        422,
        "validation_failed",
    );
    assert_problem(
        &put(&app, "/v1/assistants/ok", json!({"name": "x"})).await,
        422,
        "validation_failed",
    );
    assert_problem(
        &put(&app, "/v1/assistants/a%20b", json!({"config": {}})).await,
        404,
        "assistant_not_found",
    );
    for path in [
        "/v1/assistants/ok?version=0",
        "/v1/assistants/ok?version=one",
        "/v1/assistants/ok?colour=red",
        "/v1/assistants?limit=0",
        "/v1/assistants?limit=201",
        "/v1/assistants?cursor=zz",
        "/v1/assistants/ok/versions?cursor=3a",
    ] {
        assert_problem(&app.get(path).await, 422, "validation_failed");
    }
    for body in [json!({"version": "one"}), json!({"version": 0}), json!({})] {
        let got = app.post("/v1/assistants/ok/current", body.clone()).await;
        assert_eq!(got.0, 422, "{body}: {}", got.1);
    }
    // What threads and runs say of assistants is checked too.
    assert_problem(
        &app.post("/v1/threads", json!({"assistantVersion": 1}))
            .await,
        422,
        "validation_failed",
    );
    assert_problem(
        &app.post(
            "/v1/threads",
            json!({"assistantId": "ok", "assistantVersion": 0}),
        )
        .await,
        422,
        "validation_failed",
    );
    let t = app.thread(json!({})).await;
    let runs = format!("/v1/threads/{t}/runs");
    assert_problem(
        &app.post(&runs, json!({"query": "q", "assistantVersion": 1}))
            .await,
        422,
        "validation_failed",
    );
    assert_problem(
        &app.post(
            &runs,
            json!({"query": "q", "assistantId": "ok", "assistantVersion": 0}),
        )
        .await,
        422,
        "validation_failed",
    );
    assert_problem(
        &app.post(
            &runs,
            json!({"query": "q", "assistantId": "ok", "assistantVersion": 5}),
        )
        .await,
        422,
        "assistant_version_not_found",
    );

    // PES_TENANT_MAX_ASSISTANTS: the fourth is refused until one is deleted.
    create(&app, json!({"assistantId": "b", "name": "b", "config": {}})).await;
    create(&app, json!({"assistantId": "c", "name": "c", "config": {}})).await;
    let r = app
        .client
        .post(app.url("/v1/assistants"))
        .json(&json!({"assistantId": "d", "name": "d", "config": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let (_, p) = read(r).await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("PES_TENANT_MAX_ASSISTANTS"),
        "{p}"
    );
    assert_eq!(delete(&app, "/v1/assistants/c").await.0, 204);
    create(&app, json!({"assistantId": "d", "name": "d", "config": {}})).await;
    app.stop().await;
}
both_stores!(bad_input, bad_assistant_input_is_a_clear_problem);
