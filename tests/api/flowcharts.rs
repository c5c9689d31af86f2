//! The flowchart registry over HTTP: versions, reads, deletes, per tenant; a name of a tool is
//! refused; every mistake in a definition is a 422 naming its JSON Pointer; a flowchart is a tool
//! of its tenant's catalogue and thread configs.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::assert_problem;
use crate::helpers::{Backend, TestApp, put_flowchart, read, spawn, spawn_with};

async fn delete(app: &TestApp, key: Option<&str>, name: &str) -> (u16, Value) {
    let mut r = app
        .client
        .delete(app.url(&format!("/v1/flowcharts/{name}")));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    read(r.send().await.unwrap()).await
}

/// A small triage flowchart: big amounts go to a person, small ones are approved.
fn triage(description: &str) -> Value {
    json!({
        "description": description,
        "inputSchema": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
        "flowchart": {"start": "route", "stages": {
            "route": {"kind": "decide", "rules": [
                {"condition": {">": [{"var": "args.amount"}, 100]}, "next": "review"}
            ], "default": "approve"},
            "review": {"kind": "end", "result": {"decision": "review"}},
            "approve": {"kind": "end", "result": {"decision": "approved"}}
        }}
    })
}

/// A flowchart whose only stage calls `target` as a sub-flow.
fn calls(target: &str) -> Value {
    json!({
        "description": format!("calls {target}"),
        "flowchart": {"start": "a", "stages": {"a": {"kind": "flow", "flowchart": target, "output": "sub"}}}
    })
}

/// 422 `validation_failed` whose `errors` hold exactly these pointers, each also in `detail`.
#[track_caller]
fn assert_invalid(status: u16, body: &Value, paths: &[&str]) {
    assert_problem(&(status, body.clone()), 422, "validation_failed");
    let got: Vec<&str> = body["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors: {body}"))
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(got, paths, "{body}");
    let detail = body["detail"].as_str().unwrap();
    for e in body["errors"].as_array().unwrap() {
        let line = format!(
            "{}: {}",
            e["path"].as_str().unwrap(),
            e["message"].as_str().unwrap()
        );
        assert!(detail.contains(&line), "{line} missing from {detail}");
    }
}

async fn flowcharts_are_created_versioned_read_listed_and_deleted(backend: Backend) {
    let app = spawn(backend, None).await;
    let (s, v1) = put_flowchart(&app, None, "triage", triage("first")).await;
    assert_eq!(s, 201, "{v1}");
    assert_eq!(
        (v1["name"].as_str(), v1["version"].as_i64()),
        (Some("triage"), Some(1))
    );
    assert_eq!(v1["description"], "first");
    assert_eq!(v1["flowchart"], triage("first")["flowchart"]);
    assert!(v1["createdAt"].is_string(), "{v1}");

    let (s, v2) = put_flowchart(&app, None, "triage", triage("second")).await;
    assert_eq!(s, 200, "a new version of an existing flowchart: {v2}");
    assert_eq!(v2["version"], 2);

    let (s, got) = app.get("/v1/flowcharts/triage").await;
    assert_eq!((s, &got), (200, &v2));
    let (s, got) = app.get("/v1/flowcharts/triage?version=1").await;
    assert_eq!((s, &got), (200, &v1));
    let (s, b) = app.get("/v1/flowcharts/triage?version=3").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (s, b) = app.get("/v1/flowcharts/triage?version=0").await;
    assert_problem(&(s, b), 422, "validation_failed");
    let (s, b) = app.get("/v1/flowcharts/nope").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (s, b) = app.get("/v1/flowcharts/bad%20name").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");

    put_flowchart(&app, None, "another", calls("triage")).await;
    let (s, list) = app.get("/v1/flowcharts").await;
    assert_eq!(s, 200, "{list}");
    let items: Vec<(&str, i64)> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["version"].as_i64().unwrap()))
        .collect();
    assert_eq!(items, [("another", 1), ("triage", 2)]);

    let (s, b) = delete(&app, None, "triage").await;
    assert_eq!(s, 204, "{b}");
    let (s, b) = app.get("/v1/flowcharts/triage").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (s, b) = app.get("/v1/flowcharts/triage?version=1").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (s, b) = delete(&app, None, "triage").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (_, list) = app.get("/v1/flowcharts").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    // Registered again: created, numbering on.
    let (s, v3) = put_flowchart(&app, None, "triage", triage("third")).await;
    assert_eq!((s, v3["version"].as_i64()), (201, Some(3)), "{v3}");
    app.stop().await;
}
both_stores!(
    lifecycle,
    flowcharts_are_created_versioned_read_listed_and_deleted
);

