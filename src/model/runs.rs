//! Threads and runs: their statuses, what a run used (usage), how it failed, and the
//! conversation's messages.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

string_enum! {
    /// Lifecycle of a run. `queued` → `running` → (`suspended` ↔ `running`) → `completed` | `failed`
    /// | `cancelled`.
    RunStatus {
        Queued => "queued",
        Running => "running",
        Suspended => "suspended",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

impl RunStatus {
    /// A run in a terminal status never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
    /// Queued, running and suspended runs occupy their thread.
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }
}

string_enum! {
    /// Thread status, derived from its runs: `busy` while a run is queued or running, `suspended`
    /// while one waits for a person, `error` when the latest run failed, else `idle`.
    ThreadStatus {
        Idle => "idle",
        Busy => "busy",
        Suspended => "suspended",
        Error => "error",
    }
}

string_enum! {
    /// What happens to a query posted while another run of the thread is active.
    MultitaskStrategy {
        /// Answer 409.
        Reject => "reject",
        /// Run after the active runs (the default).
        Enqueue => "enqueue",
        /// Cancel the active run at its next safe point, keep its progress, then run.
        Interrupt => "interrupt",
        /// Steer the thread's active run with the query instead of starting another (as
        /// `POST …/runs/{runId}/steer`); with no active run, run it.
        Steer => "steer",
    }
}

/// Token usage and what it cost, summed per item and per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Model calls made (including retries that returned a reply).
    pub llm_calls: u64,
    /// Of `promptTokens`, those the provider served from its cache (priced at `cachedInput`);
    /// absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schema(minimum = 0)]
    pub cached_prompt_tokens: u64,
    /// What these tokens cost in US dollars, by `PES_MODEL_PRICES` (0 when the model has no
    /// price).
    #[serde(default)]
    pub cost_usd: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.llm_calls += other.llm_calls;
        self.cached_prompt_tokens += other.cached_prompt_tokens;
        self.cost_usd += other.cost_usd;
    }
}

/// Why a run or item failed: a stable code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
}

/// A thread as stored and as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    pub thread_id: ThreadId,
    #[serde(skip)]
    pub tenant: String,
    pub status: ThreadStatus,
    /// The client's JSON object.
    #[schema(value_type = Object)]
    pub metadata: Value,
    pub config: AgentConfig,
    /// The assistant whose config the thread's runs start from (its config overlays it); null
    /// when none.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub assistant_id: Option<AssistantId>,
    /// The assistant version the thread is pinned to; null follows the assistant's current
    /// version, read when each run is enqueued.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub assistant_version: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The most of a run's query a thread list carries, in characters: enough to recognise the thread
/// by, while a page of 200 threads stays small whatever their queries hold.
pub const LAST_QUERY_CHARS: usize = 200;

/// A thread as `GET /v1/threads` lists it: the thread, with what a person recognises it by, so a
/// list can show more than ids without a read per thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadSummary {
    #[serde(flatten)]
    pub thread: Thread,
    /// The thread's title (the agent state's `title`, set by the `TITLE` observation of its
    /// latest planned run); null until a run has planned.
    pub title: Option<String>,
    /// The query of the thread's newest run, its first 200 characters; null when no run was
    /// posted.
    pub last_query: Option<String>,
}

string_enum! {
    /// Where the engine is in a run: `new` → `planning` → `executing` → `synthesizing` → `done`.
    /// Stored with the run so a run re-claimed after a crash skips the phases it finished.
    #[derive(Default)]
    RunPhase {
        /// A run that has not started.
        #[default]
        New => "new",
        Planning => "planning",
        Executing => "executing",
        Synthesizing => "synthesizing",
        Done => "done",
    }
}

string_enum! {
    /// What a run does. An `agent` run plans the query, executes its items and synthesizes an
    /// answer; a `flowchart` run (`POST /v1/flowcharts/{name}/runs`, or a flowchart tool of the
    /// MCP server) runs one flowchart with the given input, and its output is the run's answer.
    #[derive(Default)]
    RunKind {
        #[default]
        Agent => "agent",
        Flowchart => "flowchart",
    }
}

