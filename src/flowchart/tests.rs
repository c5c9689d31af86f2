//! The interpreter against an in-memory host: every stage kind, the evidence of decisions, the
//! nesting of sub-flows, the limits, and a call cut off after any number of committed steps that
//! resumes without running a committed stage again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};
use uuid::Uuid;

use super::expr::{Evaluator, ExprLimits};
use super::interpreter::{FlowCall, FlowError, FlowHost, FlowLimits, StepRecord};
use super::model::{FlowchartRecord, FlowchartSpec};
use crate::model::{Observation, ObservationType, ThreadId, Usage};

#[derive(Default)]
struct Host {
    flowcharts: BTreeMap<String, FlowchartRecord>,
    steps: Mutex<Vec<StepRecord>>,
    /// Tool calls made: (name, args, key).
    calls: Mutex<Vec<(String, Value, String)>>,
    /// Commits accepted before every later one fails (a crash).
    commit_budget: Mutex<Option<usize>>,
    /// Tools the calling item may not call.
    denied: Vec<String>,
}

fn record(name: &str, spec: Value) -> FlowchartRecord {
    let spec: FlowchartSpec = serde_json::from_value(spec).unwrap();
    FlowchartRecord {
        name: name.into(),
        version: 1,
        spec,
        created_at: chrono::Utc::now(),
    }
}

#[async_trait]
impl FlowHost for Host {
    async fn load(&self, name: &str, _v: Option<i64>) -> Result<Option<FlowchartRecord>, String> {
        Ok(self.flowcharts.get(name).cloned())
    }
    async fn commit_step(&self, step: StepRecord) -> Result<(), String> {
        let mut budget = self.commit_budget.lock().unwrap();
        if let Some(b) = budget.as_mut() {
            if *b == 0 {
                return Err("the process died".into());
            }
            *b -= 1;
        }
        self.steps.lock().unwrap().push(step);
        Ok(())
    }
    fn may_call(&self, tool: &str) -> bool {
        !self.denied.iter().any(|t| t == tool)
    }
    async fn call_tool(&self, name: &str, args: Value, key: String) -> Result<Value, String> {
        self.calls
            .lock()
            .unwrap()
            .push((name.into(), args.clone(), key));
        match name {
            "lookup" => {
                Ok(json!({"tier": if args["customer"] == "acme" { "gold" } else { "basic" }}))
            }
            "boom" => Err("the service is down".into()),
            _ => Ok(json!({"echo": args})),
        }
    }
    async fn ask_model(
        &self,
        prompt: String,
        schema: Option<Value>,
    ) -> Result<(Value, Usage), String> {
        let usage = Usage {
            llm_calls: 1,
            ..Usage::default()
        };
        Ok(match schema {
            Some(_) => (json!({"summary": prompt}), usage),
            None => (json!(format!("model says: {prompt}")), usage),
        })
    }
}

impl Host {
    fn with(flowcharts: Vec<FlowchartRecord>) -> Self {
        Self {
            flowcharts: flowcharts
                .into_iter()
                .map(|f| (f.name.clone(), f))
                .collect(),
            ..Self::default()
        }
    }