async fn a_flowchart_may_not_take_a_tool_name(backend: Backend) {
    let app = spawn(backend, None).await;
    for tool in ["calculator", "ask_user"] {
        let (s, b) = put_flowchart(&app, None, tool, triage("shadow")).await;
        assert_problem(&(s, b), 409, "tool_exists");
    }
    let (_, list) = app.get("/v1/flowcharts").await;
    assert_eq!(list["items"], json!([]));
    app.stop().await;
}
both_stores!(tool_name, a_flowchart_may_not_take_a_tool_name);

async fn every_mistake_is_a_422_naming_its_json_path(backend: Backend) {
    let app = spawn(backend, None).await;
    let stages =
        |stages: Value| json!({"description": "d", "flowchart": {"start": "a", "stages": stages}});
    let cases: Vec<(&str, Value, Vec<&str>, &str)> = vec![
        (
            "unknown stage kind",
            stages(json!({"a": {"kind": "end"}, "triage": {"kind": "foo"}})),
            vec!["/flowchart/stages/triage/kind"],
            "unknown variant `foo`",
        ),
        (
            "a next naming no stage",
            stages(json!({"a": {"kind": "set", "values": {}, "next": "nowhere"}})),
            vec!["/flowchart/stages/a/next"],
            "`nowhere` names no stage",
        ),
        (
            "an unbounded loop",
            stages(json!({
                "a": {"kind": "set", "values": {}, "next": "b"},
                "b": {"kind": "decide", "rules": [{"condition": true, "next": "c"}], "default": "a"},
                "c": {"kind": "end"}
            })),
            vec!["/flowchart/stages/b/default"],
            "unbounded loop: a → b → a",
        ),
        (
            "a loop without a bound",
            stages(json!({
                "a": {"kind": "loop", "condition": true, "body": "b", "maxIterations": 0},
                "b": {"kind": "end"}
            })),
            vec!["/flowchart/stages/a/maxIterations"],
            "unbounded loop",
        ),
        (
            "a bad expression",
            stages(
                json!({"a": {"kind": "end", "result": {"if": [{"=>": [{"var": "args.x"}, 1]}, 1, 2]}}}),
            ),
            vec!["/flowchart/stages/a/result/if/0/=>"],
            "not a JSON Logic operator",
        ),
        (
            "a bad inputSchema",
            json!({"description": "d", "inputSchema": {"type": "object", "properties": {"x": {"type": "strin"}}},
                   "flowchart": {"start": "a", "stages": {"a": {"kind": "end"}}}}),
            vec!["/inputSchema/properties/x/type"],
            "not a valid JSON Schema",
        ),
        (
            "a tool stage naming no tool",
            stages(json!({"a": {"kind": "tool", "tool": "teleport", "output": "o"}})),
            vec!["/flowchart/stages/a/tool"],
            "names no tool",
        ),
        (
            "a missing field",
            stages(json!({"a": {"kind": "tool", "tool": "calculator"}})),
            vec!["/flowchart/stages/a"],
            "missing field `output`",
        ),
    ];
    for (what, body, paths, text) in cases {
        let (s, b) = put_flowchart(&app, None, "broken", body).await;
        assert_invalid(s, &b, &paths);
        assert!(b["detail"].as_str().unwrap().contains(text), "{what}: {b}");
    }

    // Every problem at once, sorted by path.
    let (s, b) = put_flowchart(
        &app,
        None,
        "broken",
        json!({"description": "", "inputSchema": {"type": "array"}, "flowchart": {"start": "zz", "stages": {
            "a": {"kind": "set", "values": {"bad key": 1}, "next": "a"}
        }}}),
    )
    .await;
    assert_invalid(
        s,
        &b,
        &[
            "/description",
            "/flowchart/stages/a/next",
            "/flowchart/stages/a/values/bad key",
            "/flowchart/start",
            "/inputSchema/type",
        ],
    );

    // A name that is not a tool name.
    let (s, b) = put_flowchart(&app, None, "dotted.name", triage("d")).await;
    assert_invalid(s, &b, &["/name"]);

    // Not JSON, and JSON that is not an object, answer like every other route.
    let r = app
        .client
        .put(app.url("/v1/flowcharts/x"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (s, b) = read(r).await;
    assert_problem(&(s, b), 400, "malformed_json");
    let (s, b) = put_flowchart(&app, None, "x", json!([1])).await;
    assert_problem(&(s, b), 422, "validation_failed");

    let (_, list) = app.get("/v1/flowcharts").await;
    assert_eq!(list["items"], json!([]), "nothing invalid was stored");
    app.stop().await;
}
both_stores!(mistakes, every_mistake_is_a_422_naming_its_json_path);

async fn a_sub_flow_cycle_is_refused_naming_the_chain(backend: Backend) {
    let app = spawn(backend, None).await;
    let (s, b) = put_flowchart(&app, None, "a", triage("leaf for now")).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = put_flowchart(&app, None, "b", calls("a")).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = put_flowchart(&app, None, "c", calls("b")).await;
    assert_eq!(s, 201, "{b}");
    // a → c would close a → c → b → a.
    let (s, b) = put_flowchart(&app, None, "a", calls("c")).await;
    assert_invalid(s, &b, &["/flowchart/stages/a/flowchart"]);
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("sub-flow cycle: a → c → b → a"),
        "{b}"
    );
    // Calling itself.
    let (s, b) = put_flowchart(&app, None, "self", calls("self")).await;
    assert_invalid(s, &b, &["/flowchart/stages/a/flowchart"]);
    assert!(b["detail"].as_str().unwrap().contains("self → self"), "{b}");
    // A sub-flow that does not exist, and a tool where a flowchart is due.
    let (s, b) = put_flowchart(&app, None, "d", calls("ghost")).await;
    assert_invalid(s, &b, &["/flowchart/stages/a/flowchart"]);
    let (s, b) = put_flowchart(&app, None, "d", calls("calculator")).await;
    assert_invalid(s, &b, &["/flowchart/stages/a/flowchart"]);
    assert!(b["detail"].as_str().unwrap().contains("is a tool"), "{b}");
    // A flowchart where a tool is due.
    let (s, b) = put_flowchart(
        &app,
        None,
        "d",
        json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "tool", "tool": "b", "output": "o"}}}}),
    )
    .await;
    assert_invalid(s, &b, &["/flowchart/stages/a/tool"]);
    assert!(
        b["detail"].as_str().unwrap().contains("`flow` stage"),
        "{b}"
    );
    let (_, a) = app.get("/v1/flowcharts/a").await;
    assert_eq!(a["version"], 1, "the refused PUT stored nothing: {a}");
    app.stop().await;
}
both_stores!(subflow_cycle, a_sub_flow_cycle_is_refused_naming_the_chain);

