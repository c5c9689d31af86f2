//! Flowcharts run directly (`POST /v1/flowcharts/{name}/runs`): a run of `kind: "flowchart"`
//! that runs the flowchart itself, with no model call unless it has `llm` stages. It completes
//! with the flowchart's output as its answer (fake model and offline model alike), on a new
//! thread (counted by the thread quota) or on the client's; input that does not fit is 422 and an
//! unknown or another tenant's flowchart 404; a stage needing approval suspends it and a decision
//! resumes it from its committed steps; a person's rejection fails it; cancel ends it; `llm`
//! stages ask the model under the run's budget; kill -9 in the middle resumes after the last
//! committed stage.

use serde_json::{Value, json};

use crate::both_stores;
use crate::durability::{completed_calls, env, temp_log};
use crate::fake_llm::{FakeLlm, Reply, phase_of};
use crate::helpers::{Backend, TestApp, define_flowchart, put_flowchart, spawn, spawn_with};
use crate::process::Proc;

/// Refund triage: a `set`, the calculator, then a decision.
fn triage() -> Value {
    json!({
        "description": "Triage a refund request: approve, review or escalate.",
        "inputSchema": {
            "type": "object",
            "properties": {"amount": {"type": "number"}, "tier": {"type": "string"}},
            "required": ["amount", "tier"],
            "additionalProperties": false
        },
        "flowchart": {"start": "note", "stages": {
            "note": {"kind": "set", "values": {"seen": {"var": "args.tier"}}, "next": "score"},
            "score": {"kind": "tool", "tool": "calculator",
                      "args": {"expression": {"cat": [{"var": "args.amount"}, "/10"]}},
                      "output": "score", "next": "route"},
            "route": {"kind": "decide", "rules": [
                {"condition": {">": [{"var": "args.amount"}, 1000]}, "next": "escalate"},
                {"condition": {"==": [{"var": "args.tier"}, "gold"]}, "next": "approve"}
            ], "default": "review"},
            "approve": {"kind": "end", "result": {"decision": "approved", "score": {"var": "state.score.result"}}},
            "review": {"kind": "set", "values": {"decision": "review"}},
            "escalate": {"kind": "end", "result": {"decision": "escalated"}}
        }}
    })
}

/// Start a flowchart run (202): the run.
async fn start(app: &TestApp, name: &str, body: Value) -> Value {
    let (status, run) = app.post(&format!("/v1/flowcharts/{name}/runs"), body).await;
    assert_eq!(status, 202, "{run}");
    assert_eq!(run["kind"], "flowchart", "{run}");
    run
}

fn types(obs: &[Value]) -> Vec<&str> {
    obs.iter().map(|o| o["type"].as_str().unwrap()).collect()
}

fn stages(obs: &[Value]) -> Vec<&str> {
    obs.iter()
        .filter(|o| o["type"] == "FLOWCHART_STEP")
        .map(|o| o["content"]["stage"].as_str().unwrap())
        .collect()
}

async fn a_flowchart_run_completes_with_its_output_and_asks_no_model(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(&app, None, "triage", triage()).await;

    let run = start(
        &app,
        "triage",
        json!({"input": {"amount": 40, "tier": "gold"}}),
    )
    .await;
    assert!(run["query"].as_str().unwrap().contains("triage"), "{run}");
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["kind"], "flowchart");
    let output = json!({"decision": "approved", "score": 4});
    assert_eq!(done["finalResponse"]["output"], output, "{done}");
    assert_eq!(
        serde_json::from_str::<Value>(done["finalResponse"]["response"].as_str().unwrap()).unwrap(),
        output
    );
    assert_eq!(done["usage"]["llmCalls"], 0, "{done}");
    assert_eq!(llm.calls(), 0, "no model request: {:?}", llm.requests());

    // Its log: started, the one call with each stage under it, completed with the output.
    let thread = done["threadId"].as_str().unwrap().to_owned();
    let obs = app.observations(&thread).await;
    let kinds = types(&obs);
    assert_eq!(kinds.first(), Some(&"RUN_STARTED"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"RUN_COMPLETED"), "{kinds:?}");
    for absent in ["INTENT", "SYNTHESIS", "THOUGHTS"] {
        assert!(!kinds.contains(&absent), "{absent} in {kinds:?}");
    }
    assert_eq!(stages(&obs), ["note", "score", "route", "approve"]);
    let call = obs.iter().find(|o| o["type"] == "TOOL_CALL").unwrap();
    assert_eq!(call["content"]["name"], "triage");
    assert_eq!(
        call["content"]["arguments"],
        json!({"amount": 40, "tier": "gold"})
    );
    for s in obs.iter().filter(|o| o["type"] == "FLOWCHART_STEP") {
        assert_eq!(s["parentId"], call["id"], "steps nest under the call");
    }
    let fin = obs.iter().find(|o| o["type"] == "FINAL_RESPONSE").unwrap();
    assert_eq!(fin["content"]["output"], output);

    // On the same thread: enqueued like any run, the thread's runs list both.
    let second = start(
        &app,
        "triage",
        json!({"input": {"amount": 2500, "tier": "basic"}, "threadId": thread}),
    )
    .await;
    assert_eq!(second["threadId"], thread.as_str());
    let done = app.settled(&second).await;
    assert_eq!(
        done["finalResponse"]["output"],
        json!({"decision": "escalated"}),
        "{done}"
    );
    let (_, runs) = app.get(&format!("/v1/threads/{thread}/runs")).await;
    let kinds: Vec<&Value> = runs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["kind"])
        .collect();
    assert_eq!(kinds, [&json!("flowchart"), &json!("flowchart")]);
    // No default result mapper trouble: a chain without `end` answers the whole state.
    let review = start(
        &app,
        "triage",
        json!({"input": {"amount": 10, "tier": "basic"}, "threadId": thread}),
    )
    .await;
    let done = app.settled(&review).await;
    assert_eq!(
        done["finalResponse"]["output"]["decision"], "review",
        "{done}"
    );
    assert_eq!(llm.calls(), 0, "still no model request");

    // An ordinary run is an agent run.
    let agent = app.run_wait(&thread, "and now?").await;
    assert_eq!(agent["kind"], "agent", "{agent}");
    app.stop().await;
}
both_stores!(
    completes,
    a_flowchart_run_completes_with_its_output_and_asks_no_model
);

