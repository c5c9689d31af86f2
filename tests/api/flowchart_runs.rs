//! Flowcharts called in runs, through the HTTP API: a decision with its evidence in the tree,
//! select and loop, a sub-flow nested under its stage, two calls that share nothing, a stage error
//! and the step limit as tool errors, approval of a whole flowchart and of a tool stage, the
//! offline model calling one, and kill -9 in the middle of a flowchart resuming after the last
//! committed stage without repeating it. Evaluation bounds: expressions that would need gigabytes
//! or hours end as tool errors while `/healthz` keeps answering, and are not evaluated again after
//! a restart; values over `PES_FLOWCHART_MAX_VALUE_BYTES`; `tool` stages calling only what the
//! calling item may call.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::both_stores;
use crate::durability::{completed_calls, env, temp_log};
use crate::fake_llm::{FakeLlm, Reply, phase_of, plan, plan_item};
use crate::helpers::{
    Backend, TestApp, define_flowchart, of_type, spawn, spawn_config, spawn_with, test_config,
};
use crate::process::Proc;

/// Refund triage: scores the amount with the calculator, then decides.
fn triage() -> Value {
    json!({
        "description": "Triage a refund request: approve, review or escalate.",
        "inputSchema": {
            "type": "object",
            "properties": {"amount": {"type": "number"}, "tier": {"type": "string"}},
            "required": ["amount", "tier"],
            "additionalProperties": false
        },
        "flowchart": {"start": "score", "stages": {
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

/// Run one item that calls `calls` in one model turn; the run.
async fn run_calls(
    app: &TestApp,
    llm: &FakeLlm,
    tools: &[&str],
    calls: Vec<(&str, Value)>,
) -> (String, Value) {
    llm.push("plan", plan(&[("s1", "Use the flowchart", tools, &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(calls.into_iter().map(|(n, a)| (n.to_owned(), a)).collect()),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "go").await;
    (t, run)
}

async fn a_decision_and_its_evidence_land_in_the_tree(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(&app, None, "triage", triage()).await;
    let (st, cat) = app.get("/v1/tools").await;
    assert_eq!(st, 200);
    let entry = cat["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "triage")
        .cloned();
    assert_eq!(
        entry.as_ref().map(|e| e["source"].clone()),
        Some(json!("flowchart")),
        "{cat}"
    );

    let (t, run) = run_calls(
        &app,
        &llm,
        &["triage"],
        vec![("triage", json!({"amount": 40, "tier": "gold"}))],
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let call = of_type(&obs, "TOOL_CALL")[0];
    let steps = of_type(&obs, "FLOWCHART_STEP");
    let stages: Vec<&str> = steps
        .iter()
        .map(|s| s["content"]["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["score", "route", "approve"]);
    for s in &steps {
        assert_eq!(s["parentId"], call["id"], "steps nest under the TOOL_CALL");
        assert_eq!(s["content"]["flowchart"], "triage");
        assert_eq!(s["content"]["version"], 1);
        assert!(s["content"]["durationMs"].is_u64());
    }
    let route = &steps[1]["content"];
    assert_eq!(route["kind"], "decide");
    assert_eq!(route["decision"]["chosen"], "approve");
    assert_eq!(
        route["decision"]["rules"][0]["inputs"],
        json!({"args.amount": 40})
    );
    assert_eq!(route["decision"]["rules"][0]["matched"], false);
    assert_eq!(
        route["decision"]["rules"][1]["inputs"],
        json!({"args.tier": "gold"})
    );
    assert_eq!(route["decision"]["rules"][1]["matched"], true);
    assert_eq!(steps[0]["content"]["writes"]["score"]["result"], 4);
    let exec = of_type(&obs, "TOOL_EXECUTION")[0];
    assert_eq!(
        exec["content"]["output"],
        json!({"decision": "approved", "score": 4})
    );
    // Bad arguments never start the flowchart.
    let (t, run) = run_calls(
        &app,
        &llm,
        &["triage"],
        vec![("triage", json!({"amount": "x"}))],
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    assert!(of_type(&obs, "FLOWCHART_STEP").is_empty());
    let err = of_type(&obs, "TOOL_EXECUTION")[0]["content"]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(err.contains("/amount") && err.contains("/tier"), "{err}");
    app.stop().await;
}
both_stores!(decide, a_decision_and_its_evidence_land_in_the_tree);

async fn select_loop_sub_flows_and_isolated_calls(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(
        &app,
        None,
        "counter",
        json!({
            "description": "Counts from a fresh state.",
            "flowchart": {"start": "inc", "stages": {
                "inc": {"kind": "set", "values": {"n": {"+": [{"var": ["state.n", 0]}, 1]}}}
            }}
        }),
    )
    .await;
    define_flowchart(&app, None, "tally", json!({
        "description": "Adds args.times ones, then classifies.",
        "inputSchema": {"type": "object", "properties": {"times": {"type": "integer"}}, "required": ["times"]},
        "flowchart": {"start": "init", "stages": {
            "init": {"kind": "set", "values": {"total": 0}, "next": "repeat"},
            "repeat": {"kind": "loop", "condition": {"<": [{"var": "state.total"}, {"var": "args.times"}]},
                       "body": "add", "maxIterations": 10, "next": "classify"},
            "add": {"kind": "set", "values": {"total": {"+": [{"var": "state.total"}, 1]}}},
            "classify": {"kind": "select", "rules": [
                {"condition": {">": [{"var": "state.total"}, 2]}, "branch": "big"},
                {"condition": {"<": [{"var": "state.total"}, 0]}, "branch": "negative"},
                {"condition": true, "branch": "seen"}
            ], "next": "sub"},
            "big": {"kind": "set", "values": {"big": true}},
            "negative": {"kind": "set", "values": {"negative": true}},
            "seen": {"kind": "set", "values": {"seen": true}},
            "sub": {"kind": "flow", "flowchart": "counter", "output": "counted", "next": "done"},
            "done": {"kind": "end", "result": {"total": {"var": "state.total"}, "big": {"var": "state.big"},
                     "seen": {"var": "state.seen"}, "counted": {"var": "state.counted.n"}}}
        }}
    })).await;
    let (t, run) = run_calls(
        &app,
        &llm,
        &["tally", "counter"],
        vec![
            ("tally", json!({"times": 3})),
            ("counter", json!({})),
            ("counter", json!({})),
        ],
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let execs = of_type(&obs, "TOOL_EXECUTION");
    let outputs: Vec<&Value> = execs.iter().map(|e| &e["content"]["output"]).collect();
    assert_eq!(
        outputs[0],
        &json!({"total": 3, "big": true, "seen": true, "counted": 1})
    );
    assert_eq!(outputs[1], &json!({"n": 1}), "a fresh state per call");
    assert_eq!(outputs[2], &json!({"n": 1}), "a fresh state per call");
    let tally_call = of_type(&obs, "TOOL_CALL")[0]["content"]["toolCallId"].clone();
    let steps: Vec<&Value> = of_type(&obs, "FLOWCHART_STEP")
        .into_iter()
        .filter(|s| s["content"]["toolCallId"] == tally_call)
        .collect();
    let stages: Vec<&str> = steps
        .iter()
        .map(|s| s["content"]["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "init", "repeat", "add", "repeat", "add", "repeat", "add", "repeat", "classify", "big",
            "seen", "inc", "sub", "done"
        ]
    );
    let classify = steps[8];
    assert_eq!(
        classify["content"]["decision"]["chosen"],
        json!(["big", "seen"])
    );
    let sub_step = steps[12];
    let sub_child = steps[11];
    assert_eq!(
        sub_child["parentId"], sub_step["id"],
        "sub-flow stages nest under their flow stage"
    );
    // A sub-flow's step names the sub-flow and its own stage; `path` is where the call is.
    assert_eq!(sub_child["content"]["flowchart"], "counter");
    assert_eq!(sub_child["content"]["stage"], "inc");
    assert_eq!(sub_child["content"]["path"], "sub/inc");
    assert_eq!(sub_child["title"], "counter: inc (set)");
    assert_eq!(sub_step["content"]["flowchart"], "tally");
    assert_eq!(sub_step["content"]["stage"], "sub");
    let loop_rounds: Vec<&Value> = steps
        .iter()
        .filter(|s| s["content"]["stage"] == "repeat")
        .map(|s| &s["content"]["iteration"])
        .collect();
    assert_eq!(loop_rounds, [&json!(1), &json!(2), &json!(3), &json!(4)]);
    app.stop().await;
}
both_stores!(graph, select_loop_sub_flows_and_isolated_calls);

async fn stage_errors_and_the_step_limit_are_tool_errors(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.flowchart_max_steps = 6).await;
    define_flowchart(&app, None, "divide", json!({
        "description": "Divides by zero.",
        "flowchart": {"start": "d", "stages": {
            "d": {"kind": "tool", "tool": "calculator", "args": {"expression": "1/0"}, "output": "x"}
        }}
    })).await;
    define_flowchart(
        &app,
        None,
        "spin",
        json!({
            "description": "Loops for long.",
            "flowchart": {"start": "l", "stages": {
                "l": {"kind": "loop", "condition": true, "body": "b", "maxIterations": 1000},
                "b": {"kind": "set", "values": {"x": 1}}
            }}
        }),
    )
    .await;
    let (t, run) = run_calls(
        &app,
        &llm,
        &["divide", "spin"],
        vec![("divide", json!({})), ("spin", json!({}))],
    )
    .await;
    assert_eq!(run["status"], "completed", "the run goes on: {run}");
    let obs = app.observations(&t).await;
    let execs = of_type(&obs, "TOOL_EXECUTION");
    let e0 = execs[0]["content"]["error"].as_str().unwrap();
    assert!(
        e0.contains("stage `d`") && e0.contains("division by zero"),
        "{e0}"
    );
    let e1 = execs[1]["content"]["error"].as_str().unwrap();
    assert!(e1.contains("limit of 6 stages"), "{e1}");
    let second = llm.requests_of("execute")[1].to_string();
    assert!(
        second.contains("division by zero"),
        "the model read the error"
    );
    app.stop().await;
}
both_stores!(errors, stage_errors_and_the_step_limit_are_tool_errors);

async fn a_flowchart_and_a_tool_stage_wait_for_approval(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(&app, None, "triage", triage()).await;
    // The whole call waits for a person.
    llm.push("plan", plan(&[("s1", "Triage", &["triage"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![(
            "triage".into(),
            json!({"amount": 40, "tier": "gold"}),
        )]),
    );
    let t = app
        .thread(json!({"config": {"requireApproval": ["triage"]}}))
        .await;
    let run = app.run_wait(&t, "triage it").await;
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(run["suspension"]["toolCall"]["name"], "triage");
    assert!(
        of_type(&app.observations(&t).await, "FLOWCHART_STEP").is_empty(),
        "nothing ran"
    );
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (st, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(st, 202);
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed");
    assert_eq!(
        of_type(&app.observations(&t).await, "FLOWCHART_STEP").len(),
        3
    );

    // A tool stage whose tool needs approval pauses the flowchart there; it resumes in place.
    llm.push("plan", plan(&[("s1", "Triage", &["triage"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![(
            "triage".into(),
            json!({"amount": 40, "tier": "gold"}),
        )]),
    );
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "triage it").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let s = &run["suspension"];
    assert_eq!(s["toolCall"]["name"], "calculator");
    assert_eq!(s["toolCall"]["arguments"], json!({"expression": "40/10"}));
    assert!(
        s["toolCall"]["id"].as_str().unwrap().ends_with(":score:1"),
        "{s}"
    );
    let sid = s["suspensionId"].as_str().unwrap();
    let (st, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "edit", "modifiedArgs": {"expression": "7*10"}}),
        )
        .await;
    assert_eq!(st, 202, "{b}");
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let obs = app.observations(&t).await;
    let stages: Vec<&str> = of_type(&obs, "FLOWCHART_STEP")
        .iter()
        .map(|s| s["content"]["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["score", "route", "approve"], "each stage once");
    let exec = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(
        exec.last().unwrap()["content"]["output"],
        json!({"decision": "approved", "score": 70})
    );
    app.stop().await;
}
both_stores!(approval, a_flowchart_and_a_tool_stage_wait_for_approval);

/// With no model configured, the offline model calls a flowchart the query names.
#[tokio::test]
async fn the_offline_model_calls_a_flowchart_the_query_names() {
    let app = spawn(Backend::Sqlite, None).await;
    define_flowchart(&app, None, "triage", triage()).await;
    let t = app.thread(json!({})).await;
    let run = app
        .run_wait(&t, r#"Call triage with {"amount": 2500, "tier": "basic"}"#)
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    let answer = run["finalResponse"]["response"].as_str().unwrap();
    assert!(answer.contains("escalated"), "{answer}");
    app.stop().await;
}

/// kill -9 while a flowchart's second stage runs: the new process resumes the call after the
/// last committed stage; the first stage's tool never runs again, the second runs again under
/// the same idempotency key, and every stage has one step in the tree.
async fn kill_9_in_the_middle_of_a_flowchart(backend: Backend) {
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
    llm.push("plan", plan(&[("s1", "Sleep", &["sleepy"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("sleepy".into(), json!({}))]),
    );
    let (s, _) = p1.post("/v1/threads", json!({"threadId": "t"})).await;
    assert_eq!(s, 201);
    let (s, run) = p1.post("/v1/threads/t/runs", json!({"query": "go"})).await;
    assert_eq!(s, 202, "{run}");
    // Stage a committed: b is running (for 4 s).
    p1.wait_for("/v1/threads/t/observations?type=FLOWCHART_STEP", |page| {
        page["items"].as_array().is_some_and(|i| !i.is_empty())
    })
    .await;
    p1.kill9().await;
    assert_eq!(completed_calls(&log).get("fb"), None, "b was cut off");

    let p2 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let run_id = run["runId"].as_str().unwrap();
    let done = p2
        .wait_for(&format!("/v1/threads/t/runs/{run_id}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    let calls = completed_calls(&log);
    assert_eq!(
        calls.get("fa"),
        Some(&1),
        "the committed stage never ran again: {calls:?}"
    );
    assert_eq!(calls.get("fb"), Some(&1), "{calls:?}");
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(
        lines
            .lines()
            .any(|l| l.starts_with("fb ") && l.ends_with(":b:1")),
        "{lines}"
    );
    let (_, page) = p2
        .get("/v1/threads/t/observations?type=FLOWCHART_STEP")
        .await;
    let stages: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["content"]["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["a", "b", "c"]);
    let (_, page) = p2
        .get("/v1/threads/t/observations?type=TOOL_EXECUTION")
        .await;
    assert_eq!(
        page["items"][0]["content"]["output"],
        json!({"a": "fa", "b": "fb"})
    );
    p2.kill9().await;
    let _ = std::fs::remove_file(&log);
}
both_stores!(kill_9, kill_9_in_the_middle_of_a_flowchart);

/// `llm` stages ask the thread's model (plain, and structured with `outputSchema`), and what
/// they use is counted in the run's usage.
async fn llm_stages_ask_the_model(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(&app, None, "summarize", json!({
        "description": "Classifies a ticket with the model.",
        "inputSchema": {"type": "object", "properties": {"ticket": {"type": "string"}}, "required": ["ticket"]},
        "flowchart": {"start": "plain", "stages": {
            "plain": {"kind": "llm", "prompt": {"cat": ["Summarize: ", {"var": "args.ticket"}]}, "output": "summary", "next": "classify"},
            "classify": {"kind": "llm", "prompt": {"cat": ["Classify: ", {"var": "state.summary"}]},
                         "outputSchema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
                         "output": "class"},
        }},
        "resultMapper": {"summary": {"var": "state.summary"}, "class": {"var": "state.class.answer"}}
    })).await;
    let (t, run) = run_calls(
        &app,
        &llm,
        &["summarize"],
        vec![("summarize", json!({"ticket": "printer on fire"}))],
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let exec = of_type(&obs, "TOOL_EXECUTION")[0];
    assert_eq!(
        exec["content"]["output"],
        json!({"summary": "model: Summarize: printer on fire", "class": "Classify: model: Summarize: printer on fire"})
    );
    let requests = llm.requests_of("flowchart");
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1]["response_format"]["json_schema"]["name"],
        "pes_flowchart"
    );
    // plan + execute ×2 + 2 flowchart stages + synthesis
    assert_eq!(run["usage"]["llmCalls"], 6, "{run}");
    app.stop().await;
}
both_stores!(llm, llm_stages_ask_the_model);

/// The process's resident memory, in bytes (the app runs in this process).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Polls `/healthz` every ~10 ms until stopped: the slowest answer, how many, and the highest
/// resident memory seen.
fn poll_healthz(
    app: &TestApp,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Duration, u32, u64)> {
    let client = app.client.clone();
    let url = app.url("/healthz");
    tokio::spawn(async move {
        let (mut slowest, mut answers, mut peak) = (Duration::ZERO, 0, 0);
        while !stop.load(Ordering::Relaxed) {
            let asked = Instant::now();
            let r = client.get(&url).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            let _ = r.bytes().await.unwrap();
            slowest = slowest.max(asked.elapsed());
            answers += 1;
            peak = peak.max(rss_bytes());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (slowest, answers, peak)
    })
}

/// `n` numbers, for literal arrays in expressions.
fn range(n: u32) -> Vec<u32> {
    (0..n).collect()
}

/// Three flowcharts that would each take the process down: a string doubled 30 times in a
/// `reduce` (16 GiB), an array doubled 30 times sharing its elements (cheap to build, terabytes
/// to write out), and `some` inside `some` over 3,000 elements (9 million checks, each cheap).
/// Each ends as a tool error naming its stage, while `/healthz` answers every ~10 ms within
/// 100 ms and the process grows by less than 200 MB; the failed stage's step records the error.
/// Then the app stops in the middle of the run and another takes the run over on the same
/// database: the run completes and no stage was evaluated again (one step each).
async fn expression_bombs_are_tool_errors_and_never_run_again(backend: Backend) {
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    let config = || {
        let mut c = test_config(&db, Some(&llm));
        c.lease_seconds = 3;
        c.shutdown_grace_seconds = 1;
        c
    };
    let app = spawn_config(config()).await;
    let seed = |stage: &str, expr: Value| {
        json!({
            "description": "Grows a value.",
            "flowchart": {"start": "seed", "stages": {
                "seed": {"kind": "set", "values": {"s": "0123456789abcdef"}, "next": stage},
                stage: {"kind": "set", "values": {"big": expr}, "next": "done"},
                "done": {"kind": "end", "result": "never reached"}
            }}
        })
    };
    let acc = json!({"var": "accumulator"});
    define_flowchart(
        &app,
        None,
        "doubler",
        seed(
            "grow",
            json!({"reduce": [range(30), {"cat": [acc, acc]}, {"var": "state.s"}]}),
        ),
    )
    .await;
    define_flowchart(
        &app,
        None,
        "sharer",
        seed(
            "share",
            json!({"reduce": [range(30), {"merge": [acc, acc]}, [{"var": "state.s"}]]}),
        ),
    )
    .await;
    define_flowchart(
        &app,
        None,
        "spinner",
        seed(
            "spin",
            json!({"some": [range(3000), {"some": [range(3000), {"<": [{"var": ""}, -1]}]}]}),
        ),
    )
    .await;

    // The model's turn after the three tool errors waits until the app is replaced.
    let after_errors =
        |r: &Value| phase_of(r) == "execute" && r.to_string().contains("flowchart stopped");
    llm.hold_if(after_errors);
    llm.push(
        "plan",
        plan(&[("s1", "Grow things", &["doubler", "sharer", "spinner"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            ("doubler".into(), json!({})),
            ("sharer".into(), json!({})),
            ("spinner".into(), json!({})),
        ]),
    );
    llm.push("execute", Reply::Text("Nothing could be grown.".into()));

    let before = rss_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = poll_healthz(&app, stop.clone());
    let t = app.thread(json!({})).await;
    let (st, run) = app
        .post(&format!("/v1/threads/{t}/runs"), json!({"query": "grow"}))
        .await;
    assert_eq!(st, 202, "{run}");
    let run_id = run["runId"].as_str().unwrap().to_owned();
    let started = Instant::now();
    llm.wait_for_request(after_errors).await;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (slowest, answers, peak) = poller.await.unwrap();
    assert!(answers > 3, "{answers} answers in {took:?}");
    assert!(
        slowest < Duration::from_millis(100),
        "/healthz took {slowest:?} while the bombs went off ({answers} answers)"
    );
    let grown = peak.saturating_sub(before);
    assert!(grown < 200 << 20, "the process grew by {} MB", grown >> 20);

    let obs = app.observations(&t).await;
    let errors: Vec<String> = of_type(&obs, "TOOL_EXECUTION")
        .iter()
        .map(|e| {
            e["content"]["error"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    for (stage, limit) in [
        ("grow", "PES_FLOWCHART_MAX_VALUE_BYTES"),
        ("share", "PES_FLOWCHART_"),
        ("spin", "PES_FLOWCHART_"),
    ] {
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&format!("stage `{stage}`")) && e.contains(limit)),
            "{stage}: {errors:?}"
        );
    }
    let step_of = |obs: &[Value], stage: &str| -> Vec<Value> {
        of_type(obs, "FLOWCHART_STEP")
            .into_iter()
            .filter(|s| s["content"]["stage"] == stage)
            .cloned()
            .collect()
    };
    for stage in ["grow", "share", "spin"] {
        let steps = step_of(&obs, stage);
        assert_eq!(steps.len(), 1, "{stage}: {steps:?}");
        assert!(
            steps[0]["content"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("PES_FLOWCHART_")),
            "the step records the error: {}",
            steps[0]
        );
    }

    // The app stops in the middle of the run; another takes it over on the same database.
    app.stop().await;
    llm.release();
    let app = spawn_config(config()).await;
    let done = app
        .wait_run(&t, &run_id, |r| r["status"] == "completed")
        .await;
    assert_eq!(done["attempt"], 2, "taken over: {done}");
    let obs = app.observations(&t).await;
    for stage in ["grow", "share", "spin"] {
        assert_eq!(step_of(&obs, stage).len(), 1, "{stage} was evaluated again");
    }
    assert_eq!(of_type(&obs, "TOOL_EXECUTION").len(), 3);
    app.stop().await;
}
both_stores!(bombs, expression_bombs_are_tool_errors_and_never_run_again);

/// A stage that writes more than `PES_FLOWCHART_MAX_VALUE_BYTES` (set to 1,000 here) ends the
/// call with a tool error naming the stage, its size and the limit; a value under it is fine.
async fn a_value_over_the_limit_is_a_tool_error(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.flowchart_max_value_bytes = 1000).await;
    define_flowchart(&app, None, "twice", json!({
        "description": "Writes its text twice.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        "flowchart": {"start": "double", "stages": {
            "double": {"kind": "set", "values": {"twice": {"cat": [{"var": "args.text"}, {"var": "args.text"}]}}}
        }}
    })).await;
    let (t, run) = run_calls(
        &app,
        &llm,
        &["twice"],
        vec![
            ("twice", json!({"text": "x".repeat(300)})),
            ("twice", json!({"text": "y".repeat(600)})),
        ],
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let execs = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(execs[0]["content"]["status"], "success", "{}", execs[0]);
    assert_eq!(
        execs[0]["content"]["output"]["twice"]
            .as_str()
            .map(str::len),
        Some(600)
    );
    let e = execs[1]["content"]["error"].as_str().unwrap();
    assert!(
        e.contains("stage `double`")
            && e.contains("1000 bytes")
            && e.contains("PES_FLOWCHART_MAX_VALUE_BYTES"),
        "{e}"
    );
    let failed: Vec<&Value> = of_type(&obs, "FLOWCHART_STEP")
        .into_iter()
        .filter(|s| s["content"]["error"].is_string())
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["content"]["stage"], "double");
    app.stop().await;
}
both_stores!(value_limit, a_value_over_the_limit_is_a_tool_error);

/// A loop that writes large values over and over ends as a tool error once the call's steps
/// would take more than 32 × `PES_FLOWCHART_MAX_VALUE_BYTES` in the log, and what a stage only
/// reads is kept in its step as a marker when it is large: one call cannot fill the database.
async fn a_call_cannot_fill_the_log(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.flowchart_max_value_bytes = 4000).await;
    define_flowchart(&app, None, "churn", json!({
        "description": "Rewrites a large value many times.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        "flowchart": {"start": "l", "stages": {
            "l": {"kind": "loop", "condition": true, "body": "b", "maxIterations": 500},
            "b": {"kind": "set", "values": {"copy": {"cat": [{"var": "args.text"}, "!"]}}}
        }}
    })).await;
    let (t, run) = run_calls(
        &app,
        &llm,
        &["churn"],
        vec![("churn", json!({"text": "z".repeat(3000)}))],
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let exec = &of_type(&obs, "TOOL_EXECUTION")[0];
    let e = exec["content"]["error"].as_str().unwrap();
    assert!(e.contains("in the log") && e.contains("128000"), "{e}");
    let steps = of_type(&obs, "FLOWCHART_STEP");
    let total: usize = steps.iter().map(|s| s["content"].to_string().len()).sum();
    assert!(total <= 128_000 + 8_000, "{total} bytes of steps");
    // The 3,000-byte argument a stage read is a marker in its step, not a copy.
    let read = &steps[1]["content"]["reads"];
    assert!(read.to_string().contains("not kept in the step"), "{read}");
    app.stop().await;
}
both_stores!(log_bound, a_call_cannot_fill_the_log);

/// A `tool` stage may call only what the calling item may call: a tool the thread does not
/// enable, or outside the item's `toolAllowlist`, is a tool error naming the tool, and the tool
/// never runs.
async fn a_tool_stage_calls_only_what_the_item_may_call(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    define_flowchart(&app, None, "triage", triage()).await;
    let call = || {
        Reply::ToolCalls(vec![(
            "triage".into(),
            json!({"amount": 40, "tier": "gold"}),
        )])
    };
    // The thread enables the flowchart, not the calculator its first stage calls.
    llm.push("plan", plan(&[("s1", "Triage", &["triage"], &[])]));
    llm.push("execute", call());
    let t = app.thread(json!({"config": {"tools": ["triage"]}})).await;
    let run = app.run_wait(&t, "triage it").await;
    assert_eq!(run["status"], "completed", "{run}");
    // The item's allowlist names the flowchart only.
    let mut item = plan_item("s1", "Triage", &["triage"], &[]);
    item["toolAllowlist"] = json!(["triage"]);
    llm.push(
        "plan",
        Reply::Json(json!({"title": "t", "intent": "i", "plan": "p", "todoList": [item]})),
    );
    llm.push("execute", call());
    let t2 = app.thread(json!({})).await;
    let run = app.run_wait(&t2, "triage it").await;
    assert_eq!(run["status"], "completed", "{run}");
    for t in [&t, &t2] {
        let obs = app.observations(t).await;
        let e = of_type(&obs, "TOOL_EXECUTION")[0]["content"]["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            e.contains("stage `score`") && e.contains("the tool `calculator` is not one"),
            "{e}"
        );
        let steps = of_type(&obs, "FLOWCHART_STEP");
        assert_eq!(steps.len(), 1);
        assert!(
            steps[0]["content"]["writes"].is_null() || steps[0]["content"]["writes"] == json!({})
        );
    }
    app.stop().await;
}
both_stores!(tool_policy, a_tool_stage_calls_only_what_the_item_may_call);