async fn flowcharts_belong_to_their_tenant(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into())
    })
    .await;
    let (s, b) = put_flowchart(&app, None, "triage", triage("acme's")).await;
    assert_problem(&(s, b), 401, "unauthorized");
    let (s, b) = put_flowchart(&app, Some("ka"), "triage", triage("acme's")).await;
    assert_eq!(s, 201, "{b}");
    put_flowchart(&app, Some("ka"), "triage", triage("acme's again")).await;

    let (s, b) = app.get_as("kb", "/v1/flowcharts/triage").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (s, b) = app.get_as("kb", "/v1/flowcharts/triage?version=1").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    let (_, list) = app.get_as("kb", "/v1/flowcharts").await;
    assert_eq!(list["items"], json!([]));
    let (s, b) = delete(&app, Some("kb"), "triage").await;
    assert_problem(&(s, b), 404, "flowchart_not_found");
    // Globex may use the same name; its numbering is its own.
    let (s, b) = put_flowchart(&app, Some("kb"), "triage", triage("globex's")).await;
    assert_eq!((s, b["version"].as_i64()), (201, Some(1)), "{b}");
    // A sub-flow names a flowchart of the caller's tenant only.
    let (s, b) = put_flowchart(&app, Some("kb"), "other", calls("acme-only")).await;
    assert_eq!(s, 422, "{b}");
    put_flowchart(&app, Some("ka"), "acme-only", triage("a")).await;
    let (s, b) = put_flowchart(&app, Some("kb"), "other", calls("acme-only")).await;
    assert_invalid(s, &b, &["/flowchart/stages/a/flowchart"]);

    let (_, a) = app.get_as("ka", "/v1/flowcharts/triage").await;
    assert_eq!(
        (a["version"].as_i64(), a["description"].as_str()),
        (Some(2), Some("acme's again"))
    );
    let (s, _) = delete(&app, Some("kb"), "triage").await;
    assert_eq!(s, 204);
    let (s, a) = app.get_as("ka", "/v1/flowcharts/triage").await;
    assert_eq!(s, 200, "globex's delete left acme's alone: {a}");
    app.stop().await;
}
both_stores!(tenants, flowcharts_belong_to_their_tenant);

