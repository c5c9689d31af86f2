use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

fn spec(v: Value) -> FlowchartSpec {
    parse_spec(&v).unwrap_or_else(|p| panic!("{p}"))
}

/// A flowchart with these stages, starting at `a`.
fn chart(stages: Value) -> FlowchartSpec {
    spec(json!({"description": "test", "flowchart": {"start": "a", "stages": stages}}))
}

fn is_tool(name: &str) -> bool {
    matches!(name, "calculator" | "current_time")
}

fn check_with(
    name: &str,
    s: &FlowchartSpec,
    others: &BTreeMap<String, FlowchartSpec>,
) -> Vec<Problem> {
    let env = ValidationEnv {
        is_tool: &is_tool,
        flowcharts: others,
    };
    validate(name, s, &env).err().unwrap_or_default()
}

fn check(s: &FlowchartSpec) -> Vec<Problem> {
    check_with("main", s, &BTreeMap::new())
}

fn paths(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.path.as_str()).collect()
}

/// The one problem, at `path`, whose message contains `text`.
#[track_caller]
fn only(problems: &[Problem], path: &str, text: &str) {
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].path, path, "{problems:#?}");
    assert!(problems[0].message.contains(text), "{problems:#?}");
}

#[test]
fn a_sound_flowchart_passes() {
    let s = spec(json!({
        "description": "Triage a refund",
        "inputSchema": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
        "flowchart": {"start": "init", "stages": {
            "init": {"kind": "set", "values": {"count": 0, "label": {"cat": ["n=", {"var": "args.amount"}]}}, "next": "route"},
            "route": {"kind": "decide", "rules": [
                {"condition": {">": [{"var": "args.amount"}, 100]}, "next": "big"}
            ], "default": "small"},
            "big": {"kind": "tool", "tool": "calculator", "args": {"expression": {"cat": [{"var": "args.amount"}, "*2"]}}, "output": "calc", "next": "count"},
            "small": {"kind": "llm", "prompt": "Say hi", "outputSchema": {"type": "object"}, "output": "reply", "next": "count"},
            "count": {"kind": "loop", "condition": {"<": [{"var": "state.count"}, 3]}, "body": "inc", "maxIterations": 5, "next": "fan"},
            "inc": {"kind": "set", "values": {"count": {"+": [{"var": "state.count"}, 1]}}},
            "fan": {"kind": "select", "rules": [
                {"condition": true, "branch": "x"},
                {"condition": {"some": [[1, 2], {">": [{"var": ""}, 1]}]}, "branch": "x"}
            ], "next": "done"},
            "x": {"kind": "set", "values": {"seen": true}},
            "done": {"kind": "end", "result": {"total": {"var": "state.count"}, "ok": true}}
        }},
        "resultMapper": {"var": "state"}
    }));
    assert_eq!(check(&s), vec![]);
}

// ----- parse ------------------------------------------------------------------------------------

#[test]
fn an_unknown_stage_kind_names_the_kind_field() {
    let p = parse_spec(
        &json!({"description": "d", "flowchart": {"start": "a", "stages": {
            "a": {"kind": "end"}, "triage": {"kind": "foo"}
        }}}),
    )
    .unwrap_err();
    assert_eq!(p.path, "/flowchart/stages/triage/kind");
    assert!(p.message.contains("unknown variant `foo`"), "{p}");
    assert!(p.message.contains("`set`"), "{p}");
}

#[test]
fn shape_errors_name_their_json_pointer() {
    let cases = [
        (
            json!({"flowchart": {"start": "a", "stages": {}}}),
            "",
            "missing field `description`",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {}}, "extra": 1}),
            "/extra",
            "unknown field `extra`",
        ),
        (
            json!({"description": "d", "flowchart": {"start": 5, "stages": {}}}),
            "/flowchart/start",
            "invalid type",
        ),
        (
            json!({"description": "d", "flowchart": ["a", {}]}),
            "/flowchart",
            "expected an object",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "tool", "tool": "x"}}}}),
            "/flowchart/stages/a",
            "missing field `output`",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "end", "next": "b"}}}}),
            "/flowchart/stages/a",
            "unknown field `next`",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "loop", "condition": true, "body": "a"}}}}),
            "/flowchart/stages/a",
            "missing field `maxIterations`",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "loop", "condition": true, "body": "a", "maxIterations": -1}}}}),
            "/flowchart/stages/a",
            "invalid value",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "decide", "rules": [["c", "a"]], "default": "a"}}}}),
            "/flowchart/stages/a/rules/0",
            "expected a rule object",
        ),
        (
            json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"values": {}}}}}),
            "/flowchart/stages/a",
            "missing field `kind`",
        ),
    ];
    for (body, path, text) in cases {
        let p = parse_spec(&body).unwrap_err();
        assert_eq!(p.path, path, "{body}: {p}");
        assert!(p.message.contains(text), "{body}: {p}");
    }
}

