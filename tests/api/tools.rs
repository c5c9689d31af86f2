//! The tool catalogue (`GET /v1/tools`) and full JSON Schema validation of what reaches a tool:
//! arguments the model sends, `modifiedArgs` a person sends, and answers to an `inputSchema`.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, spawn, spawn_with};

async fn catalogue_lists_every_builtin_with_its_schema(backend: Backend) {
    let app = spawn(backend, None).await;
    let (st, body) = app.get("/v1/tools").await;
    assert_eq!(st, 200, "{body}");
    let names: Vec<&str> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ask_user",
            "calculator",
            "current_time",
            "memory_put",
            "memory_search"
        ]
    );
    let calc = &body["items"][1];
    assert_eq!(calc["source"], "builtin");
    assert_eq!(calc["available"], true);
    assert!(calc.get("server").is_none(), "{calc}");
    assert_eq!(calc["parameters"]["required"], json!(["expression"]));
    assert!(calc["description"].as_str().unwrap().len() > 10);
    assert_eq!(body["servers"], json!([]));
    app.stop().await;

    let app = spawn_with(backend, None, |c| c.api_keys = Some("k1:acme".into())).await;
    let (st, body) = app.get("/v1/tools").await;
    assert_eq!(st, 401, "the catalogue is behind the API keys: {body}");
    app.stop().await;
}
both_stores!(catalogue, catalogue_lists_every_builtin_with_its_schema);

/// A `pattern`, a `format`, a `$ref` and an `allOf` in an `inputSchema` all hold: an answer that
/// breaks any of them is 422 naming its JSON path, and the suspension stays pending.
async fn input_schema_answers_are_checked_against_the_whole_schema(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[("s1", "Ask for contact details", &["ask_user"], &[])]),
    );
    let schema = json!({
        "type": "object",
        "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "allOf": [{"required": ["email"]}, {"required": ["country"]}],
        "properties": {
            "email": {"type": "string", "format": "email"},
            "country": {"$ref": "#/$defs/code"}
        },
        "not": {"required": ["password"]}
    });
    llm.push(
        "execute",
        Reply::ToolCalls(vec![(
            "ask_user".into(),
            json!({"question": "Contact?", "inputSchema": schema}),
        )]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "contact me").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/suspensions/{sid}/resume");
    for (answer, at) in [
        (json!({"email": "nope", "country": "FRA"}), "/email"),
        (json!({"email": "a@b.org", "country": "fr"}), "/country"),
        (json!({"email": "a@b.org"}), "/country"),
        (
            json!({"email": "a@b.org", "country": "FRA", "password": "x"}),
            "/",
        ),
    ] {
        let (st, b) = app
            .post(&path, json!({"decision": "respond", "response": answer}))
            .await;
        assert_eq!(st, 422, "{answer} → {b}");
        let detail = b["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("{at}: ")) || detail.contains(&format!("{at}/")),
            "{answer} → {detail}"
        );
    }
    let (st, b) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!((st, b["status"].as_str()), (200, Some("pending")), "{b}");
    let (st, b) = app
        .post(
            &path,
            json!({"decision": "respond", "response": {"email": "a@b.org", "country": "FRA"}}),
        )
        .await;
    assert_eq!(st, 202, "{b}");
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    app.stop().await;
}
both_stores!(
    input_schema,
    input_schema_answers_are_checked_against_the_whole_schema
);

/// The model's arguments are checked before the tool runs; an `inputSchema` the model gives
/// `ask_user` that is not a schema is refused as the model's error, not suspended on.
async fn bad_arguments_reach_the_model_with_their_path(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[("s1", "Compute", &["calculator", "ask_user"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            (
                "calculator".into(),
                json!({"expression": 42, "precision": 2}),
            ),
            (
                "ask_user".into(),
                json!({"question": "?", "inputSchema": {"type": "bogus"}}),
            ),
        ]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "compute").await;
    assert_eq!(run["status"], "completed", "{run}");
    let second = llm.requests_of("execute")[1].to_string();
    assert!(
        second.contains(r#"/expression: 42 is not of type \\\"string\\\""#),
        "{second}"
    );
    assert!(second.contains("/precision: unknown property"), "{second}");
    assert!(second.contains("/inputSchema: schema at /type"), "{second}");
    let (_, obs) = app.get(&format!("/v1/threads/{t}/observations")).await;
    let errors: Vec<&Value> = obs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .collect();
    assert_eq!(errors.len(), 2, "{obs}");
    app.stop().await;
}
both_stores!(arguments, bad_arguments_reach_the_model_with_their_path);

/// A role's `tools` must name tools, like the thread's own lists.
async fn role_tools_must_be_tools(backend: Backend) {
    let app = spawn(backend, None).await;
    let role = |tools: Value| {
        json!({"config": {"roles": {"analyst": {
            "name": "Analyst", "systemPromptFragment": "numbers", "tools": tools}}}})
    };
    let (st, b) = app
        .post("/v1/threads", role(json!(["calculator", "nope"])))
        .await;
    assert_eq!(st, 422, "{b}");
    let detail = b["detail"].as_str().unwrap();
    assert!(
        detail.contains("config.roles.analyst.tools names unknown tool `nope`"),
        "{detail}"
    );
    let (st, b) = app.post("/v1/threads", role(json!(["calculator"]))).await;
    assert_eq!(st, 201, "{b}");
    app.stop().await;
}
both_stores!(roles, role_tools_must_be_tools);