/// With no model configured (the offline model), a flowchart run completes the same way.
async fn the_offline_model_runs_a_flowchart_too(backend: Backend) {
    let app = spawn(backend, None).await;
    define_flowchart(&app, None, "triage", triage()).await;
    let run = start(
        &app,
        "triage",
        json!({"input": {"amount": 40, "tier": "gold"}}),
    )
    .await;
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["finalResponse"]["output"],
        json!({"decision": "approved", "score": 4})
    );
    assert_eq!(done["usage"]["llmCalls"], 0);
    app.stop().await;
}
both_stores!(offline, the_offline_model_runs_a_flowchart_too);

async fn bad_input_unknown_flowcharts_and_other_tenants_are_refused(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("key-a:alpha,key-b:beta".into());
    })
    .await;
    let (st, body) = put_flowchart(&app, Some("key-a"), "triage", triage()).await;
    assert_eq!(st, 201, "{body}");
    let runs = "/v1/flowcharts/triage/runs";

    // Input that does not fit the schema: every problem, at its place under /input.
    let (st, p) = app
        .post_as("key-a", runs, json!({"input": {"amount": "lots"}}))
        .await;
    assert_eq!(
        (st, p["code"].as_str()),
        (422, Some("validation_failed")),
        "{p}"
    );
    let paths: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/input/amount"), "{p}");
    assert!(paths.contains(&"/input/tier"), "{p}");
    assert!(p["detail"].as_str().unwrap().contains("inputSchema"), "{p}");
    for bad in [
        json!({"input": [1, 2]}),
        json!({"input": {"amount": 1, "tier": "gold", "extra": true}}),
        json!({}),
        json!({"input": {"amount": 1, "tier": "gold"}, "query": "x"}),
        json!({"input": {"amount": 1, "tier": "gold"}, "multitaskStrategy": "steer"}),
    ] {
        let (st, p) = app.post_as("key-a", runs, bad.clone()).await;
        assert_eq!(st, 422, "{bad} → {p}");
    }

    // Unknown, and another tenant's, flowchart: not found.
    let input = json!({"input": {"amount": 1, "tier": "gold"}});
    let (st, p) = app
        .post_as("key-a", "/v1/flowcharts/nope/runs", input.clone())
        .await;
    assert_eq!(
        (st, p["code"].as_str()),
        (404, Some("flowchart_not_found")),
        "{p}"
    );
    let (st, p) = app.post_as("key-b", runs, input.clone()).await;
    assert_eq!(
        (st, p["code"].as_str()),
        (404, Some("flowchart_not_found")),
        "{p}"
    );
    let (st, _) = app
        .post_as("key-a", "/v1/flowcharts/n%20o/runs", input.clone())
        .await;
    assert_eq!(st, 404);

    // A thread: missing, another tenant's, or one whose tools leave the flowchart out.
    let with = |t: &str| json!({"input": {"amount": 1, "tier": "gold"}, "threadId": t});
    let (st, p) = app.post_as("key-a", runs, with("missing")).await;
    assert_eq!(
        (st, p["code"].as_str()),
        (404, Some("thread_not_found")),
        "{p}"
    );
    let (st, _) = app
        .post_as("key-b", "/v1/threads", json!({"threadId": "bees"}))
        .await;
    assert_eq!(st, 201);
    let (st, p) = app.post_as("key-a", runs, with("bees")).await;
    assert_eq!(
        (st, p["code"].as_str()),
        (404, Some("thread_not_found")),
        "{p}"
    );
    let (st, _) = app
        .post_as(
            "key-a",
            "/v1/threads",
            json!({"threadId": "narrow", "config": {"tools": ["calculator"]}}),
        )
        .await;
    assert_eq!(st, 201);
    let (st, p) = app.post_as("key-a", runs, with("narrow")).await;
    assert_eq!(
        (st, p["code"].as_str()),
        (422, Some("tool_not_enabled")),
        "{p}"
    );

    // Nothing was run by any of it.
    let (_, threads) = app.get_as("key-a", "/v1/threads").await;
    assert_eq!(threads["items"].as_array().unwrap().len(), 1, "{threads}");
    app.stop().await;
}
both_stores!(
    refused,
    bad_input_unknown_flowcharts_and_other_tenants_are_refused
);