#[test]
fn pointers_escape_slash_and_tilde() {
    assert_eq!(pointer(["a/b", "c~d", ""]), "/a~1b/c~0d/");
}

// ----- names, ids, keys -------------------------------------------------------------------------

#[test]
fn the_name_must_be_a_tool_name() {
    let s = chart(json!({"a": {"kind": "end"}}));
    for bad in ["", "has space", "dot.ted", &"x".repeat(65)] {
        only(
            &check_with(bad, &s, &BTreeMap::new()),
            "/name",
            "not a tool name",
        );
    }
    assert_eq!(check_with(&"x".repeat(64), &s, &BTreeMap::new()), vec![]);
}

#[test]
fn stage_ids_and_state_keys_have_a_syntax() {
    let s = chart(json!({
        "a": {"kind": "set", "values": {"ok_key": 1, "bad key": 2}, "next": "b c"},
        "b c": {"kind": "tool", "tool": "calculator", "output": "out.put", "next": "d.e"},
        "d.e": {"kind": "llm", "prompt": "p", "output": "", "next": "f"},
        "f": {"kind": "flow", "flowchart": "main", "output": "x/y"}
    }));
    let problems = check(&s);
    let want = [
        "/flowchart/stages/a/values/bad key",
        "/flowchart/stages/b c",
        "/flowchart/stages/b c/output",
        "/flowchart/stages/d.e/output",
        "/flowchart/stages/f/flowchart",
        "/flowchart/stages/f/output",
    ];
    assert_eq!(paths(&problems), want, "{problems:#?}");
    assert!(problems[1].message.contains("not a stage id"));
    assert!(problems[5].message.contains("not a state key"));
}

#[test]
fn the_description_must_say_something() {
    let s = spec(
        json!({"description": "  ", "flowchart": {"start": "a", "stages": {"a": {"kind": "end"}}}}),
    );
    only(&check(&s), "/description", "must say what");
}

// ----- references -------------------------------------------------------------------------------

#[test]
fn start_must_name_a_stage() {
    let s = spec(
        json!({"description": "d", "flowchart": {"start": "nope", "stages": {"a": {"kind": "end"}}}}),
    );
    only(
        &check(&s),
        "/flowchart/start",
        "`nope` names no stage (stages: a)",
    );
}

#[test]
fn every_edge_must_name_a_stage() {
    let s = chart(json!({
        "a": {"kind": "set", "values": {}, "next": "n1"},
        "d": {"kind": "decide", "rules": [{"condition": true, "next": "n2"}], "default": "n3"},
        "s": {"kind": "select", "rules": [{"condition": true, "branch": "n4"}], "next": "n5"},
        "l": {"kind": "loop", "condition": true, "body": "n6", "maxIterations": 2, "next": "n7"}
    }));
    let problems = check(&s);
    assert_eq!(
        paths(&problems),
        [
            "/flowchart/stages/a/next",
            "/flowchart/stages/d/default",
            "/flowchart/stages/d/rules/0/next",
            "/flowchart/stages/l/body",
            "/flowchart/stages/l/next",
            "/flowchart/stages/s/next",
            "/flowchart/stages/s/rules/0/branch",
        ],
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .all(|p| p.message.contains("names no stage"))
    );
}

#[test]
fn a_flowchart_has_at_most_200_stages() {
    let mut stages = serde_json::Map::new();
    for i in 0..=MAX_STAGES {
        stages.insert(format!("s{i}"), json!({"kind": "end"}));
    }
    stages.insert("a".into(), json!({"kind": "end"}));
    only(
        &check(&chart(Value::Object(stages))),
        "/flowchart/stages",
        "at most 200",
    );
}

// ----- loops and cycles -------------------------------------------------------------------------

#[test]
fn max_iterations_is_bounded() {
    for n in [0, MAX_ITERATIONS + 1] {
        let s = chart(json!({
            "a": {"kind": "loop", "condition": true, "body": "b", "maxIterations": n},
            "b": {"kind": "end"}
        }));
        only(
            &check(&s),
            "/flowchart/stages/a/maxIterations",
            "unbounded loop",
        );
    }
}

