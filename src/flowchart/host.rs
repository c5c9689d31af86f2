//! What a flowchart call needs from the run it serves ([`FlowHost`]: stored flowcharts, the
//! journal, tools, the model, people's decisions), what it commits ([`StepRecord`]), and how it
//! ends when it does not end with a result ([`FlowError`], [`Paused`]).

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use super::model::FlowchartRecord;
use crate::model::Usage;

/// Sub-flows nest at most this deep.
pub const MAX_DEPTH: u32 = 8;

/// What a flowchart call uses of the run it serves.
///
/// Its errors are text: each becomes the failed stage's message, which the model reads as the
/// call's tool error (and the engine implements this trait, in `agent/calls/flowchart.rs`).
#[async_trait]
pub trait FlowHost: Send + Sync {
    /// A stored flowchart of the run's tenant: the latest version, or the one given (even
    /// deleted since: a call resumes on the version it started with).
    async fn load(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Option<FlowchartRecord>, String>;
    /// Commit one step durably (its observation), before the call goes on.
    async fn commit_step(&self, step: StepRecord) -> Result<(), String>;
    /// Whether a `tool` stage may call `tool`: only the tools the calling item may call (the
    /// thread's tools, narrowed by the item's `toolAllowlist` and its role's tools).
    fn may_call(&self, _tool: &str) -> bool {
        true
    }
    /// Call a registered tool (validated, bounded by the tool timeout) under `key`.
    async fn call_tool(&self, name: &str, args: Value, key: String) -> Result<Value, String>;
    /// Whether a `tool` stage's call may run: a tool that needs a person (a blocking tool, or
    /// one in the thread's `requireApproval`) waits for a decision on the call `call_id`.
    fn gate(&self, _tool: &str, args: &Value, _call_id: &str) -> Gate {
        Gate::Run(args.clone())
    }
    /// Ask the run's model; with a schema, for a JSON value that fits it.
    async fn ask_model(
        &self,
        prompt: String,
        output_schema: Option<Value>,
    ) -> Result<(Value, Usage), String>;
}

/// What a person's decision makes of a `tool` stage's call.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Run it with these arguments (as proposed, or as a person edited them).
    Run(Value),
    /// A person answered in its place: this is its result.
    Answer(Value),
    /// A person rejected it (or the question expired): the stage fails with this reason.
    Reject(String),
    /// It waits for a person: the call pauses here and resumes in place once one decides.
    Suspend(crate::model::SuspensionKind),
}

/// A call paused at a `tool` stage until a person decides on `call` (`id` =
/// `<toolCallId>:<stage>:<iteration>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Paused {
    pub call: crate::model::ToolCallRecord,
    pub kind: crate::model::SuspensionKind,
}

/// One step to commit: the observation's parent, its own id (a `flow` stage's id is chosen
/// before its sub-flow runs, so the sub-flow's steps can nest under it), title and content.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub id: Uuid,
    pub parent_id: Option<String>,
    pub title: String,
    pub content: Value,
}

/// Why a call ended without a result: the stage (its id, `<flow stage>/<stage>` inside a
/// sub-flow, or `result` when the call's result is too large) and what went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("flowchart stopped at stage `{stage}`: {message}")]
pub struct FlowError {
    pub stage: String,
    pub message: String,
}

/// Limits of one call.
#[derive(Debug, Clone)]
pub struct FlowLimits {
    /// Stages executed per call, sub-flows included (`PES_FLOWCHART_MAX_STEPS`).
    pub max_steps: u32,
    /// Where its expressions run, and their bounds (`PES_FLOWCHART_MAX_VALUE_BYTES`, which
    /// also bounds every value a stage writes and the call's result, and
    /// `PES_FLOWCHART_EXPR_TIMEOUT_MS`).
    pub expr: super::expr::Evaluator,
}
