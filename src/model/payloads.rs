//! What each observation's `content` holds: one type per observation type, both ways. Emitters
//! build it and serialize it once, when the observation is made ([`Payload`],
//! [`NewObservation::of`]); readers (the terminal client, AG-UI, A2A, MCP, the engine reading its
//! own log) take it back with [`Observation::payload`] instead of picking keys out of JSON. The
//! OpenAPI document describes `content` with these same types (`src/http/doc/observations.rs`),
//! so the document, the stream and the readers cannot drift apart.
//!
//! `FLOWCHART_STEP` and `A2A_TASK_UPDATE` are open: each stage kind and each remote event adds
//! fields of its own, kept whole in their `extra` map.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    Decision, ErrorInfo, ItemId, ItemKind, ItemStatus, NewObservation, ObservationType, StepType,
    SuspensionKind, TodoItem, ToolCallRecord, ToolResultStatus, Usage, ValidationStatus,
};

/// The content of one observation type.
pub trait Payload: Serialize + serde::de::DeserializeOwned {
    /// The type of the observations that carry it.
    const KIND: ObservationType;
}

macro_rules! payloads {
    ($($t:ident => $k:ident),+ $(,)?) => {
        $(impl Payload for $t { const KIND: ObservationType = ObservationType::$k; })+
    };
}

payloads! {
    RunStartedContent => RunStarted,
    IntentContent => Intent,
    TitleContent => Title,
    PlanContent => Plan,
    PlanUpdateContent => PlanUpdate,
    ItemStatusChangeContent => ItemStatusChange,
    ThoughtsContent => Thoughts,
    ToolCallContent => ToolCall,
    ToolExecutionContent => ToolExecution,
    AgentSuspendedContent => AgentSuspended,
    AgentResumedContent => AgentResumed,
    SynthesisContent => Synthesis,
    FinalResponseContent => FinalResponse,
    ErrorContent => Error,
    RunCompletedContent => RunCompleted,
    RunFailedContent => RunFailed,
    RunCancelledContent => RunCancelled,
    RunSuspendedContent => RunSuspended,
    CompactionContent => Compaction,
    BudgetContent => Budget,
    SteeringContent => Steering,
    FlowchartStepContent => FlowchartStep,
    A2aTaskUpdateContent => A2aTaskUpdate,
}

impl super::Observation {
    /// The content as its type's payload: `None` when the observation is of another type, or
    /// its content does not read as that type (a row written by an older version may lack a
    /// field a reader needs; readers treat it as absent, never as a reason to fail).
    pub fn payload<P: Payload>(&self) -> Option<P> {
        if self.kind != P::KIND {
            return None;
        }
        P::deserialize(&self.content).ok()
    }
}

impl NewObservation {
    /// A run-level or item-level observation of `payload`'s type, with a fresh id: the payload
    /// is serialized here, once.
    pub fn of<P: Payload>(
        run_id: Uuid,
        parent_id: Option<String>,
        title: impl Into<String>,
        payload: &P,
    ) -> Self {
        let content = serde_json::to_value(payload).expect("a payload is always JSON");
        Self::new(run_id, parent_id, P::KIND, title, content)
    }
}

/// `RUN_STARTED`: the run began (again, after a crash or a resume: `attempt` counts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStartedContent {
    /// The run's query.
    pub query: String,
    /// The provider that answers (`openai`, `anthropic`, `offline`, …).
    pub provider: String,
    /// The model in use; null when the provider has no default and none was asked for.
    #[schema(required = true)]
    pub model: Option<String>,
    /// The run's lease attempt.
    pub attempt: i64,
    /// The assistant version the run uses; null when it uses none.
    #[schema(required = true)]
    pub assistant: Option<super::AssistantRef>,
    /// Only with the offline model: that its answers are not a real model's.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Only for a run a cron's tick made: that cron.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron_id: Option<uuid::Uuid>,
}

/// `INTENT`: what the planner understood the query to ask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IntentContent {
    pub intent: String,
}

