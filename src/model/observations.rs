//! Observations: what the log and the event stream report, one type per kind of step.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

string_enum! {
    /// Every observation type the service emits.
    ObservationType {
        RunStarted => "RUN_STARTED",
        Intent => "INTENT",
        Title => "TITLE",
        Plan => "PLAN",
        PlanUpdate => "PLAN_UPDATE",
        ItemStatusChange => "ITEM_STATUS_CHANGE",
        Thoughts => "THOUGHTS",
        ToolCall => "TOOL_CALL",
        ToolExecution => "TOOL_EXECUTION",
        AgentSuspended => "AGENT_SUSPENDED",
        AgentResumed => "AGENT_RESUMED",
        Synthesis => "SYNTHESIS",
        FinalResponse => "FINAL_RESPONSE",
        Error => "ERROR",
        RunCompleted => "RUN_COMPLETED",
        RunFailed => "RUN_FAILED",
        RunCancelled => "RUN_CANCELLED",
        /// Nothing in the run can proceed until a person decides: run-level, content
        /// `{suspensionIds, usage}` (the pending suspensions it waits on).
        RunSuspended => "RUN_SUSPENDED",
        /// An item's long result compacted for the items that read it: `{itemId, summary,
        /// inputChars, outputChars}`.
        Compaction => "COMPACTION",
        /// One executed stage of a flowchart call, under the call's `TOOL_CALL` (a sub-flow's
        /// stages under their `flow` stage's step): `{flowchart, version, stage, kind, iteration,
        /// step, toolCallId, reads, writes, decision?, durationMs, error?}`.
        FlowchartStep => "FLOWCHART_STEP",
        /// What a remote agent reported of a task delegated to it, under the delegating
        /// `TOOL_CALL`: `{toolCallId, agent, taskId, contextId?, state?, message?, artifact?}`.
        A2aTaskUpdate => "A2A_TASK_UPDATE",
        /// The run's spend reached 80 % of its budget, or its limit: run-level, `{state,
        /// spentTokens, spentUsd, limitTokens?, limitUsd?}`.
        Budget => "BUDGET",
        /// A person's message to a run in flight: run-level, `{message, messageId}`.
        Steering => "STEERING",
    }
}

impl ObservationType {
    /// Observations that end a run's stream: the run finished, failed, was cancelled or waits for
    /// people (`RUN_SUSPENDED`; an item's `AGENT_SUSPENDED` does not stop the others).
    pub fn ends_run_stream(self) -> bool {
        matches!(
            self,
            Self::RunCompleted | Self::RunFailed | Self::RunCancelled | Self::RunSuspended
        )
    }
}

/// One entry of the append-only observation log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    pub id: Uuid,
    /// Gap-free, per-thread, strictly increasing; the SSE `id:`.
    pub seq: i64,
    pub thread_id: ThreadId,
    #[serde(skip)]
    pub tenant: String,
    pub run_id: Option<Uuid>,
    /// Null for run-level observations, the item id for item-level ones, another observation's id
    /// for nested ones.
    pub parent_id: Option<String>,
    #[serde(rename = "type")]
    pub kind: ObservationType,
    pub title: String,
    pub content: Value,
    pub created_at: DateTime<Utc>,
}

/// An observation before it is committed (the store assigns `seq`).
#[derive(Debug, Clone, PartialEq)]
pub struct NewObservation {
    pub id: Uuid,
    pub run_id: Option<Uuid>,
    pub parent_id: Option<String>,
    pub kind: ObservationType,
    pub title: String,
    pub content: Value,
}

impl NewObservation {
    /// A run-level or item-level observation with a fresh id.
    pub fn new(
        run_id: Uuid,
        parent_id: Option<String>,
        kind: ObservationType,
        title: impl Into<String>,
        content: Value,
    ) -> Self {
        Self {
            id: new_id(),
            run_id: Some(run_id),
            parent_id,
            kind,
            title: title.into(),
            content,
        }
    }
}
