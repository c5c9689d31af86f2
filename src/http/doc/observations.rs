//! What each observation's `content` holds, for the document: the `Observation` schema is a
//! union over `type` of named `<Type>Observation` schemas, each with its content schema
//! (`PlanContent`, `ToolExecutionContent`, …), so a client generated from the document reads a
//! typed payload. The engine builds these payloads as JSON where it emits them (`src/agent`,
//! `src/store/rows.rs`); the types here are their description only, never serialized, and say
//! so where a payload is open (`additionalProperties: true`). The tests that read real runs
//! through the document (`tests/api/openapi.rs`) hold them to what the server sends.

// The content types below are descriptions: nothing constructs them.
#![allow(dead_code)]

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::schema::{AdditionalProperties, Discriminator, OneOf, Schema};
use utoipa::openapi::{Components, RefOr};
use uuid::Uuid;

use super::unions::{const_string, pascal, reference};
use crate::model::{
    Decision, ErrorInfo, ItemId, ItemKind, ItemStatus, ObservationType, StepType, SuspensionKind,
    TodoItem, ToolCallRecord, ToolResultStatus, Usage, ValidationStatus,
};

/// `RUN_STARTED`: the run began (again, after a crash or a resume: `attempt` counts).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunStartedContent {
    /// The run's query.
    query: String,
    /// The provider that answers (`openai`, `anthropic`, `offline`, …).
    provider: String,
    /// The model in use; null when the provider has no default and none was asked for.
    #[schema(required = true)]
    model: Option<String>,
    /// The run's lease attempt.
    attempt: i64,
    /// The assistant version the run uses; null when it uses none.
    #[schema(required = true)]
    assistant: Option<crate::model::AssistantRef>,
    /// Only with the offline model: that its answers are not a real model's.
    #[schema(nullable = false)]
    warning: Option<String>,
}

/// `INTENT`: what the planner understood the query to ask.
#[derive(Serialize, ToSchema)]
struct IntentContent {
    intent: String,
}

/// `TITLE`: the thread's title, as the planner wrote it.
#[derive(Serialize, ToSchema)]
struct TitleContent {
    title: String,
}

/// One todo item as `PLAN` and `PLAN_UPDATE` list it: enough to draw the list and its graph, none
/// of the item's work (the whole item is in the thread's state).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct TodoSummary {
    id: ItemId,
    description: String,
    status: ItemStatus,
    dependencies: Vec<ItemId>,
    step_type: StepType,
    required_tools: Vec<String>,
    kind: ItemKind,
    /// The team the item belongs to (null at the top level).
    #[schema(required = true)]
    parent_item_id: Option<ItemId>,
    /// The role the planner gave the item.
    #[schema(required = true)]
    role: Option<String>,
}

/// `PLAN`: the run's plan (run-level), or a team item's plan of its children (under the team).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct PlanContent {
    plan: String,
    todo_list: Vec<TodoSummary>,
    /// Only on a team's plan: the team item.
    #[schema(nullable = false)]
    team_id: Option<ItemId>,
}

/// `PLAN_UPDATE`: the plan changed (refined by a follow-up, or by the `update_plan` tool). The
/// added and changed items as they are now, the removed ones as they were (all pending), and the
/// whole list after the change.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct PlanUpdateContent {
    added: Vec<TodoItem>,
    changed: Vec<TodoItem>,
    removed: Vec<TodoItem>,
    todo_list: Vec<TodoSummary>,
    /// Only when a follow-up refined the plan: its new text.
    #[schema(nullable = false)]
    plan: Option<String>,
}

/// `ITEM_STATUS_CHANGE`: an item moved from one status to another.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ItemStatusChangeContent {
    item_id: ItemId,
    status: ItemStatus,
    previous_status: ItemStatus,
}

/// Why an answer was sent back: the required tools it skipped, and which retry this is.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RequiredToolRetry {
    missing_tools: Vec<String>,
    retry: u32,
}