/// `TITLE`: the thread's title, as the planner wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TitleContent {
    pub title: String,
}

/// One todo item as `PLAN` and `PLAN_UPDATE` list it: enough to draw the list and its graph, none
/// of the item's work (results, tool calls, thoughts, conversation), so the size of an observation
/// does not grow with what the thread has done. The whole item is in the thread's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TodoSummary {
    pub id: ItemId,
    pub description: String,
    pub status: ItemStatus,
    pub dependencies: Vec<ItemId>,
    pub step_type: StepType,
    pub required_tools: Vec<String>,
    pub kind: ItemKind,
    /// The team the item belongs to (null at the top level).
    #[schema(required = true)]
    pub parent_item_id: Option<ItemId>,
    /// The role the planner gave the item.
    #[schema(required = true)]
    pub role: Option<String>,
}

impl From<&TodoItem> for TodoSummary {
    fn from(it: &TodoItem) -> Self {
        Self {
            id: it.id.clone(),
            description: it.description.clone(),
            status: it.status,
            dependencies: it.dependencies.clone(),
            step_type: it.step_type,
            required_tools: it.required_tools.clone(),
            kind: it.kind,
            parent_item_id: it.parent_item_id.clone(),
            role: it.role.clone(),
        }
    }
}

/// The todo list as observations carry it (see [`TodoSummary`]).
pub fn summary(items: &[TodoItem]) -> Vec<TodoSummary> {
    items.iter().map(TodoSummary::from).collect()
}

/// `PLAN`: the run's plan (run-level), or a team item's plan of its children (under the team).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanContent {
    pub plan: String,
    pub todo_list: Vec<TodoSummary>,
    /// Only on a team's plan: the team item.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team_id: Option<ItemId>,
}

/// `PLAN_UPDATE`: the plan changed (refined by a follow-up, or by the `update_plan` tool). The
/// added and changed items as they are now, the removed ones as they were (all pending), and the
/// whole list after the change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanUpdateContent {
    pub added: Vec<TodoItem>,
    pub changed: Vec<TodoItem>,
    pub removed: Vec<TodoItem>,
    pub todo_list: Vec<TodoSummary>,
    /// Only when a follow-up or steering refined the plan: its new text.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Only when steering refined the plan: the steering messages the planner took in (so a run
    /// taken over after a crash plans for none of them twice).
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steering_message_ids: Option<Vec<Uuid>>,
    /// Only when the planner's refinement for steering was not valid: `true`, the plan stays
    /// as it was (the lists are empty; `todoList` is the plan as it is).
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unchanged: Option<bool>,
    /// With `unchanged`: why the refinement was not taken.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `ITEM_STATUS_CHANGE`: an item moved from one status to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemStatusChangeContent {
    pub item_id: ItemId,
    pub status: ItemStatus,
    pub previous_status: ItemStatus,
}

/// Why an answer was sent back: the required tools it skipped, and which retry this is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequiredToolRetry {
    pub missing_tools: Vec<String>,
    pub retry: u32,
}

/// `THOUGHTS`: what the model wrote in one turn of an item; `final` on the item's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThoughtsContent {
    pub item_id: ItemId,
    pub text: String,
    /// The item's model turn (0-based).
    pub iteration: u32,
    /// Only on the item's answer: `true`.
    #[serde(rename = "final")]
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_final: Option<bool>,
    /// Only on the item's answer: the TAEF outcome.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_status: Option<ValidationStatus>,
    /// Only when TAEF strict sent the answer back: why.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<RequiredToolRetry>,
}

impl ThoughtsContent {
    /// One ReAct turn's text (not the answer).
    pub fn turn(item_id: ItemId, text: &str, iteration: usize) -> Self {
        Self {
            item_id,
            text: text.to_owned(),
            iteration: u32::try_from(iteration).unwrap_or(u32::MAX),
            is_final: None,
            validation_status: None,
            validation: None,
        }
    }
}

/// `TOOL_CALL`: the model asked for a tool call (its arguments as the model wrote them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallContent {
    pub tool_call_id: String,
    pub name: String,
    /// Any JSON: the model's arguments.
    pub arguments: Value,
}