/// A new thread per run counts against `PES_TENANT_MAX_THREADS`; a run on an existing thread
/// makes none.
async fn a_new_thread_counts_against_the_thread_quota(backend: Backend) {
    let app = spawn_with(backend, None, |c| c.tenant_max_threads = 1).await;
    define_flowchart(&app, None, "triage", triage()).await;
    let input = json!({"amount": 1, "tier": "gold"});
    let first = start(&app, "triage", json!({"input": input})).await;
    let (st, p) = app
        .post("/v1/flowcharts/triage/runs", json!({"input": input}))
        .await;
    assert_eq!(
        (st, p["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{p}"
    );
    start(
        &app,
        "triage",
        json!({"input": input, "threadId": first["threadId"]}),
    )
    .await;
    app.stop().await;
}
both_stores!(thread_quota, a_new_thread_counts_against_the_thread_quota);

async fn approval_suspends_a_flowchart_run_and_a_decision_resumes_it(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(&app, None, "triage", triage()).await;

    // A tool stage needing approval suspends the run there; approving resumes it in place.
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let input = json!({"amount": 40, "tier": "gold"});
    let run = start(&app, "triage", json!({"input": input, "threadId": t})).await;
    let waiting = app.settled(&run).await;
    assert_eq!(waiting["status"], "suspended", "{waiting}");
    let s = &waiting["suspension"];
    assert_eq!(s["kind"], "approval");
    assert_eq!(s["toolCall"]["name"], "calculator");
    assert_eq!(s["toolCall"]["arguments"], json!({"expression": "40/10"}));
    assert_eq!(
        stages(&app.observations(&t).await),
        ["note"],
        "paused at `score`"
    );
    let sid = s["suspensionId"].as_str().unwrap();
    let (st, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "edit", "modifiedArgs": {"expression": "7*10"}}),
        )
        .await;
    assert_eq!(st, 202, "{b}");
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["finalResponse"]["output"],
        json!({"decision": "approved", "score": 70})
    );
    let obs = app.observations(&t).await;
    assert_eq!(
        stages(&obs),
        ["note", "score", "route", "approve"],
        "each stage once: the committed one was replayed, not run again"
    );
    assert!(types(&obs).contains(&"AGENT_RESUMED"), "{:?}", types(&obs));

    // The whole flowchart needing approval: a rejection fails the run, nothing ran.
    let t = app
        .thread(json!({"config": {"requireApproval": ["triage"]}}))
        .await;
    let run = start(&app, "triage", json!({"input": input, "threadId": t})).await;
    let waiting = app.settled(&run).await;
    assert_eq!(waiting["status"], "suspended", "{waiting}");
    assert_eq!(waiting["suspension"]["toolCall"]["name"], "triage");
    let sid = waiting["suspension"]["suspensionId"].as_str().unwrap();
    let (st, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "reject", "reason": "not today"}),
        )
        .await;
    assert_eq!(st, 202, "{b}");
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "flowchart_rejected");
    assert!(
        done["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not today")
    );
    assert!(
        stages(&app.observations(&t).await).is_empty(),
        "nothing ran"
    );

    // Cancelled while it waits: it ends, and nothing of it runs.
    let run = start(&app, "triage", json!({"input": input, "threadId": t})).await;
    let waiting = app.settled(&run).await;
    assert_eq!(waiting["status"], "suspended", "{waiting}");
    let (st, b) = app
        .post(
            &format!(
                "/v1/threads/{t}/runs/{}/cancel",
                run["runId"].as_str().unwrap()
            ),
            json!({}),
        )
        .await;
    assert_eq!(st, 202, "{b}");
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(stages(&app.observations(&t).await).is_empty());
    assert_eq!(llm.calls(), 0, "no model request");
    app.stop().await;
}
both_stores!(
    approval,
    approval_suspends_a_flowchart_run_and_a_decision_resumes_it
);