#[test]
fn a_cycle_of_next_edges_is_an_unbounded_loop() {
    let s = chart(json!({
        "a": {"kind": "set", "values": {}, "next": "b"},
        "b": {"kind": "set", "values": {}, "next": "c"},
        "c": {"kind": "set", "values": {}, "next": "a"}
    }));
    only(
        &check(&s),
        "/flowchart/stages/c/next",
        "unbounded loop: a → b → c → a",
    );
}

#[test]
fn a_stage_going_to_itself_is_an_unbounded_loop() {
    let s = chart(json!({"a": {"kind": "set", "values": {}, "next": "a"}}));
    only(&check(&s), "/flowchart/stages/a/next", "a → a");
}

#[test]
fn a_decide_rule_or_default_going_back_is_an_unbounded_loop() {
    let s = chart(json!({
        "a": {"kind": "set", "values": {}, "next": "d"},
        "d": {"kind": "decide", "rules": [{"condition": true, "next": "e"}], "default": "a"},
        "e": {"kind": "end"}
    }));
    only(&check(&s), "/flowchart/stages/d/default", "a → d → a");
    let s = chart(json!({
        "a": {"kind": "decide", "rules": [{"condition": true, "next": "a"}], "default": "e"},
        "e": {"kind": "end"}
    }));
    only(&check(&s), "/flowchart/stages/a/rules/0/next", "a → a");
}

#[test]
fn a_loop_body_leading_back_to_its_loop_is_an_unbounded_loop() {
    let s = chart(json!({
        "a": {"kind": "loop", "condition": true, "body": "b", "maxIterations": 3, "next": "e"},
        "b": {"kind": "set", "values": {}, "next": "a"},
        "e": {"kind": "end"}
    }));
    only(&check(&s), "/flowchart/stages/b/next", "a → b → a");
}

#[test]
fn a_select_branch_leading_back_is_an_unbounded_loop() {
    let s = chart(json!({
        "a": {"kind": "select", "rules": [{"condition": true, "branch": "b"}]},
        "b": {"kind": "set", "values": {}, "next": "a"}
    }));
    only(&check(&s), "/flowchart/stages/b/next", "a → b → a");
}

#[test]
fn chains_sharing_stages_without_a_cycle_pass() {
    let s = chart(json!({
        "a": {"kind": "select", "rules": [
            {"condition": true, "branch": "shared"},
            {"condition": true, "branch": "other"}
        ], "next": "l"},
        "other": {"kind": "set", "values": {}, "next": "shared"},
        "shared": {"kind": "set", "values": {}},
        "l": {"kind": "loop", "condition": true, "body": "shared", "maxIterations": 10, "next": "shared"}
    }));
    assert_eq!(check(&s), vec![]);
}

#[test]
fn two_separate_cycles_are_both_reported() {
    let s = chart(json!({
        "a": {"kind": "set", "values": {}, "next": "a"},
        "b": {"kind": "set", "values": {}, "next": "c"},
        "c": {"kind": "set", "values": {}, "next": "b"}
    }));
    assert_eq!(
        paths(&check(&s)),
        ["/flowchart/stages/a/next", "/flowchart/stages/c/next"]
    );
}

// ----- tools and sub-flows ----------------------------------------------------------------------

#[test]
fn a_tool_stage_names_a_known_tool_not_a_flowchart() {
    let others = BTreeMap::from([("other".to_owned(), chart(json!({"a": {"kind": "end"}})))]);
    for (tool, text) in [
        ("nope", "names no tool"),
        ("other", "is a flowchart: call it with a `flow` stage"),
        ("main", "is a flowchart"),
    ] {
        let s = chart(json!({"a": {"kind": "tool", "tool": tool, "output": "o"}}));
        only(
            &check_with("main", &s, &others),
            "/flowchart/stages/a/tool",
            text,
        );
    }
}

#[test]
fn a_flow_stage_names_a_flowchart_of_the_tenant() {
    let others = BTreeMap::from([("leaf".to_owned(), chart(json!({"a": {"kind": "end"}})))]);
    let s =
        chart(json!({"a": {"kind": "flow", "flowchart": "leaf", "args": {"x": 1}, "output": "o"}}));
    assert_eq!(check_with("main", &s, &others), vec![]);
    let s = chart(json!({"a": {"kind": "flow", "flowchart": "ghost", "output": "o"}}));
    only(
        &check_with("main", &s, &others),
        "/flowchart/stages/a/flowchart",
        "names no flowchart",
    );
    let s = chart(json!({"a": {"kind": "flow", "flowchart": "calculator", "output": "o"}}));
    only(
        &check_with("main", &s, &others),
        "/flowchart/stages/a/flowchart",
        "is a tool, not a flowchart",
    );
}