    /// The committed steps as observations, for a resumed call.
    fn committed(&self) -> Vec<Observation> {
        self.steps
            .lock()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, s)| Observation {
                id: s.id,
                seq: i64::try_from(i).unwrap() + 1,
                thread_id: ThreadId::parse("t").unwrap(),
                tenant: "default".into(),
                run_id: None,
                parent_id: s.parent_id.clone(),
                kind: ObservationType::FlowchartStep,
                title: s.title.clone(),
                content: s.content.clone(),
                created_at: chrono::Utc::now(),
            })
            .collect()
    }

    fn stages(&self) -> Vec<String> {
        self.steps
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.content["stage"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn limits() -> FlowLimits {
    FlowLimits {
        max_steps: 1000,
        expr: Evaluator::default(),
    }
}

async fn run(host: &Host, name: &str, args: Value) -> Result<Value, FlowError> {
    run_with(host, name, args, limits()).await
}

async fn run_with(
    host: &Host,
    name: &str,
    args: Value,
    limits: FlowLimits,
) -> Result<Value, FlowError> {
    let record = Arc::new(host.flowcharts[name].clone());
    let mut call = FlowCall::new(host, Uuid::nil(), "call_1".into(), limits, host.committed());
    call.run(record, args, Some("tool-call-obs".into())).await
}

fn triage() -> FlowchartRecord {
    record(
        "triage",
        json!({
            "description": "Refund triage",
            "flowchart": {
                "start": "customer",
                "stages": {
                    "customer": {"kind": "tool", "tool": "lookup", "args": {"customer": {"var": "args.customer"}}, "output": "customer", "next": "route"},
                    "route": {"kind": "decide", "rules": [
                        {"condition": {">": [{"var": "args.amount"}, 1000]}, "next": "escalate"},
                        {"condition": {"==": [{"var": "state.customer.tier"}, "gold"]}, "next": "approve"}
                    ], "default": "review"},
                    "approve": {"kind": "end", "result": {"decision": "approved", "tier": {"var": "state.customer.tier"}}},
                    "review": {"kind": "set", "values": {"decision": "review"}},
                    "escalate": {"kind": "end", "result": {"decision": "escalated"}}
                }
            }
        }),
    )
}

#[tokio::test]
async fn a_decide_picks_its_branch_and_records_the_evidence() {
    let host = Host::with(vec![triage()]);
    let out = run(&host, "triage", json!({"customer": "acme", "amount": 40})).await;
    assert_eq!(out, Ok(json!({"decision": "approved", "tier": "gold"})));
    assert_eq!(host.stages(), ["customer", "route", "approve"]);
    let steps = host.steps.lock().unwrap().clone();
    assert!(
        steps
            .iter()
            .all(|s| s.parent_id.as_deref() == Some("tool-call-obs"))
    );
    let route = &steps[1].content;
    assert_eq!(route["kind"], "decide");
    assert_eq!(route["decision"]["chosen"], "approve");
    assert_eq!(route["decision"]["rules"][0]["matched"], false);
    assert_eq!(
        route["decision"]["rules"][0]["inputs"],
        json!({"args.amount": 40})
    );
    assert_eq!(route["decision"]["rules"][1]["matched"], true);
    assert_eq!(
        route["decision"]["rules"][1]["inputs"],
        json!({"state.customer.tier": "gold"})
    );
    assert_eq!(
        steps[0].content["writes"],
        json!({"customer": {"tier": "gold"}})
    );
    assert_eq!(steps[0].content["reads"], json!({"args.customer": "acme"}));
    assert_eq!(
        host.calls.lock().unwrap()[0].2,
        format!("{}:call_1:customer:1", Uuid::nil())
    );
    // The default: a chain that ends without `end` gives the state.
    let host = Host::with(vec![triage()]);
    let out = run(&host, "triage", json!({"customer": "zed", "amount": 40})).await;
    assert_eq!(
        out,
        Ok(json!({"customer": {"tier": "basic"}, "decision": "review"}))
    );
}

#[tokio::test]
async fn select_runs_every_matching_branch_and_loop_repeats_its_body() {
    let flow = record(
        "checks",
        json!({
            "description": "d",
            "flowchart": {"start": "init", "stages": {
                "init": {"kind": "set", "values": {"n": 0, "notes": []}, "next": "all"},
                "all": {"kind": "select", "rules": [
                    {"condition": {">": [{"var": "args.x"}, 1]}, "branch": "big"},
                    {"condition": {"<": [{"var": "args.x"}, 0]}, "branch": "negative"},
                    {"condition": true, "branch": "always"}
                ], "next": "count"},
                "big": {"kind": "set", "values": {"big": true}},
                "negative": {"kind": "set", "values": {"negative": true}},
                "always": {"kind": "set", "values": {"always": true}, "next": "always2"},
                "always2": {"kind": "set", "values": {"always2": true}},
                "count": {"kind": "loop", "condition": {"<": [{"var": "state.n"}, 3]}, "body": "inc", "maxIterations": 5, "next": "done"},
                "inc": {"kind": "set", "values": {"n": {"+": [{"var": "state.n"}, 1]}}},
                "done": {"kind": "end"}
            }},
            "resultMapper": {"n": {"var": "state.n"}, "big": {"var": "state.big"}, "neg": {"var": "state.negative"}, "always2": {"var": "state.always2"}}
        }),
    );
    let host = Host::with(vec![flow]);
    let out = run(&host, "checks", json!({"x": 5})).await;
    assert_eq!(
        out,
        Ok(json!({"n": 3, "big": true, "neg": null, "always2": true}))
    );
    assert_eq!(
        host.stages(),
        [
            "init", "all", "big", "always", "always2", "count", "inc", "count", "inc", "count",
            "inc", "count", "done"
        ]
    );
    let steps = host.steps.lock().unwrap().clone();
    assert_eq!(
        steps[1].content["decision"]["chosen"],
        json!(["big", "always"])
    );
    let checks: Vec<(Value, Value)> = steps
        .iter()
        .filter(|s| s.content["stage"] == "count")
        .map(|s| (s.content["iteration"].clone(), s.content["matched"].clone()))
        .collect();
    assert_eq!(
        checks,
        [
            (json!(1), json!(true)),
            (json!(2), json!(true)),
            (json!(3), json!(true)),
            (json!(4), json!(false))
        ]
    );
    assert_eq!(steps[6].content["iteration"], 1);
    assert_eq!(steps[8].content["iteration"], 2);
}

#[tokio::test]
async fn a_sub_flow_nests_under_its_flow_stage_with_a_fresh_state() {
    let inner = record(
        "inner",
        json!({"description": "d", "flowchart": {"start": "a", "stages": {
            "a": {"kind": "set", "values": {"seen_outer": {"var": "state.secret"}, "x": {"*": [{"var": "args.v"}, 2]}}, "next": "b"},
            "b": {"kind": "end", "result": {"var": "state.x"}}
        }}}),
    );
    let outer = record(
        "outer",
        json!({"description": "d", "flowchart": {"start": "s", "stages": {
            "s": {"kind": "set", "values": {"secret": 1}, "next": "sub"},
            "sub": {"kind": "flow", "flowchart": "inner", "args": {"v": 21}, "output": "doubled"}
        }}}),
    );
    let host = Host::with(vec![inner, outer]);
    let out = run(&host, "outer", json!({})).await.unwrap();
    assert_eq!(out, json!({"secret": 1, "doubled": 42}));
    let steps = host.steps.lock().unwrap().clone();
    // A sub-flow's step names the sub-flow and its own stage; `path` is where the call is.
    assert_eq!(host.stages(), ["s", "a", "b", "sub"]);
    let paths: Vec<&Value> = steps.iter().map(|s| &s.content["path"]).collect();
    assert_eq!(
        paths,
        [&Value::Null, &json!("sub/a"), &json!("sub/b"), &Value::Null]
    );
    assert_eq!(steps[1].title, "inner: a (set)");
    let flow_step = &steps[3];
    assert_eq!(flow_step.content["kind"], "flow");
    assert_eq!(flow_step.parent_id.as_deref(), Some("tool-call-obs"));
    for child in &steps[1..3] {
        assert_eq!(
            child.parent_id,
            Some(flow_step.id.to_string()),
            "nested under the flow step"
        );
        assert_eq!(child.content["flowchart"], "inner");
    }
    assert_eq!(
        steps[1].content["writes"]["seen_outer"],
        Value::Null,
        "fresh state"
    );
}

#[tokio::test]
async fn errors_and_limits_end_the_call_naming_the_stage() {
    let f = record(
        "f",
        json!({"description": "d", "flowchart": {"start": "a", "stages": {
            "a": {"kind": "tool", "tool": "boom", "output": "x"}
        }}}),
    );
    let host = Host::with(vec![f]);
    let e = run(&host, "f", json!({})).await.unwrap_err();
    assert_eq!(e.stage, "a");
    assert!(e.message.contains("the service is down"), "{e}");
    assert!(host.steps.lock().unwrap()[0].content["error"].is_string());

    let spin = record(
        "spin",
        json!({"description": "d", "flowchart": {"start": "l", "stages": {
            "l": {"kind": "loop", "condition": true, "body": "b", "maxIterations": 10000},
            "b": {"kind": "set", "values": {"x": 1}}
        }}}),
    );
    let host = Host::with(vec![spin.clone()]);
    let mut call = FlowCall::new(
        &host,
        Uuid::nil(),
        "c".into(),
        FlowLimits {
            max_steps: 25,
            ..limits()
        },
        vec![],
    );
    let e = call.run(Arc::new(spin), json!({}), None).await.unwrap_err();
    assert!(e.message.contains("limit of 25 stages"), "{e}");
    assert_eq!(host.steps.lock().unwrap().len(), 25);

    let few = record(
        "few",
        json!({"description": "d", "flowchart": {"start": "l", "stages": {
            "l": {"kind": "loop", "condition": true, "body": "b", "maxIterations": 2},
            "b": {"kind": "set", "values": {"x": 1}}
        }}}),
    );
    let host = Host::with(vec![few]);
    let e = run(&host, "few", json!({})).await.unwrap_err();
    assert_eq!(e.stage, "l");
    assert!(e.message.contains("maxIterations (2)"), "{e}");

    let deep = record(
        "deep",
        json!({"description": "d", "flowchart": {"start": "d", "stages": {
            "d": {"kind": "flow", "flowchart": "deep", "output": "x"}
        }}}),
    );
    let host = Host::with(vec![deep]);
    let e = run(&host, "deep", json!({})).await.unwrap_err();
    assert!(e.message.contains("deeper than 8"), "{e}");
}

/// A call cut off after every possible number of committed steps resumes from the log: the
/// same result, the same steps, and no tool call repeated once its step was committed.
#[tokio::test]
async fn a_call_resumes_after_its_last_committed_step() {
    let inner = record(
        "inner",
        json!({"description": "d", "flowchart": {"start": "t", "stages": {
            "t": {"kind": "tool", "tool": "echo", "args": {"v": {"var": "args.v"}}, "output": "r", "next": "e"},
            "e": {"kind": "end", "result": {"var": "state.r.echo.v"}}
        }}}),
    );
    let outer = record(
        "outer",
        json!({"description": "d", "flowchart": {"start": "init", "stages": {
            "init": {"kind": "set", "values": {"n": 0, "acc": []}, "next": "loop"},
            "loop": {"kind": "loop", "condition": {"<": [{"var": "state.n"}, 2]}, "body": "call", "maxIterations": 3, "next": "ask"},
            "call": {"kind": "tool", "tool": "echo", "args": {"n": {"var": "state.n"}}, "output": "last", "next": "sub"},
            "sub": {"kind": "flow", "flowchart": "inner", "args": {"v": {"var": "state.n"}}, "output": "subr", "next": "inc"},
            "inc": {"kind": "set", "values": {"n": {"+": [{"var": "state.n"}, 1]}}},
            "ask": {"kind": "llm", "prompt": {"cat": ["n=", {"var": "state.n"}]}, "outputSchema": {"type": "object"}, "output": "summary", "next": "pick"},
            "pick": {"kind": "decide", "rules": [{"condition": {"==": [{"var": "state.n"}, 2]}, "next": "end"}], "default": "end"},
            "end": {"kind": "end", "result": {"n": {"var": "state.n"}, "sub": {"var": "state.subr"}, "summary": {"var": "state.summary"}}}
        }}}),
    );
    let clean = Host::with(vec![inner.clone(), outer.clone()]);
    let want = run(&clean, "outer", json!({})).await.unwrap();
    assert_eq!(
        want,
        json!({"n": 2, "sub": 1, "summary": {"summary": "n=2"}})
    );
    let all_steps = clean.stages();
    let all_calls = clean.calls.lock().unwrap().clone();
    for cut in 0..all_steps.len() {
        let host = Host::with(vec![inner.clone(), outer.clone()]);
        *host.commit_budget.lock().unwrap() = Some(cut);
        assert!(
            run(&host, "outer", json!({})).await.is_err(),
            "cut at {cut}"
        );
        let committed_calls = host.calls.lock().unwrap().len();
        *host.commit_budget.lock().unwrap() = None;
        let calls_before = host.calls.lock().unwrap().clone();
        let out = run(&host, "outer", json!({})).await;
        assert_eq!(out.as_ref(), Ok(&want), "cut at {cut}");
        assert_eq!(
            host.stages(),
            all_steps,
            "cut at {cut}: the same steps, each once"
        );
        // Every call whose step was committed ran once; the one cut off (ran, not committed)
        // may run again, under the same key.
        let calls = host.calls.lock().unwrap().clone();
        let keys: Vec<&String> = calls.iter().map(|c| &c.2).collect();
        let want_keys: Vec<&String> = all_calls.iter().map(|c| &c.2).collect();
        let mut distinct = keys.clone();
        distinct.dedup();
        assert_eq!(distinct, want_keys, "cut at {cut}");
        assert!(
            calls.len() <= all_calls.len() + 1,
            "cut at {cut}: {calls:?}"
        );
        assert!(committed_calls == calls_before.len());
    }
}

/// A reduce that doubles a string 30 times (a GiB), one that doubles an array sharing its
/// elements (cheap to build, a TiB to write out), nested reduces that would spin for hours, and
/// a value nested 10,000 deep: each ends the call at its stage, quickly, with its step committed
/// with the error.
#[tokio::test]
async fn expression_bombs_stop_at_their_stage() {
    let thirty: Vec<u32> = (0..30).collect();
    let thousands: Vec<u32> = (0..5000).collect();
    let bombs = [
        (
            json!({"reduce": [thirty, {"cat": [{"var": "accumulator"}, {"var": "accumulator"}]}, "0123456789abcdef"]}),
            "PES_FLOWCHART_MAX_VALUE_BYTES",
        ),
        (
            json!({"reduce": [thirty, {"merge": [{"var": "accumulator"}, {"var": "accumulator"}]}, [{"var": "state.text"}]]}),
            "PES_FLOWCHART_MAX_VALUE_BYTES",
        ),
        (
            json!({"reduce": [thousands, {"reduce": [thousands, {"+": [{"var": "accumulator"}, 1]}, {"var": "accumulator"}]}, 0]}),
            "PES_FLOWCHART_EXPR_TIMEOUT_MS",
        ),
        (
            json!({"reduce": [{"var": "state.many"}, [{"var": "accumulator"}], 0]}),
            "nested deeper than 64",
        ),
    ];
    for (bomb, why) in bombs {
        let f = record(
            "bomb",
            json!({"description": "d", "flowchart": {"start": "init", "stages": {
                "init": {"kind": "set", "values": {"text": "0123456789abcdef", "many": thousands}, "next": "grow"},
                "grow": {"kind": "set", "values": {"big": bomb}, "next": "after"},
                "after": {"kind": "end", "result": "never"}
            }}}),
        );
        let host = Host::with(vec![f]);
        let started = std::time::Instant::now();
        let e = run(&host, "bomb", json!({})).await.unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "{why}: {:?}",
            started.elapsed()
        );
        assert_eq!(e.stage, "grow", "{e}");
        assert!(e.message.contains(why), "{e}");
        let steps = host.steps.lock().unwrap().clone();
        assert_eq!(host.stages(), ["init", "grow"]);
        assert_eq!(steps[1].content["error"], json!(e.message));
    }
}

/// A stage that passed a limit is committed with its error: the call resumed from the log
/// ends with the same error without evaluating anything again.
#[tokio::test]
async fn a_stage_that_passed_a_limit_is_not_evaluated_again_on_resume() {
    let f = record(
        "bomb",
        json!({"description": "d", "flowchart": {"start": "init", "stages": {
            "init": {"kind": "set", "values": {"n": 1}, "next": "grow"},
            "grow": {"kind": "set", "values": {"big": {"reduce": [[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25],
                {"cat": [{"var": "accumulator"}, {"var": "accumulator"}]}, "ab"]}}, "next": "after"},
            "after": {"kind": "end", "result": "never"}
        }}}),
    );
    let host = Host::with(vec![f]);
    let limits = limits();
    let first = run_with(&host, "bomb", json!({}), limits.clone())
        .await
        .unwrap_err();
    let evaluated = limits.expr.started();
    assert_eq!(evaluated, 2, "init's and grow's expressions");
    let again = run_with(&host, "bomb", json!({}), limits.clone())
        .await
        .unwrap_err();
    assert_eq!(again, first);
    assert_eq!(limits.expr.started(), evaluated, "nothing evaluated again");
    assert_eq!(host.stages(), ["init", "grow"], "no step committed again");

    // The same for a stage inside a sub-flow: the flow stage's step keeps the failed stage.
    let inner = record(
        "inner",
        json!({"description": "d", "flowchart": {"start": "x", "stages": {
            "x": {"kind": "set", "values": {"big": {"reduce": [[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25],
                {"cat": [{"var": "accumulator"}, {"var": "accumulator"}]}, "ab"]}}}
        }}}),
    );
    let outer = record(
        "outer",
        json!({"description": "d", "flowchart": {"start": "sub", "stages": {
            "sub": {"kind": "flow", "flowchart": "inner", "output": "r"}
        }}}),
    );
    let host = Host::with(vec![inner, outer]);
    let first = run_with(&host, "outer", json!({}), limits.clone())
        .await
        .unwrap_err();
    assert_eq!(first.stage, "sub/x");
    let evaluated = limits.expr.started();
    let again = run_with(&host, "outer", json!({}), limits.clone())
        .await
        .unwrap_err();
    assert_eq!(again, first);
    assert_eq!(limits.expr.started(), evaluated);
    let steps = host.steps.lock().unwrap().clone();
    assert_eq!(host.stages(), ["x", "sub"]);
    assert_eq!(steps[1].content["errorStage"], "sub/x");
}

/// What a stage writes and what a call returns are at most `PES_FLOWCHART_MAX_VALUE_BYTES`:
/// a value computed, a tool's output, the result; each over it is an error naming the stage.
#[tokio::test]
async fn values_over_the_limit_are_stage_errors() {
    let small = FlowLimits {
        max_steps: 100,
        expr: Evaluator::new(ExprLimits {
            max_value_bytes: 200,
            ..ExprLimits::default()
        }),
    };
    let long = "x".repeat(300);
    let f = record(
        "f",
        json!({"description": "d", "flowchart": {"start": "a", "stages": {
            "a": {"kind": "set", "values": {"ok": {"var": "args.short"}}, "next": "b"},
            "b": {"kind": "set", "values": {"copy": {"var": "args.long"}}}
        }}}),
    );
    let host = Host::with(vec![f]);
    let e = run_with(
        &host,
        "f",
        json!({"short": "fine", "long": long}),
        small.clone(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.stage, "b");
    assert!(
        e.message.contains("more than the limit of 200 bytes")
            && e.message.contains("PES_FLOWCHART_MAX_VALUE_BYTES"),
        "{e}"
    );

    let f = record(
        "t",
        json!({"description": "d", "flowchart": {"start": "echo", "stages": {
            "echo": {"kind": "tool", "tool": "echo", "args": {"text": {"var": "args.long"}}, "output": "e"}
        }}}),
    );
    let host = Host::with(vec![f]);
    let half = "y".repeat(190);
    let e = run_with(&host, "t", json!({"long": half}), small.clone())
        .await
        .unwrap_err();
    assert_eq!(e.stage, "echo");
    assert!(
        e.message.contains("the value of `e` is") && e.message.contains("limit of 200"),
        "{e}"
    );

    // Each value fits, the whole state (the default result) does not.
    let f = record(
        "r",
        json!({"description": "d", "flowchart": {"start": "a", "stages": {
            "a": {"kind": "set", "values": {"x": {"var": "args.v"}, "y": {"var": "args.v"}}}
        }}}),
    );
    let host = Host::with(vec![f]);
    let e = run_with(&host, "r", json!({"v": "z".repeat(120)}), small)
        .await
        .unwrap_err();
    assert_eq!(e.stage, "result");
    assert!(e.message.contains("the call's result is"), "{e}");
}

/// A `tool` stage may call only what the calling item may call.
#[tokio::test]
async fn a_tool_stage_calls_only_what_the_item_may_call() {
    let mut host = Host::with(vec![triage()]);
    host.denied = vec!["lookup".into()];
    let e = run(&host, "triage", json!({"customer": "acme", "amount": 1}))
        .await
        .unwrap_err();
    assert_eq!(e.stage, "customer");
    assert!(e.message.contains("the tool `lookup` is not one"), "{e}");
    assert!(host.calls.lock().unwrap().is_empty(), "never called");
    assert!(host.steps.lock().unwrap()[0].content["error"].is_string());
}