/// `TOOL_EXECUTION`: how a tool call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolExecutionContent {
    pub tool_call_id: String,
    pub name: String,
    pub status: ToolResultStatus,
    /// Any JSON: the tool's output (null when it has none).
    pub output: Value,
    /// Why it failed; null unless `status` is `error`.
    #[schema(required = true)]
    pub error: Option<String>,
}

/// `AGENT_SUSPENDED`: an item waits for a person (the suspension, as `GET
/// /v1/suspensions/{suspensionId}` shows it in full).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSuspendedContent {
    pub suspension_id: Uuid,
    pub item_id: ItemId,
    pub kind: SuspensionKind,
    pub tool_call: ToolCallRecord,
    pub allowed_decisions: Vec<Decision>,
    /// The question of an `input` or `remote_input` suspension.
    #[schema(required = true)]
    pub question: Option<String>,
    /// The JSON Schema an answer must fit, when the question has one.
    #[schema(required = true)]
    pub input_schema: Option<Value>,
    /// When it resolves as a rejection if nobody decides; null = never.
    #[schema(required = true)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// `AGENT_RESUMED`: a suspension was decided (or expired).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentResumedContent {
    pub suspension_id: Uuid,
    pub decision: Decision,
    /// The reason given with the decision; null when none was given.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// Nobody decided in time (the decision is `reject`).
    pub expired: bool,
}

/// `SYNTHESIS`: the answer is being written from the items of the run, which ended so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SynthesisContent {
    pub completed: u32,
    pub failed: u32,
    pub cancelled: u32,
}

/// A source the final answer cites.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FinalResponseSource {
    pub title: String,
    pub url: String,
}

/// `FINAL_RESPONSE`: the run's answer (also the run's `finalResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FinalResponseContent {
    /// The answer's text (a `flowchart` run's: its output, a JSON text unless it is a string).
    pub response: String,
    pub sources: Vec<FinalResponseSource>,
    /// Follow-up questions the model suggests.
    pub suggestions: Vec<String>,
    /// A `flowchart` run only: the flowchart's output, as the JSON it returned (absent on an
    /// `agent` run's answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

/// Where an error happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPhase {
    Plan,
    Execute,
    Synthesize,
}

/// `ERROR`: a run or an item failed (under the item when one did).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorContent {
    #[schema(inline)]
    pub phase: ErrorPhase,
    pub code: String,
    pub message: String,
    /// The item that failed, when one did.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_id: Option<ItemId>,
}

/// `RUN_COMPLETED`: the run ended with its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCompletedContent {
    pub usage: Usage,
    pub duration_ms: i64,
}

/// `RUN_FAILED`: the run ended without an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunFailedContent {
    pub error: ErrorInfo,
    pub usage: Usage,
}

/// Why a run was cancelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CancelReason {
    /// A client cancelled it.
    Cancelled,
    /// A run posted with `multitaskStrategy: interrupt` took its place (`byRunId`).
    Interrupted,
}

/// `RUN_CANCELLED`: the run ended early.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCancelledContent {
    #[schema(inline)]
    pub reason: CancelReason,
    /// Only for `interrupted`: the run that took its place.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_run_id: Option<Uuid>,
    /// The usage so far, when the run had started.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `RUN_SUSPENDED`: nothing in the run can go on until a person decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSuspendedContent {
    /// The pending suspensions the run waits on.
    pub suspension_ids: Vec<Uuid>,
    pub usage: Usage,
}

/// `COMPACTION`: an item's long result was summarized for the items that read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactionContent {
    pub item_id: ItemId,
    pub summary: String,
    pub input_chars: u64,
    pub output_chars: u64,
}

