//! Checking a flowchart before it is stored, so that what the engine runs was
//! sound when it was registered: [`parse_spec`] reads the body, naming the JSON Pointer of the
//! first value that does not fit the shape; [`validate`] then finds *every* problem of what
//! parsed (names, references between stages, loops that could run forever, sub-flow cycles,
//! expressions, schemas), each with the JSON Pointer of the field to fix, sorted by path.
//!
//! The one repetition a flowchart may have is a `loop` stage running its body, at most
//! `maxIterations` times. Everything else must be a finite walk: the stages with their edges
//! (`next`, a `decide` rule's `next` and `default`, and the calls into a `select` branch or a
//! `loop` body) form a graph that must be acyclic, and so must the graph of flowcharts calling
//! each other through `flow` stages.

mod expr;
mod graph;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::model::{FlowchartSpec, Stage};
use crate::json::schema::{CompiledSchema, SchemaError};

/// At most this many stages in one flowchart.
pub const MAX_STAGES: usize = 200;

/// The largest `maxIterations` a `loop` stage may have.
pub const MAX_ITERATIONS: u32 = 10_000;

/// One thing wrong with a flowchart: where (a JSON Pointer into the body of
/// `PUT /v1/flowcharts/{name}`; `/name` is the name in the path) and what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Problem {
    /// JSON Pointer of the offending value, e.g. `/flowchart/stages/triage/next`.
    pub path: String,
    pub message: String,
}

impl Problem {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// What a flowchart is checked against besides itself.
pub struct ValidationEnv<'a> {
    /// Whether a tool of that name exists (the registry's `is_known`): a `tool` stage must
    /// name one.
    pub is_tool: &'a (dyn Fn(&str) -> bool + Sync),
    /// The tenant's flowcharts, name → latest spec (the one being stored may be among them:
    /// the spec under validation takes its place). A `flow` stage must name one of these (or
    /// the flowchart itself, which is a cycle).
    pub flowcharts: &'a BTreeMap<String, FlowchartSpec>,
}

/// A JSON Pointer (RFC 6901) made of `segments`.
pub fn pointer<'a>(segments: impl IntoIterator<Item = &'a str>) -> String {
    segments
        .into_iter()
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// The pointer of a field of a stage: `/flowchart/stages/<id>/<field…>`.
fn at_stage(id: &str, field: &[&str]) -> String {
    pointer(
        ["flowchart", "stages", id]
            .into_iter()
            .chain(field.iter().copied()),
    )
}

/// Read a flowchart from a request body.
///
/// # Errors
/// The first value that does not fit the shape, with its JSON Pointer
/// (`/flowchart/stages/triage/kind: unknown variant `foo`, expected one of …`).
pub fn parse_spec(body: &Value) -> Result<FlowchartSpec, Problem> {
    if let Some(p) = rule_not_an_object(body) {
        return Err(p);
    }
    crate::json::strict::from_value_at(body).map_err(|e| {
        let mut segments: Vec<String> = e
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                serde_path_to_error::Segment::Enum { variant } => Some(variant.clone()),
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let message = e.inner().to_string();
        // A stage is read as a whole before its kind is known, so an unknown kind is reported
        // at the stage: point at the field itself.
        if message.starts_with("unknown variant") && segments.last().is_some_and(|s| s != "kind") {
            segments.push("kind".into());
        }
        Problem::new(pointer(segments.iter().map(String::as_str)), message)
    })
}

/// A stage is read as a whole (its kind decides its shape), and that reading takes a rule given
/// as an array (fields by position) for a rule object; the API says rules are objects.
fn rule_not_an_object(body: &Value) -> Option<Problem> {
    let stages = body.get("flowchart")?.get("stages")?.as_object()?;
    stages.iter().find_map(|(id, stage)| {
        let rules = stage.get("rules")?.as_array()?;
        rules.iter().enumerate().find_map(|(i, rule)| {
            (!rule.is_object()).then(|| {
                Problem::new(
                    at_stage(id, &["rules", &i.to_string()]),
                    format!("invalid type: {}, expected a rule object", json_kind(rule)),
                )
            })
        })
    })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "sequence",
        Value::Object(_) => "map",
    }
}