/// `THOUGHTS`: what the model wrote in one turn of an item; `final` on the item's answer.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ThoughtsContent {
    item_id: ItemId,
    text: String,
    /// The item's model turn (0-based).
    iteration: u32,
    /// Only on the item's answer: `true`.
    #[serde(rename = "final")]
    #[schema(nullable = false)]
    is_final: Option<bool>,
    /// Only on the item's answer: the TAEF outcome.
    #[schema(nullable = false)]
    validation_status: Option<ValidationStatus>,
    /// Only when TAEF strict sent the answer back: why.
    #[schema(nullable = false)]
    validation: Option<RequiredToolRetry>,
}

/// `TOOL_CALL`: the model asked for a tool call (its arguments as the model wrote them).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ToolCallContent {
    tool_call_id: String,
    name: String,
    /// Any JSON: the model's arguments.
    arguments: Value,
}

/// `TOOL_EXECUTION`: how a tool call ended.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ToolExecutionContent {
    tool_call_id: String,
    name: String,
    status: ToolResultStatus,
    /// Any JSON: the tool's output (null when it has none).
    output: Value,
    /// Why it failed; null unless `status` is `error`.
    #[schema(required = true)]
    error: Option<String>,
}

/// `AGENT_SUSPENDED`: an item waits for a person (the suspension, as `GET
/// /v1/suspensions/{suspensionId}` shows it in full).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct AgentSuspendedContent {
    suspension_id: Uuid,
    item_id: ItemId,
    kind: SuspensionKind,
    tool_call: ToolCallRecord,
    allowed_decisions: Vec<Decision>,
    /// The question of an `input` or `remote_input` suspension.
    #[schema(required = true)]
    question: Option<String>,
    /// The JSON Schema an answer must fit, when the question has one.
    #[schema(required = true)]
    input_schema: Option<Value>,
    /// When it resolves as a rejection if nobody decides; null = never.
    #[schema(required = true)]
    expires_at: Option<DateTime<Utc>>,
}

/// `AGENT_RESUMED`: a suspension was decided (or expired).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct AgentResumedContent {
    suspension_id: Uuid,
    decision: Decision,
    /// The reason given with the decision; null when none was given.
    #[schema(required = true)]
    reason: Option<String>,
    /// Nobody decided in time (the decision is `reject`).
    expired: bool,
}

/// `SYNTHESIS`: the answer is being written from the items of the run, which ended so.
#[derive(Serialize, ToSchema)]
struct SynthesisContent {
    completed: u32,
    failed: u32,
    cancelled: u32,
}

/// A source the final answer cites.
#[derive(Serialize, ToSchema)]
struct FinalResponseSource {
    title: String,
    url: String,
}

/// `FINAL_RESPONSE`: the run's answer (also the run's `finalResponse`).
#[derive(Serialize, ToSchema)]
struct FinalResponseContent {
    response: String,
    sources: Vec<FinalResponseSource>,
    /// Follow-up questions the model suggests.
    suggestions: Vec<String>,
}

/// Where an error happened.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum ErrorPhase {
    Plan,
    Execute,
    Synthesize,
}

/// `ERROR`: a run or an item failed (under the item when one did).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ErrorContent {
    #[schema(inline)]
    phase: ErrorPhase,
    code: String,
    message: String,
    /// The item that failed, when one did.
    #[schema(nullable = false)]
    item_id: Option<ItemId>,
}

/// `RUN_COMPLETED`: the run ended with its answer.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunCompletedContent {
    usage: Usage,
    duration_ms: i64,
}

/// `RUN_FAILED`: the run ended without an answer.
#[derive(Serialize, ToSchema)]
struct RunFailedContent {
    error: ErrorInfo,
    usage: Usage,
}

/// Why a run was cancelled.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum CancelReason {
    /// A client cancelled it.
    Cancelled,
    /// A run posted with `multitaskStrategy: interrupt` took its place (`byRunId`).
    Interrupted,
}