/// `FLOWCHART_STEP`: one executed stage of a flowchart call, under the call's `TOOL_CALL` (a
/// sub-flow's stages under their `flow` stage's step). Besides the fields here, a stage kind
/// adds its own (`decision` on `decide` and `select`, `matched` on `loop`, `usage` on `llm`,
/// `lastStep` on `flow`, `errorStage` on a failed call): the object is open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowchartStepContent {
    pub flowchart: String,
    pub version: i64,
    /// The stage's id in its own flowchart.
    pub stage: String,
    /// Inside a sub-flow: how the call reaches the stage (`<flow stage>/<stage>`).
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The stage's kind (`set`, `tool`, `llm`, `decide`, `select`, `loop`, `flow`, `end`).
    pub kind: String,
    pub iteration: u32,
    pub step: u32,
    /// The flowchart call's `TOOL_CALL` id.
    pub tool_call_id: String,
    /// Inside a sub-flow: the `step` of its `flow` stage.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_step: Option<u32>,
    pub duration_ms: u64,
    /// The values the stage read, by path (a large one as a marker).
    #[schema(value_type = Object)]
    pub reads: Value,
    /// The state keys the stage wrote, with their values.
    #[schema(value_type = Object)]
    pub writes: Value,
    /// `tool` stages: the tool called.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// `tool` and `flow` stages: the arguments they computed.
    #[schema(nullable = false, value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    /// A failed stage: why.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The fields of the stage's own kind (`decision`, `matched`, `usage`, `lastStep`,
    /// `errorStage`, …).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: serde_json::Map<String, Value>,
}

/// What a remote agent sent as an artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct A2aArtifactContent {
    #[schema(required = true)]
    pub name: Option<String>,
    /// Its parts: text parts as strings, data parts as their JSON.
    pub parts: Vec<Value>,
}

/// `A2A_TASK_UPDATE`: what a remote agent reported of a task delegated to it, under the
/// delegating `TOOL_CALL`. Each update carries the fields of what happened (the task, a status,
/// an artifact, a message, an answer forwarded, how the call settled): the object is open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct A2aTaskUpdateContent {
    pub tool_call_id: String,
    /// The remote agent's name.
    pub agent: String,
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_id: Option<ItemId>,
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task's state (`submitted`, `working`, `input-required`, `completed`, `failed`, …).
    pub state: Option<String>,
    /// The text of the task's status message.
    pub message: Option<String>,
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<A2aArtifactContent>,
    /// How the call settled: `{result}`, `{error}` or `{question}`.
    #[schema(nullable = false, value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled: Option<Value>,
    /// The suspension whose answer was forwarded to the remote agent.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Uuid>,
    /// The person declined to answer the remote agent.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declined: Option<bool>,
    /// The run was cancelled and the remote task with it.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<bool>,
    /// Anything else the update carries.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: serde_json::Map<String, Value>,
}

/// Which mark of its budget a run's spend reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetState {
    /// 80 % of a limit: the run goes on.
    Warning,
    /// The next model call would pass a limit: the run suspends or fails (its `onExceed`).
    Exceeded,
}

/// Whose budget a `BUDGET` observation (or a `budget` suspension) is about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetScope {
    /// The run's own (set on the run, its thread or its assistant).
    #[default]
    Run,
    /// The tenant's daily budget (`PES_TENANT_BUDGETS`), spent by all its runs since UTC
    /// midnight.
    Tenant,
}

/// `BUDGET`: the spend reached 80 % of a budget, or its limit (run-level). `scope` says whose:
/// the run's (its spend and limits, as raised so far) or the tenant's daily budget (the tenant's
/// spend today, and the limits as raised for this run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetContent {
    #[schema(inline)]
    pub state: BudgetState,
    #[schema(inline)]
    pub scope: BudgetScope,
    pub spent_tokens: u64,
    pub spent_usd: f64,
    /// The token limit, when the budget has one.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_tokens: Option<u64>,
    /// The dollar limit, when the budget has one.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_usd: Option<f64>,
}

/// `STEERING`: a person's message to a run in flight (run-level). The run reads it at its next
/// safe point; it is in the thread's conversation as a user message (`messageId`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SteeringContent {
    pub message: String,
    pub message_id: Uuid,
}