/// Check a parsed flowchart named `name`.
///
/// # Errors
/// Every problem found, sorted by path.
pub fn validate(
    name: &str,
    spec: &FlowchartSpec,
    env: &ValidationEnv<'_>,
) -> Result<(), Vec<Problem>> {
    let mut out = Vec::new();
    if !is_tool_name(name) {
        out.push(Problem::new(
            "/name",
            format!(
                "`{name}` is not a tool name: 1 to 64 characters of A-Z, a-z, 0-9, `_` and `-`"
            ),
        ));
    }
    if spec.description.trim().is_empty() {
        out.push(Problem::new(
            "/description",
            "must say what the flowchart does (the model reads it to decide when to call it)",
        ));
    }
    if let Some(schema) = &spec.input_schema {
        check_input_schema(schema, &mut out);
    }
    if let Some(mapper) = &spec.result_mapper {
        expr::check(mapper, "/resultMapper", &mut out);
    }
    let chart = &spec.flowchart;
    if chart.stages.len() > MAX_STAGES {
        out.push(Problem::new(
            "/flowchart/stages",
            format!(
                "{} stages; a flowchart has at most {MAX_STAGES}",
                chart.stages.len()
            ),
        ));
    }
    if !chart.stages.contains_key(&chart.start) {
        out.push(Problem::new(
            "/flowchart/start",
            no_such_stage(&chart.start, chart.stages.keys()),
        ));
    }
    for (id, stage) in &chart.stages {
        check_stage(name, id, stage, spec, env, &mut out);
    }
    graph::stage_cycles(chart, &mut out);
    graph::subflow_cycles(name, spec, env, &mut out);
    out.sort();
    out.dedup();
    if out.is_empty() { Ok(()) } else { Err(out) }
}

/// Whether `name` can name a tool, and so a flowchart: `^[A-Za-z0-9_-]{1,64}$`.
pub fn is_tool_name(name: &str) -> bool {
    is_name(name, false)
}

/// `^[A-Za-z0-9_-]{1,64}$` (with `dot`: `.` too, as stage ids allow).
fn is_name(s: &str, dot: bool) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (dot && b == b'.'))
}

fn no_such_stage<'a>(target: &str, ids: impl Iterator<Item = &'a String>) -> String {
    let ids: Vec<&str> = ids.map(String::as_str).collect();
    let shown = if ids.len() > 20 {
        format!("{}, …", ids[..20].join(", "))
    } else {
        ids.join(", ")
    };
    format!("`{target}` names no stage (stages: {shown})")
}

fn check_key(key: &str, at: String, out: &mut Vec<Problem>) {
    if !is_name(key, false) {
        out.push(Problem::new(
            at,
            format!(
                "`{key}` is not a state key: 1 to 64 characters of A-Z, a-z, 0-9, `_` and `-` \
                 (a stage writes one top-level key of `state`)"
            ),
        ));
    }
}