/// `RUN_CANCELLED`: the run ended early.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunCancelledContent {
    #[schema(inline)]
    reason: CancelReason,
    /// Only for `interrupted`: the run that took its place.
    #[schema(nullable = false)]
    by_run_id: Option<Uuid>,
    /// The usage so far, when the run had started.
    #[schema(nullable = false)]
    usage: Option<Usage>,
}

/// `RUN_SUSPENDED`: nothing in the run can go on until a person decides.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunSuspendedContent {
    /// The pending suspensions the run waits on.
    suspension_ids: Vec<Uuid>,
    usage: Usage,
}

/// `COMPACTION`: an item's long result was summarized for the items that read it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct CompactionContent {
    item_id: ItemId,
    summary: String,
    input_chars: u64,
    output_chars: u64,
}

/// `FLOWCHART_STEP`: one executed stage of a flowchart call, under the call's `TOOL_CALL` (a
/// sub-flow's stages under their `flow` stage's step). Besides the fields here, a stage kind
/// adds its own (`decision` on `decide` and `select`, `matched` on `loop`, `usage` on `llm`,
/// `lastStep` on `flow`, `errorStage` on a failed call): the object is open.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct FlowchartStepContent {
    flowchart: String,
    version: i64,
    /// The stage's id in its own flowchart.
    stage: String,
    /// Inside a sub-flow: how the call reaches the stage (`<flow stage>/<stage>`).
    #[schema(nullable = false)]
    path: Option<String>,
    /// The stage's kind (`set`, `tool`, `llm`, `decide`, `select`, `loop`, `flow`, `end`).
    kind: String,
    iteration: u32,
    step: u32,
    /// The flowchart call's `TOOL_CALL` id.
    tool_call_id: String,
    /// Inside a sub-flow: the `step` of its `flow` stage.
    #[schema(nullable = false)]
    parent_step: Option<u32>,
    duration_ms: u64,
    /// The values the stage read, by path (a large one as a marker).
    #[schema(value_type = Object)]
    reads: Value,
    /// The state keys the stage wrote, with their values.
    #[schema(value_type = Object)]
    writes: Value,
    /// `tool` stages: the tool called.
    #[schema(nullable = false)]
    tool: Option<String>,
    /// `tool` and `flow` stages: the arguments they computed.
    #[schema(nullable = false, value_type = Option<Object>)]
    args: Option<Value>,
    /// A failed stage: why.
    #[schema(nullable = false)]
    error: Option<String>,
}

/// What a remote agent sent as an artifact.
#[derive(Serialize, ToSchema)]
struct A2aArtifactContent {
    #[schema(required = true)]
    name: Option<String>,
    /// Its parts: text parts as strings, data parts as their JSON.
    parts: Vec<Value>,
}

/// `A2A_TASK_UPDATE`: what a remote agent reported of a task delegated to it, under the
/// delegating `TOOL_CALL`. Each update carries the fields of what happened (the task, a status,
/// an artifact, a message, an answer forwarded, how the call settled): the object is open.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct A2aTaskUpdateContent {
    tool_call_id: String,
    /// The remote agent's name.
    agent: String,
    #[schema(nullable = false)]
    item_id: Option<ItemId>,
    #[schema(nullable = false)]
    task_id: Option<String>,
    #[schema(nullable = false)]
    context_id: Option<String>,
    /// The task's state (`submitted`, `working`, `input-required`, `completed`, `failed`, …).
    state: Option<String>,
    /// The text of the task's status message.
    message: Option<String>,
    #[schema(nullable = false)]
    artifact: Option<A2aArtifactContent>,
    /// How the call settled: `{result}`, `{error}` or `{question}`.
    #[schema(nullable = false, value_type = Option<Object>)]
    settled: Option<Value>,
    /// The suspension whose answer was forwarded to the remote agent.
    #[schema(nullable = false)]
    forwarded: Option<Uuid>,
    /// The person declined to answer the remote agent.
    #[schema(nullable = false)]
    declined: Option<bool>,
    /// The run was cancelled and the remote task with it.
    #[schema(nullable = false)]
    cancel_requested: Option<bool>,
}