/// What a `flowchart` run runs: the flowchart (by name, in the version current when its call
/// starts) and the input, already checked against the flowchart's input schema at enqueue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowchartCall {
    pub name: String,
    pub input: Value,
}

/// A run of a query on a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub run_id: Uuid,
    pub thread_id: ThreadId,
    #[serde(skip)]
    pub tenant: String,
    pub status: RunStatus,
    /// `agent` (planned, executed and synthesized by the model) or `flowchart` (one flowchart
    /// run with its input: no model call unless the flowchart has `llm` stages).
    #[serde(default)]
    pub kind: RunKind,
    /// The run's query (a `flowchart` run's says which flowchart and input it runs).
    pub query: String,
    /// A `flowchart` run's flowchart and input (internal: the query shows them).
    #[serde(skip)]
    pub flowchart: Option<FlowchartCall>,
    /// Per-run overrides of the thread's config.
    pub config: AgentConfig,
    /// The assistant version the run uses, fixed when it was enqueued (the thread's or the
    /// run's choice); null when it uses none.
    #[serde(default)]
    pub assistant: Option<AssistantRef>,
    pub multitask_strategy: MultitaskStrategy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
    pub usage: Usage,
    #[serde(default)]
    pub error: Option<ErrorInfo>,
    /// The run's answer once it completed: what its `FINAL_RESPONSE` observation holds.
    #[serde(default)]
    #[schema(schema_with = final_response_schema)]
    pub final_response: Option<Value>,
    /// The pending suspension this run waits on, when suspended.
    #[serde(default)]
    #[schema(value_type = Option<Suspension>)]
    pub suspension: Option<Value>,
    /// Lease attempt counter; every write of a worker is fenced by it.
    pub attempt: i64,
    /// The cron whose tick made this run; null when a client posted it.
    #[serde(default)]
    pub cron_id: Option<Uuid>,
    /// Where the agent is in the run (internal: not part of the API).
    #[serde(skip)]
    pub phase: RunPhase,
    /// A cancel was asked for and the worker has not yet acted on it.
    #[serde(skip)]
    pub cancel_requested: bool,
    /// The thread's last observation `seq` when the run was created: the run's own observations
    /// all come after it.
    #[serde(skip)]
    pub start_seq: i64,
    /// The W3C trace context the run's spans continue (internal: see
    /// [`crate::telemetry::TraceContext`]), as stored.
    #[serde(skip)]
    pub trace_context: Option<String>,
}

/// `Run::final_response` in the document: null or the `FinalResponseContent` schema (the content
/// of `FINAL_RESPONSE`, which the document's observation schemas define).
fn final_response_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .item(utoipa::openapi::Ref::from_schema_name(
            "FinalResponseContent",
        ))
        .into()
}

/// A message of the thread's conversation history, in the order an OpenAI-style reader expects:
/// the user's query; for each tool-using turn of an item, the assistant message with its
/// `toolCalls` and then one `tool` message per call; the run's final answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub id: Uuid,
    pub thread_id: ThreadId,
    #[serde(default)]
    pub run_id: Option<Uuid>,
    pub role: MessageRole,
    pub content: String,
    /// The todo item whose execution made this message (tool-call turns and tool results); null
    /// for the user's queries and the final answers.
    #[serde(default)]
    pub item_id: Option<String>,
    /// Tool messages: the call they answer (an id of the `toolCalls` of an assistant message
    /// before them).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Tool messages: the tool that answered.
    #[serde(default)]
    pub name: Option<String>,
    /// Assistant messages of an item's ReAct loop: the tool calls the model made in this turn,
    /// each answered by a tool message after it (empty on every other message).
    pub tool_calls: Vec<ToolCallRecord>,
    pub created_at: DateTime<Utc>,
}