/// `llm` stages ask the run's model (and only they): their usage is the run's, under its budget.
async fn llm_stages_ask_the_model_under_the_runs_budget(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(
        &app,
        None,
        "summarize",
        json!({
            "description": "Summarize a text.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"]},
            "flowchart": {"start": "ask", "stages": {
                "ask": {"kind": "llm", "prompt": {"cat": ["Summarize: ", {"var": "args.text"}]},
                        "output": "summary", "next": "done"},
                "done": {"kind": "end", "result": {"summary": {"var": "state.summary"}}}
            }}
        }),
    )
    .await;
    llm.push("flowchart", Reply::Text("short".into()));
    let run = start(&app, "summarize", json!({"input": {"text": "a long text"}})).await;
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["finalResponse"]["output"], json!({"summary": "short"}));
    assert_eq!(done["usage"]["llmCalls"], 1, "{done}");
    let phases: Vec<&str> = llm.requests().iter().map(phase_of).collect();
    assert_eq!(phases, ["flowchart"], "the stage's request only");

    // A thread whose budget cannot pay for the stage: the stage is refused, the run fails.
    let t = app
        .thread(json!({"config": {"budget": {"maxTokens": 1, "onExceed": "fail"}}}))
        .await;
    let run = start(
        &app,
        "summarize",
        json!({"input": {"text": "a long text"}, "threadId": t}),
    )
    .await;
    let done = app.settled(&run).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "flowchart_failed");
    assert!(
        done["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget"),
        "{done}"
    );
    assert_eq!(llm.calls(), 1, "the refused stage asked nothing");
    app.stop().await;
}
both_stores!(llm_stages, llm_stages_ask_the_model_under_the_runs_budget);

/// kill -9 while a flowchart run's second stage runs: the new process resumes the run after the
/// last committed stage; the first stage's tool never runs again, and the run completes with the
/// output.
async fn kill_9_in_the_middle_of_a_flowchart_run(backend: Backend) {
    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(backend).await;
    let p1 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let spec = json!({
        "description": "Two slow steps.",
        "flowchart": {"start": "a", "stages": {
            "a": {"kind": "tool", "tool": "debug_sleep", "args": {"ms": 10, "tag": "fa"}, "output": "a", "next": "b"},
            "b": {"kind": "tool", "tool": "debug_sleep", "args": {"ms": 4000, "tag": "fb"}, "output": "b", "next": "c"},
            "c": {"kind": "end", "result": {"a": {"var": "state.a.tag"}, "b": {"var": "state.b.tag"}}}
        }}
    });
    let r = p1
        .client
        .put(p1.url("/v1/flowcharts/sleepy"))
        .json(&spec)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let (s, run) = p1
        .post("/v1/flowcharts/sleepy/runs", json!({"input": {}}))
        .await;
    assert_eq!(s, 202, "{run}");
    let t = run["threadId"].as_str().unwrap().to_owned();
    // Stage a committed: b is running (for 4 s).
    p1.wait_for(
        &format!("/v1/threads/{t}/observations?type=FLOWCHART_STEP"),
        |page| page["items"].as_array().is_some_and(|i| !i.is_empty()),
    )
    .await;
    p1.kill9().await;
    assert_eq!(completed_calls(&log).get("fb"), None, "b was cut off");

    let p2 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let run_id = run["runId"].as_str().unwrap();
    let done = p2
        .wait_for(&format!("/v1/threads/{t}/runs/{run_id}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(
        done["finalResponse"]["output"],
        json!({"a": "fa", "b": "fb"}),
        "{done}"
    );
    let calls = completed_calls(&log);
    assert_eq!(
        calls.get("fa"),
        Some(&1),
        "the committed stage never ran again: {calls:?}"
    );
    assert_eq!(calls.get("fb"), Some(&1), "{calls:?}");
    let (_, page) = p2
        .get(&format!("/v1/threads/{t}/observations?type=FLOWCHART_STEP"))
        .await;
    let steps: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["content"]["stage"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["a", "b", "c"]);
    assert_eq!(
        llm.calls(),
        0,
        "no model request, before or after the crash"
    );
    p2.kill9().await;
    let _ = std::fs::remove_file(&log);
}
both_stores!(kill_9, kill_9_in_the_middle_of_a_flowchart_run);