/// The content schema of one observation type.
struct Content {
    /// Its component name (`PlanContent`).
    name: String,
    schema: RefOr<Schema>,
    /// The named schemas it refers to (`TodoSummary`, …).
    nested: Vec<(String, RefOr<Schema>)>,
    /// Whether the content may hold fields the schema does not name.
    open: bool,
}

/// The content schema of each observation type. A new type must be added here: the match is
/// exhaustive.
fn content_of(t: ObservationType) -> Content {
    fn named<T: ToSchema>(open: bool) -> Content {
        let mut nested = Vec::new();
        T::schemas(&mut nested);
        Content {
            name: T::name().into_owned(),
            schema: T::schema(),
            nested,
            open,
        }
    }
    use ObservationType as O;
    match t {
        O::RunStarted => named::<RunStartedContent>(false),
        O::Intent => named::<IntentContent>(false),
        O::Title => named::<TitleContent>(false),
        O::Plan => named::<PlanContent>(false),
        O::PlanUpdate => named::<PlanUpdateContent>(false),
        O::ItemStatusChange => named::<ItemStatusChangeContent>(false),
        O::Thoughts => named::<ThoughtsContent>(false),
        O::ToolCall => named::<ToolCallContent>(false),
        O::ToolExecution => named::<ToolExecutionContent>(false),
        O::AgentSuspended => named::<AgentSuspendedContent>(false),
        O::AgentResumed => named::<AgentResumedContent>(false),
        O::Synthesis => named::<SynthesisContent>(false),
        O::FinalResponse => named::<FinalResponseContent>(false),
        O::Error => named::<ErrorContent>(false),
        O::RunCompleted => named::<RunCompletedContent>(false),
        O::RunFailed => named::<RunFailedContent>(false),
        O::RunCancelled => named::<RunCancelledContent>(false),
        O::RunSuspended => named::<RunSuspendedContent>(false),
        O::Compaction => named::<CompactionContent>(false),
        O::FlowchartStep => named::<FlowchartStepContent>(true),
        O::A2aTaskUpdate => named::<A2aTaskUpdateContent>(true),
    }
}

/// The name of the schema of observations of type `t` (`PLAN` → `PlanObservation`).
pub(super) fn observation_schema_name(t: ObservationType) -> String {
    format!("{}Observation", pascal(t.as_str()))
}

/// Make `Observation` the union of one named schema per type (each the derived `Observation`
/// with its `type` a `const` and its `content` that type's content schema), and add the
/// content schemas.
///
/// # Panics
/// When the components have no derived `Observation` object to start from.
pub(super) fn document(components: &mut Components) {
    let Some(RefOr::T(Schema::Object(base))) = components.schemas.get("Observation").cloned()
    else {
        panic!("the document has an `Observation` object schema");
    };
    let mut union = OneOf::new();
    let mut mapping = Vec::new();
    for &t in ObservationType::ALL {
        let Content {
            name: content,
            mut schema,
            nested,
            open,
        } = content_of(t);
        if open && let RefOr::T(Schema::Object(o)) = &mut schema {
            o.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(true)));
        }
        components.schemas.extend(nested);
        components.schemas.insert(content.clone(), schema);

        let name = observation_schema_name(t);
        let mut variant = base.clone();
        variant.description = Some(format!("An observation of type `{t}`."));
        variant
            .properties
            .insert("type".into(), const_string(t.as_str(), None));
        variant
            .properties
            .insert("content".into(), reference(&content));
        components
            .schemas
            .insert(name.clone(), RefOr::T(Schema::Object(variant)));
        union.items.push(reference(&name));
        mapping.push((
            t.as_str().to_owned(),
            format!("#/components/schemas/{name}"),
        ));
    }
    union.description = base
        .description
        .map(|d| format!("{d} Its `content` depends on its `type` (one schema per type)."));
    union.discriminator = Some(Discriminator::with_mapping("type", mapping));
    components
        .schemas
        .insert("Observation".into(), RefOr::T(Schema::OneOf(union)));
}