async fn a_flowchart_is_a_tool_of_its_tenant(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into())
    })
    .await;
    put_flowchart(
        &app,
        Some("ka"),
        "triage",
        triage("Route a refund by amount"),
    )
    .await;
    put_flowchart(&app, Some("ka"), "b_first", calls("triage")).await;

    let (s, cat) = app.get_as("ka", "/v1/tools").await;
    assert_eq!(s, 200, "{cat}");
    let items = cat["items"].as_array().unwrap();
    let names: Vec<&str> = items.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "ask_user",
            "b_first",
            "calculator",
            "current_time",
            "memory_put",
            "memory_search",
            "triage"
        ]
    );
    let t = items.iter().find(|t| t["name"] == "triage").unwrap();
    assert_eq!(t["source"], "flowchart");
    assert_eq!(t["available"], true);
    assert_eq!(t["description"], "Route a refund by amount");
    assert_eq!(t["parameters"], triage("")["inputSchema"]);
    let b = items.iter().find(|t| t["name"] == "b_first").unwrap();
    assert_eq!(
        b["parameters"],
        json!({"type": "object", "properties": {}}),
        "the default input schema"
    );
    let (_, other) = app.get_as("kb", "/v1/tools").await;
    assert!(
        other["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["source"] != "flowchart"),
        "another tenant's catalogue has no flowchart: {other}"
    );

    // A thread may enable it and gate it; another tenant may not name it.
    let config =
        json!({"config": {"tools": ["triage", "calculator"], "requireApproval": ["triage"]}});
    let thread = |key: &'static str, body: Value| {
        let app = &app;
        async move {
            read(
                app.client
                    .post(app.url("/v1/threads"))
                    .bearer_auth(key)
                    .json(&body)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    let (s, b) = thread("ka", config.clone()).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = thread("kb", config.clone()).await;
    assert_problem(&(s, b.clone()), 422, "validation_failed");
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("unknown tool `triage`"),
        "{b}"
    );
    let (s, b) = thread("ka", json!({"config": {"requireApproval": ["ghost"]}})).await;
    assert_problem(&(s, b.clone()), 422, "validation_failed");
    assert!(
        b["detail"].as_str().unwrap().contains("triage"),
        "the flowcharts are among the available: {b}"
    );
    // A run's config is checked the same way.
    let r = app
        .client
        .post(app.url("/v1/threads/t-run/runs"))
        .bearer_auth("kb")
        .json(&json!({"query": "hi", "ifNotExists": "create", "config": {"tools": ["triage"]}}))
        .send()
        .await
        .unwrap();
    let (s, b) = read(r).await;
    assert_problem(&(s, b), 422, "validation_failed");

    // Deleted, it leaves the catalogue and can no longer be enabled.
    delete(&app, Some("ka"), "triage").await;
    let (_, cat) = app.get_as("ka", "/v1/tools").await;
    assert!(
        cat["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["name"] != "triage"),
        "{cat}"
    );
    let (s, b) = thread("ka", config).await;
    assert_problem(&(s, b), 422, "validation_failed");
    app.stop().await;
}
both_stores!(catalogue, a_flowchart_is_a_tool_of_its_tenant);
