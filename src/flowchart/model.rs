//! What a flowchart is, as the API takes it and the store keeps it: a start
//! stage and stages by id, each of one kind. Expressions (`Expr`) are JSON Logic over
//! `{args, state}`; a key is the top-level `state` key a stage writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A JSON Logic expression over `{args, state}` (`{"var": "state.total"}`, `{">": [{"var":
/// "args.amount"}, 100]}`, or a literal).
pub type Expr = Value;

/// The body of `PUT /v1/flowcharts/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowchartSpec {
    /// What the tool does, as the model reads it.
    pub description: String,
    /// JSON Schema of the arguments the model gives; default `{type: object, properties: {}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<Value>,
    pub flowchart: Flowchart,
    /// Expression giving the call's result when it ends without an `end` stage's `result`
    /// (default: the whole state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub result_mapper: Option<Expr>,
}

impl FlowchartSpec {
    /// The input schema, or the default `{type: object, properties: {}}`.
    pub fn input_schema(&self) -> Value {
        self.input_schema
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}))
    }
}

/// The procedure: where it starts and its stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Flowchart {
    /// The id of the first stage.
    pub start: String,
    /// The stages by id.
    pub stages: BTreeMap<String, Stage>,
}

/// One rule of a `decide` stage: when `condition` holds (first in order), go to `next`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecideRule {
    #[schema(value_type = Value)]
    pub condition: Expr,
    pub next: String,
}

/// One rule of a `select` stage: when `condition` holds, run the chain starting at `branch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelectRule {
    #[schema(value_type = Value)]
    pub condition: Expr,
    pub branch: String,
}

/// One stage. A stage without `next` ends its chain: inside a `select` branch or a `loop` body
/// control returns there; elsewhere the call ends (like `end` without `result`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Stage {
    /// Write values into state.
    Set {
        #[schema(value_type = Object)]
        values: BTreeMap<String, Expr>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// Call a registered tool with computed arguments; write its result under `output`.
    Tool {
        tool: String,
        #[serde(default)]
        #[schema(value_type = Object)]
        args: BTreeMap<String, Expr>,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// Ask the thread's model; with `outputSchema`, for structured output.
    Llm {
        #[schema(value_type = Value)]
        prompt: Expr,
        #[serde(
            default,
            rename = "outputSchema",
            skip_serializing_if = "Option::is_none"
        )]
        #[schema(value_type = Option<Object>)]
        output_schema: Option<Value>,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// The first rule whose condition holds picks `next`, else `default`.
    Decide {
        rules: Vec<DecideRule>,
        default: String,
    },
    /// Every rule that holds runs its branch, in order; then `next`.
    Select {
        rules: Vec<SelectRule>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// Run the chain at `body` while `condition` holds, at most `maxIterations` times.
    Loop {
        #[schema(value_type = Value)]
        condition: Expr,
        body: String,
        #[serde(rename = "maxIterations")]
        max_iterations: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// Call another flowchart by name with computed arguments (fresh state); write its result.
    Flow {
        flowchart: String,
        #[serde(default)]
        #[schema(value_type = Object)]
        args: BTreeMap<String, Expr>,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// End the call with `result` (else the result mapper, else the state).
    End {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Value>)]
        result: Option<Expr>,
    },
}

impl Stage {
    /// The stage kind as the API spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Stage::Set { .. } => "set",
            Stage::Tool { .. } => "tool",
            Stage::Llm { .. } => "llm",
            Stage::Decide { .. } => "decide",
            Stage::Select { .. } => "select",
            Stage::Loop { .. } => "loop",
            Stage::Flow { .. } => "flow",
            Stage::End { .. } => "end",
        }
    }

    /// The stage that follows in its chain, when there is one (`decide` picks among its rules).
    pub fn next(&self) -> Option<&str> {
        match self {
            Stage::Set { next, .. }
            | Stage::Tool { next, .. }
            | Stage::Llm { next, .. }
            | Stage::Select { next, .. }
            | Stage::Loop { next, .. }
            | Stage::Flow { next, .. } => next.as_deref(),
            Stage::Decide { .. } | Stage::End { .. } => None,
        }
    }
}

/// A stored version of a flowchart.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowchartRecord {
    /// The tool name.
    pub name: String,
    /// 1 for the first PUT, then one more per PUT.
    pub version: i64,
    #[serde(flatten)]
    pub spec: FlowchartSpec,
    pub created_at: chrono::DateTime<chrono::Utc>,
}
