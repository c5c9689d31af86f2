//! The tools our MCP server offers a tenant: `ask`, `resume`, and each of its flowcharts under
//! its own name (a flowchart named `ask` or `resume` is offered as `flowchart.ask`,
//! `flowchart.resume`: a dot is never in a flowchart's name). What each takes, as JSON Schema,
//! and how its arguments are read.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::flowchart::FlowchartRecord;
use crate::model::Decision;

/// The prefix of a flowchart whose name is one of our own tools'.
pub const FLOWCHART_PREFIX: &str = "flowchart.";

fn object(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// What every call that runs the agent answers in `structuredContent`.
fn output_schema(with_result: bool) -> Arc<JsonObject> {
    let mut properties = json!({
        "status": {"type": "string", "enum": ["completed", "suspended", "failed", "cancelled", "running"],
            "description": "How the run stands: completed (with `answer`), suspended (waiting for a person: `suspensions`; answer them with `resume`), failed (`error`), cancelled, or running (still going when the call stopped waiting)."},
        "threadId": {"type": "string"},
        "runId": {"type": "string"},
        "answer": {"type": "string", "description": "The final answer (completed)."},
        "sources": {"type": "array", "items": {"type": "object"}},
        "suggestions": {"type": "array", "items": {"type": "string"}},
        "suspensions": {"type": "array", "items": {"type": "object"},
            "description": "The pending suspensions (suspended): `{suspensionId, kind, itemId, question?, toolCall, allowedDecisions, inputSchema?, expiresAt?}`."},
        "error": {"type": "object", "description": "Why the run failed: `{code, message}`."}
    });
    if with_result {
        properties["result"] = json!({"description": "The flowchart's output (completed); the text content is its JSON."});
    }
    object(json!({
        "type": "object",
        "properties": properties,
        "required": ["status", "threadId", "runId"]
    }))
}

/// `ask`: run a query on a thread.
pub fn ask() -> Tool {
    Tool::new(
        "ask",
        "Ask the agent: it plans the query as a todo list, works through it with its tools, and \
         answers. The run is durable (it survives restarts). Returns the answer with the thread \
         and run ids; a run that needs a person's decision returns the pending suspensions \
         instead (answer them with `resume`). Pass `threadId` to follow up on a thread (it is \
         created when missing).",
        object(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "description": "What to ask."},
                "threadId": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$",
                    "description": "The thread to run on (a new one when absent; created when missing)."}
            },
            "required": ["query"],
            "additionalProperties": false
        })),
    )
    .with_title("Ask the agent")
    .with_raw_output_schema(output_schema(false))
    .with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .open_world(true),
    )
}

/// `resume`: decide a suspension.
pub fn resume() -> Tool {
    Tool::new(
        "resume",
        "Decide a suspension the agent waits on, then wait for the run again: `approve` runs the \
         call as proposed, `edit` runs it with `modifiedArgs`, `reject` does not run it (the \
         agent is told `reason`), `respond` answers in its place with `response` (the answer to \
         a question). Returns what `ask` returns.",
        object(json!({
            "type": "object",
            "properties": {
                "suspensionId": {"type": "string", "format": "uuid"},
                "decision": {"type": "string", "enum": Decision::ALL.iter().map(|d| d.as_str()).collect::<Vec<_>>()},
                "response": {"description": "With `respond`: the answer (fitting the suspension's inputSchema when it has one)."},
                "modifiedArgs": {"type": "object", "description": "With `edit`: the arguments to run the call with."},
                "reason": {"type": "string", "maxLength": 4000}
            },
            "required": ["suspensionId", "decision"],
            "additionalProperties": false
        })),
    )
    .with_title("Decide a suspension")
    .with_raw_output_schema(output_schema(false))
}

/// The tool name a flowchart is offered under.
pub fn flowchart_tool_name(name: &str) -> String {
    if matches!(name, "ask" | "resume") {
        format!("{FLOWCHART_PREFIX}{name}")
    } else {
        name.to_owned()
    }
}

/// The flowchart a tool name stands for (the name itself, or without its prefix).
pub fn flowchart_name(tool: &str) -> &str {
    tool.strip_prefix(FLOWCHART_PREFIX).unwrap_or(tool)
}

/// A flowchart of the tenant as a tool: its description and input schema; a call runs the
/// flowchart itself.
pub fn flowchart(record: &FlowchartRecord) -> Tool {
    Tool::new(
        flowchart_tool_name(&record.name),
        format!(
            "{} (the tenant's flowchart `{}`, version {}: runs as a durable run on a new thread; \
             returns its output)",
            record.spec.description, record.name, record.version
        ),
        object(record.spec.input_schema()),
    )
    .with_raw_output_schema(output_schema(true))
}

/// The arguments of `ask`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AskArgs {
    pub query: String,
    #[serde(default)]
    pub thread_id: Option<String>,
}

/// The arguments of `resume`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeArgs {
    pub suspension_id: String,
    pub decision: Decision,
    #[serde(default)]
    pub response: Option<Value>,
    #[serde(default)]
    pub modified_args: Option<Value>,
    #[serde(default)]
    pub reason: Option<String>,
}