#[test]
fn a_flowchart_calling_itself_is_a_sub_flow_cycle() {
    let s = chart(json!({"a": {"kind": "flow", "flowchart": "main", "output": "o"}}));
    only(
        &check(&s),
        "/flowchart/stages/a/flowchart",
        "sub-flow cycle: main → main",
    );
}

#[test]
fn a_cycle_through_stored_flowcharts_names_the_chain() {
    let calls =
        |target: &str| chart(json!({"a": {"kind": "flow", "flowchart": target, "output": "o"}}));
    // b → c → a already stored; putting a → b closes the circle.
    let others = BTreeMap::from([
        ("b".to_owned(), calls("c")),
        ("c".to_owned(), calls("a")),
        // The stored version of `a` called nothing; the new one is what counts.
        ("a".to_owned(), chart(json!({"a": {"kind": "end"}}))),
    ]);
    only(
        &check_with("a", &calls("b"), &others),
        "/flowchart/stages/a/flowchart",
        "a → b → c → a",
    );
    // A cycle further down, not through `a`, is reported too: a call would never end.
    let others = BTreeMap::from([("b".to_owned(), calls("c")), ("c".to_owned(), calls("b"))]);
    only(
        &check_with("a", &calls("b"), &others),
        "/flowchart/stages/a/flowchart",
        "a → b → c → b",
    );
    // A diamond is not a cycle.
    let both = chart(json!({
        "a": {"kind": "flow", "flowchart": "b", "output": "o", "next": "z"},
        "z": {"kind": "flow", "flowchart": "c", "output": "p"}
    }));
    let others = BTreeMap::from([
        ("b".to_owned(), calls("c")),
        ("c".to_owned(), chart(json!({"a": {"kind": "end"}}))),
    ]);
    assert_eq!(check_with("a", &both, &others), vec![]);
}

// ----- expressions ------------------------------------------------------------------------------

#[test]
fn a_misspelt_operator_is_reported_where_it_is() {
    let s = chart(json!({
        "a": {"kind": "decide", "rules": [
            {"condition": {"and": [true, {"=>": [{"var": "args.x"}, 1]}]}, "next": "e"},
            {"condition": {"Var": "args.x"}, "next": "e"}
        ], "default": "e"},
        "e": {"kind": "end", "result": {"=": [1, 1]}}
    }));
    let problems = check(&s);
    assert_eq!(
        paths(&problems),
        [
            "/flowchart/stages/a/rules/0/condition/and/1/=>",
            "/flowchart/stages/a/rules/1/condition/Var",
            "/flowchart/stages/e/result/=",
        ],
        "{problems:#?}"
    );
    assert!(problems[0].message.contains("did you mean `>=`"));
    assert!(problems[1].message.contains("lower case: `var`"));
}

#[test]
fn literal_templates_are_not_mistaken_for_operators() {
    let s =
        chart(json!({"a": {"kind": "end", "result": {"status": "ok", "id": {"var": "args.id"}}}}));
    assert_eq!(check(&s), vec![]);
    let s = chart(json!({"a": {"kind": "end", "result": {"summary": {"cat": ["a", "b"]}}}}));
    assert_eq!(check(&s), vec![]);
}

#[test]
fn a_var_outside_args_and_state_is_reported() {
    let s = chart(json!({
        "a": {"kind": "set", "values": {
            "x": {"var": "amount"},
            "y": {"var": ["total", 0]},
            "z": {"map": [{"var": "args.items"}, {"var": "price"}]},
            "w": {"reduce": [{"var": "state.xs"}, {"+": [{"var": "current"}, {"var": "accumulator"}]}, 0]},
            "v": {"var": ""}
        }}
    }));
    let problems = check(&s);
    assert_eq!(
        paths(&problems),
        [
            "/flowchart/stages/a/values/x/var",
            "/flowchart/stages/a/values/y/var"
        ],
        "{problems:#?}"
    );
    assert!(problems[0].message.contains("`amount` reads nothing"));
}

