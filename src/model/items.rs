//! Todo items: their statuses and kinds, the tool calls they made with their results, and the
//! item's own ReAct conversation.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

string_enum! {
    /// Status of a todo item (the seed's statuses).
    ItemStatus {
        Pending => "pending",
        InProgress => "in_progress",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
        Waiting => "waiting",
    }
}

impl ItemStatus {
    /// Completed, failed and cancelled items are never executed again.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

string_enum! {
    /// Whether an item is executed with tools or by reasoning alone.
    StepType {
        Tool => "tool",
        Reasoning => "reasoning",
    }
}

string_enum! {
    /// TAEF: how strictly an item's `requiredTools` are enforced.
    ToolValidationMode {
        /// The item fails (after retries) unless every required tool was called.
        Strict => "strict",
        /// A skipped required tool is recorded but the item still completes.
        Advisory => "advisory",
    }
}

string_enum! {
    /// TAEF outcome for an item.
    ValidationStatus {
        Pending => "pending",
        Passed => "passed",
        Failed => "failed",
        Skipped => "skipped",
    }
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallRecord {
    /// The model's tool call id.
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

string_enum! {
    /// How a tool call ended, as journaled in the item's `toolResults` and shown in
    /// `TOOL_EXECUTION`.
    ToolResultStatus {
        /// The tool ran and returned an output.
        Success => "success",
        /// The tool failed, was not available, or its arguments did not fit.
        Error => "error",
        /// A person rejected the call (or nobody decided in time).
        Rejected => "rejected",
        /// A person answered in the tool's place.
        Responded => "responded",
    }
}

/// The journaled outcome of one tool call: written before the next model call, so a run resumed
/// after a crash never executes it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultRecord {
    pub tool_call_id: String,
    pub name: String,
    /// `success`, `error`, `rejected` or `responded`.
    pub status: ToolResultStatus,
    pub output: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One message of an item's ReAct conversation, kept on the item so execution can continue from
/// exactly where it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationMessage {
    pub role: MessageRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// One todo item of a plan: a row of its own, so a status change is one small write.
///
/// Serialized through [`TodoItemWire`], which adds `createdTimestamp`/`updatedTimestamp` (Unix
/// milliseconds, the seed's fields) computed from `created_at`/`updated_at`: the two forms of a
/// time are never stored twice, so they cannot disagree.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TodoItem {
    pub id: ItemId,
    /// Order in the plan (0-based).
    pub position: i64,
    pub description: String,
    pub status: ItemStatus,
    pub dependencies: Vec<ItemId>,
    pub step_type: StepType,
    pub required_tools: Vec<String>,
    pub tool_validation_mode: ToolValidationMode,
    pub validation_status: ValidationStatus,
    #[serde(default)]
    pub expected_outcome: Option<String>,
    /// Tool calls the model asked for, in order.
    pub tool_calls: Vec<ToolCallRecord>,
    /// Tool calls that were executed (or answered by a person), in order.
    pub actual_tool_calls: Vec<ToolCallRecord>,
    pub tool_results: Vec<ToolResultRecord>,
    /// The model's reasoning text, turn by turn.
    pub thoughts: Vec<String>,
    /// The item's answer.
    pub result: Option<String>,
    pub error: Option<ErrorInfo>,
    /// Execution attempts (TAEF strict retries count here).
    pub attempts: u32,
    pub usage: Usage,
    /// The ReAct conversation so far (not part of the public state view).
    #[serde(skip)]
    pub conversation: Vec<ConversationMessage>,
    /// The run that last touched the item.
    #[serde(skip)]
    pub run_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub completed_at: Option<DateTime<Utc>>,
    /// `leaf` (executed with a ReAct loop) or `team` (planned into children when ready).
    #[serde(default)]
    pub kind: ItemKind,
    /// The team item this item belongs to; `None` at the top level.
    #[serde(default)]
    pub parent_item_id: Option<ItemId>,
    /// The role (a key of the thread's `roles`) the planner gave the item.
    #[serde(default)]
    pub role: Option<String>,
    /// Tools the item may call; `None` = every enabled tool.
    #[serde(default)]
    pub tool_allowlist: Option<Vec<String>>,
    /// What other items read of the result: the result itself when short, else its compaction.
    #[serde(default)]
    pub compacted_output: Option<String>,
}

string_enum! {
    /// What kind of work an item is.
    #[derive(Default)]
    ItemKind {
        /// Executed with its own ReAct loop.
        #[default]
        Leaf => "leaf",
        /// A sub-goal with its own nested plan, planned when it becomes ready.
        Team => "team",
    }
}

/// One todo item of a plan, as the state and the observations show it. `createdTimestamp` and
/// `updatedTimestamp` are `createdAt` and `updatedAt` in Unix milliseconds.
// The public JSON shape of a `TodoItem`: its fields borrowed, plus the millisecond times.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = TodoItem)]
struct TodoItemWire<'a> {
    id: &'a ItemId,
    /// Order in the plan (0-based).
    position: i64,
    description: &'a str,
    status: ItemStatus,
    dependencies: &'a [ItemId],
    step_type: StepType,
    required_tools: &'a [String],
    tool_validation_mode: ToolValidationMode,
    validation_status: ValidationStatus,
    expected_outcome: &'a Option<String>,
    /// Tool calls the model asked for, in order.
    tool_calls: &'a [ToolCallRecord],
    /// Tool calls that were executed (or answered by a person), in order.
    actual_tool_calls: &'a [ToolCallRecord],
    tool_results: &'a [ToolResultRecord],
    /// The model's reasoning text, turn by turn.
    thoughts: &'a [String],
    /// The item's answer.
    result: &'a Option<String>,
    error: &'a Option<ErrorInfo>,
    /// Execution attempts (TAEF strict retries count here).
    attempts: u32,
    usage: Usage,
    created_at: DateTime<Utc>,
    /// `createdAt` in Unix milliseconds.
    created_timestamp: i64,
    updated_at: DateTime<Utc>,
    /// `updatedAt` in Unix milliseconds: moves with every change of the item (its status too).
    updated_timestamp: i64,
    started_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
    kind: ItemKind,
    /// The team item this item belongs to; null at the top level.
    parent_item_id: Option<&'a ItemId>,
    /// The role the planner gave the item.
    role: Option<&'a str>,
    /// Tools the item may call; absent = every enabled tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_allowlist: Option<&'a [String]>,
    /// What other items read of the result: the result itself when short, else its compaction.
    compacted_output: Option<&'a str>,
}

impl<'a> From<&'a TodoItem> for TodoItemWire<'a> {
    fn from(it: &'a TodoItem) -> Self {
        Self {
            id: &it.id,
            position: it.position,
            description: &it.description,
            status: it.status,
            dependencies: &it.dependencies,
            step_type: it.step_type,
            required_tools: &it.required_tools,
            tool_validation_mode: it.tool_validation_mode,
            validation_status: it.validation_status,
            expected_outcome: &it.expected_outcome,
            tool_calls: &it.tool_calls,
            actual_tool_calls: &it.actual_tool_calls,
            tool_results: &it.tool_results,
            thoughts: &it.thoughts,
            result: &it.result,
            error: &it.error,
            attempts: it.attempts,
            usage: it.usage,
            created_at: it.created_at,
            created_timestamp: it.created_at.timestamp_millis(),
            updated_at: it.updated_at,
            updated_timestamp: it.updated_at.timestamp_millis(),
            started_at: it.started_at,
            completed_at: it.completed_at,
            kind: it.kind,
            parent_item_id: it.parent_item_id.as_ref(),
            role: it.role.as_deref(),
            tool_allowlist: it.tool_allowlist.as_deref(),
            compacted_output: it.compacted_output.as_deref(),
        }
    }
}

impl Serialize for TodoItem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TodoItemWire::from(self).serialize(s)
    }
}

impl utoipa::PartialSchema for TodoItem {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        TodoItemWire::schema()
    }
}

impl ToSchema for TodoItem {
    fn name() -> std::borrow::Cow<'static, str> {
        TodoItemWire::name()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        TodoItemWire::schemas(schemas)
    }
}

/// Thread-level agent state fields (the rest of `PESAgentStateData` is derived from rows).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStateRow {
    pub intent: Option<String>,
    pub title: Option<String>,
    pub plan: Option<String>,
    pub current_step_id: Option<String>,
    /// Bumped on every change; optimistic-concurrency token.
    pub version: i64,
}

/// A function the model may call: a tool as it is offered (its name, what it does, and the JSON
/// Schema of its arguments object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}
