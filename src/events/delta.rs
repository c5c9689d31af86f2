//! The token delta both the local channels (`tokens`) and the relay between replicas
//! (`token_relay`) carry, apart from both so neither depends on the other for it.

use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::llm::Phase;
use crate::model::ThreadId;

/// A thread's channel key: (tenant, thread).
pub(crate) type Key = (String, ThreadId);

/// One `event: token` frame: a piece of a model reply as it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenDelta {
    /// The run whose model is writing.
    pub run_id: Uuid,
    /// The todo item the reply is for; null for the run's plan and synthesis.
    pub item_id: Option<String>,
    /// `plan`, `execute`, `synthesize`, `compact` or `flowchart`. In structured phases (plan,
    /// synthesis, compaction, a flowchart stage with a schema) the text is the JSON being
    /// written.
    #[schema(value_type = String)]
    pub phase: Phase,
    /// The next piece of text.
    pub delta: String,
    /// The thread's last `seq` committed by the run (or known to it) when this was written: a
    /// stream sends the delta after the observations up to it.
    #[serde(skip)]
    pub after_seq: i64,
}