fn check_stage(
    name: &str,
    id: &str,
    stage: &Stage,
    spec: &FlowchartSpec,
    env: &ValidationEnv<'_>,
    out: &mut Vec<Problem>,
) {
    if !is_name(id, true) {
        out.push(Problem::new(
            at_stage(id, &[]),
            format!(
                "`{id}` is not a stage id: 1 to 64 characters of A-Z, a-z, 0-9, `_`, `.` and `-`"
            ),
        ));
    }
    let stages = &spec.flowchart.stages;
    for (at, target) in graph::edges(id, stage) {
        if !stages.contains_key(target) {
            out.push(Problem::new(at, no_such_stage(target, stages.keys())));
        }
    }
    let args = |args: &BTreeMap<String, Value>, out: &mut Vec<Problem>| {
        for (arg, e) in args {
            expr::check(e, &at_stage(id, &["args", arg]), out);
        }
    };
    match stage {
        Stage::Set { values, .. } => {
            for (key, e) in values {
                let at = at_stage(id, &["values", key]);
                check_key(key, at.clone(), out);
                expr::check(e, &at, out);
            }
        }
        Stage::Tool {
            tool,
            args: a,
            output,
            ..
        } => {
            if !(env.is_tool)(tool) {
                let message = if tool == name || env.flowcharts.contains_key(tool) {
                    format!("`{tool}` is a flowchart: call it with a `flow` stage")
                } else {
                    format!("`{tool}` names no tool (see GET /v1/tools)")
                };
                out.push(Problem::new(at_stage(id, &["tool"]), message));
            }
            args(a, out);
            check_key(output, at_stage(id, &["output"]), out);
        }
        Stage::Llm {
            prompt,
            output_schema,
            output,
            ..
        } => {
            expr::check(prompt, &at_stage(id, &["prompt"]), out);
            if let Some(schema) = output_schema {
                let at = at_stage(id, &["outputSchema"]);
                if check_schema(schema, &at, out) && !schema.is_object() {
                    out.push(Problem::new(at, "must be a JSON Schema object"));
                }
            }
            check_key(output, at_stage(id, &["output"]), out);
        }
        Stage::Decide { rules, .. } => {
            for (i, rule) in rules.iter().enumerate() {
                let at = at_stage(id, &["rules", &i.to_string(), "condition"]);
                expr::check(&rule.condition, &at, out);
            }
        }
        Stage::Select { rules, .. } => {
            for (i, rule) in rules.iter().enumerate() {
                let at = at_stage(id, &["rules", &i.to_string(), "condition"]);
                expr::check(&rule.condition, &at, out);
            }
        }
        Stage::Loop {
            condition,
            max_iterations,
            ..
        } => {
            expr::check(condition, &at_stage(id, &["condition"]), out);
            if !(1..=MAX_ITERATIONS).contains(max_iterations) {
                out.push(Problem::new(
                    at_stage(id, &["maxIterations"]),
                    format!(
                        "must be 1 to {MAX_ITERATIONS}: a loop without a bound is an unbounded loop"
                    ),
                ));
            }
        }
        Stage::Flow {
            args: a, output, ..
        } => {
            // The flowchart it names is checked with the sub-flow graph.
            args(a, out);
            check_key(output, at_stage(id, &["output"]), out);
        }
        Stage::End { result } => {
            if let Some(e) = result {
                expr::check(e, &at_stage(id, &["result"]), out);
            }
        }
    }
}

/// The arguments of a call are a JSON object, so the input schema must describe one.
fn check_input_schema(schema: &Value, out: &mut Vec<Problem>) {
    if !check_schema(schema, "/inputSchema", out) {
        return;
    }
    if schema.get("type") != Some(&Value::from("object")) {
        out.push(Problem::new(
            "/inputSchema/type",
            "must be \"object\": the arguments of a call are a JSON object",
        ));
    }
}

/// Whether `schema` compiles; a problem at `at` (or inside it) when it does not.
fn check_schema(schema: &Value, at: &str, out: &mut Vec<Problem>) -> bool {
    let Err(e) = CompiledSchema::compile(schema) else {
        return true;
    };
    // The problem is at `at`, or at the pointer inside the schema the validator names.
    let (path, what) = match e {
        SchemaError::Invalid {
            at: inner, what, ..
        } if inner == "/" => (at.to_owned(), what),
        SchemaError::Invalid {
            at: inner, what, ..
        } if inner.starts_with('/') => (format!("{at}{inner}"), what),
        e => (at.to_owned(), e.to_string()),
    };
    out.push(Problem::new(
        path,
        format!("not a valid JSON Schema: {what}"),
    ));
    false
}

#[cfg(test)]
mod tests;