#[test]
fn an_expression_that_does_not_compile_is_reported() {
    let mut deep = json!(1);
    for _ in 0..300 {
        deep = json!({"!": [deep]});
    }
    let s = spec(
        json!({"description": "d", "flowchart": {"start": "a", "stages": {"a": {"kind": "end"}}}, "resultMapper": deep}),
    );
    only(&check(&s), "/resultMapper", "does not compile");
}

#[test]
fn every_expression_field_is_checked() {
    let bad = json!({"Var": "args.x"});
    let s = spec(json!({
        "description": "d",
        "flowchart": {"start": "a", "stages": {
            "a": {"kind": "set", "values": {"k": bad}, "next": "b"},
            "b": {"kind": "tool", "tool": "calculator", "args": {"expression": bad}, "output": "o", "next": "c"},
            "c": {"kind": "llm", "prompt": bad, "output": "o", "next": "d"},
            "d": {"kind": "decide", "rules": [{"condition": bad, "next": "s"}], "default": "s"},
            "s": {"kind": "select", "rules": [{"condition": bad, "branch": "e"}], "next": "l"},
            "l": {"kind": "loop", "condition": bad, "body": "e", "maxIterations": 1, "next": "f"},
            "f": {"kind": "flow", "flowchart": "main", "args": {"q": bad}, "output": "o", "next": "e"},
            "e": {"kind": "end", "result": bad}
        }},
        "resultMapper": bad
    }));
    let problems = check(&s);
    let mut want: Vec<&str> = vec![
        "/flowchart/stages/a/values/k/Var",
        "/flowchart/stages/b/args/expression/Var",
        "/flowchart/stages/c/prompt/Var",
        "/flowchart/stages/d/rules/0/condition/Var",
        "/flowchart/stages/e/result/Var",
        "/flowchart/stages/f/args/q/Var",
        "/flowchart/stages/f/flowchart",
        "/flowchart/stages/l/condition/Var",
        "/flowchart/stages/s/rules/0/condition/Var",
        "/resultMapper/Var",
    ];
    want.sort();
    assert_eq!(paths(&problems), want, "{problems:#?}");
}

// ----- schemas ----------------------------------------------------------------------------------

#[test]
fn the_input_schema_must_compile_and_describe_an_object() {
    let with = |schema: Value| {
        spec(
            json!({"description": "d", "inputSchema": schema, "flowchart": {"start": "a", "stages": {"a": {"kind": "end"}}}}),
        )
    };
    only(
        &check(&with(json!({"type": "objekt"}))),
        "/inputSchema/type",
        "not a valid JSON Schema",
    );
    only(
        &check(&with(
            json!({"type": "object", "properties": {"x": {"minimum": "ten"}}}),
        )),
        "/inputSchema/properties/x/minimum",
        "not a valid JSON Schema",
    );
    only(
        &check(&with(json!({"type": "string"}))),
        "/inputSchema/type",
        "must be \"object\"",
    );
    only(
        &check(&with(json!(true))),
        "/inputSchema/type",
        "must be \"object\"",
    );
    only(
        &check(&with(json!(5))),
        "/inputSchema",
        "not a valid JSON Schema",
    );
    assert_eq!(check(&with(json!({"type": "object"}))), vec![]);
}

#[test]
fn an_llm_output_schema_must_compile() {
    let s = chart(
        json!({"a": {"kind": "llm", "prompt": "p", "outputSchema": {"type": 7}, "output": "o"}}),
    );
    only(
        &check(&s),
        "/flowchart/stages/a/outputSchema/type",
        "not a valid JSON Schema",
    );
}

// ----- all at once ------------------------------------------------------------------------------

#[test]
fn every_problem_is_reported_sorted_by_path() {
    let s = spec(json!({
        "description": "",
        "inputSchema": {"type": "array"},
        "flowchart": {"start": "zz", "stages": {
            "a": {"kind": "loop", "condition": true, "body": "a", "maxIterations": 0, "next": "ghost"},
            "b": {"kind": "tool", "tool": "nope", "output": "bad key"}
        }}
    }));
    let problems = check_with("bad name", &s, &BTreeMap::new());
    assert_eq!(
        paths(&problems),
        [
            "/description",
            "/flowchart/stages/a/body",
            "/flowchart/stages/a/maxIterations",
            "/flowchart/stages/a/next",
            "/flowchart/stages/b/output",
            "/flowchart/stages/b/tool",
            "/flowchart/start",
            "/inputSchema/type",
            "/name",
        ],
        "{problems:#?}"
    );
}
