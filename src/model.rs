//! Domain types shared by every layer: threads, runs, todo items, messages, observations and
//! suspensions, plus the small enums and validated ids built once at the edge ("parse, don't
//! validate"). Nothing here does I/O. JSON shapes are camelCase, as the public contract requires.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

/// The tenant every request belongs to when no API keys are configured.
pub const DEFAULT_TENANT: &str = "default";

/// A new server-made id: UUIDv7, so ids sort by creation time.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

/// Why a client-supplied id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidId(pub String);

fn check_id(kind: &str, s: &str, max: usize, extra: &[char]) -> Result<(), InvalidId> {
    if s.is_empty() || s.len() > max {
        return Err(InvalidId(format!(
            "{kind} must be 1 to {max} characters long"
        )));
    }
    if !s.chars().all(|c| {
        c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' || extra.contains(&c)
    }) {
        let allowed: String = extra.iter().collect();
        return Err(InvalidId(format!(
            "{kind} may contain only letters, digits and `_.-{allowed}`"
        )));
    }
    Ok(())
}

/// A thread id: client-chosen or a server-made UUIDv7; 1–128 characters of `A-Za-z0-9_.:-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// Validate a client-supplied id.
    ///
    /// # Errors
    /// When the id is empty, too long or has characters outside the allowed set.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        check_id("threadId", s, 128, &[':'])?;
        Ok(Self(s.to_owned()))
    }
    /// A fresh server-made id.
    pub fn generate() -> Self {
        Self(new_id().to_string())
    }
    /// Wrap an id read back from the store (already validated when it was written).
    pub fn from_stored(s: String) -> Self {
        Self(s)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ThreadId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ThreadId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A todo item id as the model wrote it: 1–64 characters of `A-Za-z0-9_.-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(transparent)]
pub struct ItemId(String);

impl ItemId {
    /// # Errors
    /// When the id is empty, longer than 64 characters or has other characters.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        check_id("item id", s, 64, &[])?;
        Ok(Self(s.to_owned()))
    }
    pub fn from_stored(s: String) -> Self {
        Self(s)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ItemId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ItemId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ItemId::parse(&s).map_err(serde::de::Error::custom)
    }
}

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $text:tt),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant),+
        }
        impl $name {
            /// The stable text used on the wire and in the database.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$(Self::$variant),+];
        }
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!(
                        "unknown {} `{}` (expected one of: {})",
                        stringify!($name), other, [$($text),+].join(", ")
                    )),
                }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

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
    }
}

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

string_enum! {
    /// Role of a conversation message.
    MessageRole {
        User => "user",
        Assistant => "assistant",
        Tool => "tool",
        System => "system",
    }
}

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

string_enum! {
    /// What a suspension asks of a person.
    SuspensionKind {
        /// Approve (or edit, reject, answer instead of) a tool call before it runs.
        Approval => "approval",
        /// Answer a question (`ask_user`).
        Input => "input",
        /// Answer a remote agent's question (its task is `input-required`); the answer is
        /// forwarded to it.
        RemoteInput => "remote_input",
    }
}

string_enum! {
    /// Lifecycle of a suspension; `pending` → one of the others, exactly once.
    SuspensionStatus {
        Pending => "pending",
        Resolved => "resolved",
        Expired => "expired",
        Cancelled => "cancelled",
    }
}

string_enum! {
    /// A person's answer to a suspension.
    Decision {
        Approve => "approve",
        Reject => "reject",
        Edit => "edit",
        Respond => "respond",
    }
}

/// A person's decision on a suspension, as it was given: `decision` says which, with
/// `modifiedArgs` (`edit`), `response` (`respond`) and an optional `reason` (any decision; shown in
/// `AGENT_RESUMED`, given to the model on `reject`). An expired suspension holds a `reject` with
/// reason `expired`.
// Built once at the HTTP edge from a validated resume request, stored with the suspension and
// read back with serde: nothing re-parses it by hand. The JSON is the shape stored before this
// type existed (`{"decision", "modifiedArgs"?, "reason"?, "response"?}`, keys in that order), so
// old rows read and write back byte for byte (see the test below).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "decision", rename_all = "lowercase")]
pub enum ResumeDecision {
    /// Run the call as the model proposed it.
    Approve {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Run the call with these arguments instead (valid for the tool's schema).
    Edit {
        #[serde(rename = "modifiedArgs")]
        args: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Do not run the call; the model is told why.
    Reject {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Do not run the call; `response` is its result.
    Respond {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        response: Value,
    },
}

impl ResumeDecision {
    /// Which of the four decisions this is.
    pub fn kind(&self) -> Decision {
        match self {
            Self::Approve { .. } => Decision::Approve,
            Self::Edit { .. } => Decision::Edit,
            Self::Reject { .. } => Decision::Reject,
            Self::Respond { .. } => Decision::Respond,
        }
    }

    /// The reason given with the decision, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Approve { reason }
            | Self::Edit { reason, .. }
            | Self::Reject { reason }
            | Self::Respond { reason, .. } => reason.as_deref(),
        }
    }
}

/// Token usage, summed per item and per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Model calls made (including retries that returned a reply).
    pub llm_calls: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.llm_calls += other.llm_calls;
    }
}

/// Why a run or item failed: a stable code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
}

/// Persona: a name and per-phase prompt fragments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Persona {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub prompts: PersonaPrompts,
}

/// Prompt fragments a persona adds to each phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PersonaPrompts {
    #[serde(default)]
    pub planning: Option<String>,
    #[serde(default)]
    pub execution: Option<String>,
    #[serde(default)]
    pub synthesis: Option<String>,
}

/// Agent configuration on a thread; a run's `config` overrides it field by field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// Provider name (`openai`, `offline`); the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model name sent to the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<Persona>,
    /// Model calls per item (ReAct iterations, 1–50); default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 50)]
    pub max_iterations: Option<u32>,
    /// Items a plan may hold (1–100); the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub max_items: Option<u32>,
    /// Enabled tool names; default: every registered tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Tool names whose every call waits for a person's decision before it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_approval: Option<Vec<String>>,
    /// How long a suspension waits before it is resolved as a rejection, in seconds (at most one
    /// year); none or 0 = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 31_536_000)]
    pub suspension_ttl_seconds: Option<u64>,
    /// TAEF mode for items with `requiredTools`; default `strict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_validation_mode: Option<ToolValidationMode>,
    /// Ready items that execute at once (1–32; 1 = one at a time); the server's default
    /// (`PES_MAX_PARALLEL_ITEMS`, 4) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 32)]
    pub max_parallel_items: Option<u32>,
    /// What an item's prompt holds of the other items: `dependencies` (default: the compacted
    /// output of each of its dependencies) or `all` (of every completed item).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_mode: Option<ContextMode>,
    /// An item result longer than this (in characters) is compacted by the model before other
    /// items read it (100–1,000,000); the server's default (1,500) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 100, maximum = 1_000_000)]
    pub compaction_threshold_chars: Option<u32>,
    /// How deep team items may nest (0–5; a top-level team is depth 1, 0 forbids teams); the
    /// server's default (2) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 5)]
    pub max_team_depth: Option<u32>,
    /// Roles the planner may give items, by role id (1–64 characters of `A-Za-z0-9_.-`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<std::collections::BTreeMap<String, AgentRole>>,
}

string_enum! {
    /// What an item's prompt holds of the other items' results.
    #[derive(Default)]
    ContextMode {
        /// The compacted output of each of the item's dependencies.
        #[default]
        Dependencies => "dependencies",
        /// The compacted output of every completed item.
        All => "all",
    }
}

/// A role the planner may assign to items: its fragment goes before the item's goal, and its
/// `tools` (when given) narrow what the item may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRole {
    pub name: String,
    pub system_prompt_fragment: String,
    /// Tools items of this role may call; absent = every enabled tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

/// The longest suspension expiry a client or the operator may ask for: one year. Bounded so a
/// deadline can always be computed and stored.
pub const MAX_SUSPENSION_TTL_SECONDS: u64 = 31_536_000;

/// A tool list that may only narrow `base`: `over`'s names that `base` allows (every name when
/// `base` allows every tool).
fn narrowed(base: Option<&Vec<String>>, over: Option<&Vec<String>>) -> Option<Vec<String>> {
    match (base, over) {
        (Some(b), Some(o)) => Some(o.iter().filter(|n| b.contains(n)).cloned().collect()),
        (b, o) => o.or(b).cloned(),
    }
}

/// A list that may only grow: `base`'s names, then `over`'s new ones.
fn union(base: Option<&Vec<String>>, over: Option<&Vec<String>>) -> Option<Vec<String>> {
    match (base, over) {
        (Some(b), Some(o)) => {
            let mut all = b.clone();
            all.extend(o.iter().filter(|n| !b.contains(n)).cloned());
            Some(all)
        }
        (b, o) => o.or(b).cloned(),
    }
}

impl AgentConfig {
    /// `self` with every field `over` sets replacing ours, except the two policy floors:
    /// `requireApproval` is the union of both (an override adds approvals, never drops one) and
    /// `tools` the override's names that ours allow (an override narrows, never widens).
    pub fn overlay(&self, over: &AgentConfig) -> AgentConfig {
        AgentConfig {
            provider: over.provider.clone().or_else(|| self.provider.clone()),
            model: over.model.clone().or_else(|| self.model.clone()),
            system_prompt: over
                .system_prompt
                .clone()
                .or_else(|| self.system_prompt.clone()),
            persona: over.persona.clone().or_else(|| self.persona.clone()),
            max_iterations: over.max_iterations.or(self.max_iterations),
            max_items: over.max_items.or(self.max_items),
            tools: narrowed(self.tools.as_ref(), over.tools.as_ref()),
            require_approval: union(
                self.require_approval.as_ref(),
                over.require_approval.as_ref(),
            ),
            suspension_ttl_seconds: over.suspension_ttl_seconds.or(self.suspension_ttl_seconds),
            tool_validation_mode: over.tool_validation_mode.or(self.tool_validation_mode),
            max_parallel_items: over.max_parallel_items.or(self.max_parallel_items),
            context_mode: over.context_mode.or(self.context_mode),
            compaction_threshold_chars: over
                .compaction_threshold_chars
                .or(self.compaction_threshold_chars),
            max_team_depth: over.max_team_depth.or(self.max_team_depth),
            roles: over.roles.clone().or_else(|| self.roles.clone()),
        }
    }

    /// Check ranges a type cannot express.
    ///
    /// # Errors
    /// A message naming the field that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(n) = self.max_iterations
            && !(1..=50).contains(&n)
        {
            return Err("config.maxIterations must be between 1 and 50".into());
        }
        if let Some(n) = self.max_items
            && !(1..=100).contains(&n)
        {
            return Err("config.maxItems must be between 1 and 100".into());
        }
        if let Some(n) = self.suspension_ttl_seconds
            && n > MAX_SUSPENSION_TTL_SECONDS
        {
            return Err(format!(
                "config.suspensionTtlSeconds must be between 0 and {MAX_SUSPENSION_TTL_SECONDS} (one year)"
            ));
        }
        if let Some(n) = self.max_parallel_items
            && !(1..=32).contains(&n)
        {
            return Err("config.maxParallelItems must be between 1 and 32".into());
        }
        if let Some(n) = self.compaction_threshold_chars
            && !(100..=1_000_000).contains(&n)
        {
            return Err("config.compactionThresholdChars must be between 100 and 1000000".into());
        }
        if let Some(n) = self.max_team_depth
            && n > 5
        {
            return Err("config.maxTeamDepth must be between 0 and 5".into());
        }
        for (id, role) in self.roles.iter().flatten() {
            if ItemId::parse(id).is_err() {
                return Err(format!(
                    "config.roles: role id `{id}` must be 1-64 characters of A-Za-z0-9_.-"
                ));
            }
            if role.name.trim().is_empty() {
                return Err(format!("config.roles.{id}.name must not be empty"));
            }
        }
        Ok(())
    }
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
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
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

/// A run of a query on a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub run_id: Uuid,
    pub thread_id: ThreadId,
    #[serde(skip)]
    pub tenant: String,
    pub status: RunStatus,
    pub query: String,
    /// Per-run overrides of the thread's config.
    pub config: AgentConfig,
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

/// A pause for a person: a tool call waiting for approval, or a question waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Suspension {
    pub suspension_id: Uuid,
    pub thread_id: ThreadId,
    #[serde(skip)]
    pub tenant: String,
    pub run_id: Uuid,
    pub item_id: ItemId,
    pub kind: SuspensionKind,
    pub tool_call: ToolCallRecord,
    pub allowed_decisions: Vec<Decision>,
    #[serde(default)]
    pub question: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// The item's conversation up to the call.
    pub iteration_state: Value,
    /// Results of other calls of the same model turn that already ran.
    pub partial_tool_results: Vec<ToolResultRecord>,
    pub status: SuspensionStatus,
    /// How it was resolved, beside the other fields: `decision` (`approve`, `edit`, `reject`,
    /// `respond`) with its `reason`, `modifiedArgs` and `response`. Absent while pending.
    #[serde(flatten, with = "resolution")]
    #[schema(schema_with = resolution::schema)]
    pub decision: Option<ResumeDecision>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub resolved_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// A suspension's decision on the wire: its fields beside the suspension's own (`decision`,
/// `reason`, `modifiedArgs`, `response`), none while it is pending.
mod resolution {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaType, Type};
    use utoipa::openapi::{RefOr, Schema};

    use super::ResumeDecision;

    pub fn serialize<S: Serializer>(d: &Option<ResumeDecision>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => d.serialize(s),
            None => serde_json::Map::new().serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<ResumeDecision>, D::Error> {
        let fields = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        if !fields.contains_key("decision") {
            return Ok(None);
        }
        let mut map = serde_json::Map::new();
        for k in ["decision", "reason", "modifiedArgs", "response"] {
            if let Some(v) = fields.get(k) {
                map.insert(k.to_owned(), v.clone());
            }
        }
        serde_json::from_value(serde_json::Value::Object(map))
            .map(Some)
            .map_err(serde::de::Error::custom)
    }

    pub fn schema() -> Object {
        let prop = |t: Option<Type>, desc: &str| -> RefOr<Schema> {
            let b = ObjectBuilder::new().description(Some(desc));
            let b = match t {
                Some(t) => b.schema_type(t),
                None => b.schema_type(SchemaType::AnyValue),
            };
            b.build().into()
        };
        ObjectBuilder::new()
            .property(
                "decision",
                RefOr::Ref(utoipa::openapi::Ref::from_schema_name("Decision")),
            )
            .property(
                "reason",
                prop(
                    Some(Type::String),
                    "Why the person decided so (any decision).",
                ),
            )
            .property(
                "modifiedArgs",
                prop(None, "The arguments the call ran with instead (`edit`)."),
            )
            .property(
                "response",
                prop(None, "What became the call's result (`respond`)."),
            )
            .description(Some(
                "How a resolved suspension was decided; absent while it is pending.",
            ))
            .build()
    }
}

/// Replace every NUL character in the strings (and keys) of `value` with U+FFFD. Text that comes
/// from outside the API (a model's reply, a tool's output) is stored as it is, and Postgres
/// cannot hold a NUL in `text` or `jsonb`: a model that wrote one would fail every commit of its
/// run. The API itself refuses NUL in what clients send (a 422), so this only ever rewrites
/// what a model or a tool produced.
pub fn scrub_nul(value: &mut Value) {
    match value {
        Value::String(s) => scrub_nul_str(s),
        Value::Array(items) => items.iter_mut().for_each(scrub_nul),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let entries = std::mem::take(map);
                for (mut k, v) in entries {
                    scrub_nul_str(&mut k);
                    map.insert(k, v);
                }
            }
            map.values_mut().for_each(scrub_nul);
        }
        _ => {}
    }
}

/// [`scrub_nul`] for one string.
pub fn scrub_nul_str(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\u{FFFD}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decisions stored before the type existed (built as a JSON object, keys sorted) read back
    /// as the decision they meant and write back byte for byte, in the text SQLite holds and as
    /// the JSON value Postgres holds.
    #[test]
    fn resume_decision_keeps_its_stored_json() {
        let cases = [
            (
                r#"{"decision":"approve"}"#,
                ResumeDecision::Approve { reason: None },
            ),
            (
                r#"{"decision":"approve","reason":"looks fine"}"#,
                ResumeDecision::Approve {
                    reason: Some("looks fine".into()),
                },
            ),
            (
                r#"{"decision":"edit","modifiedArgs":{"expression":"3+3"}}"#,
                ResumeDecision::Edit {
                    args: serde_json::json!({"expression": "3+3"}),
                    reason: None,
                },
            ),
            (
                r#"{"decision":"edit","modifiedArgs":{"a":[1,null]},"reason":"fixed it"}"#,
                ResumeDecision::Edit {
                    args: serde_json::json!({"a": [1, null]}),
                    reason: Some("fixed it".into()),
                },
            ),
            (
                r#"{"decision":"reject"}"#,
                ResumeDecision::Reject { reason: None },
            ),
            (
                r#"{"decision":"reject","reason":"expired"}"#,
                ResumeDecision::Reject {
                    reason: Some("expired".into()),
                },
            ),
            (
                r#"{"decision":"respond","response":{"answer":42}}"#,
                ResumeDecision::Respond {
                    reason: None,
                    response: serde_json::json!({"answer": 42}),
                },
            ),
            (
                r#"{"decision":"respond","reason":"asked","response":"yes"}"#,
                ResumeDecision::Respond {
                    reason: Some("asked".into()),
                    response: serde_json::json!("yes"),
                },
            ),
        ];
        for (old, meant) in cases {
            let read: ResumeDecision = serde_json::from_str(old).unwrap();
            assert_eq!(read, meant, "{old}");
            assert_eq!(serde_json::to_string(&read).unwrap(), old);
            let as_value: Value = serde_json::from_str(old).unwrap();
            assert_eq!(serde_json::to_value(&read).unwrap(), as_value);
            assert_eq!(serde_json::to_value(&read).unwrap().to_string(), old);
            assert_eq!(read.kind().as_str(), as_value["decision"]);
            assert_eq!(read.reason(), as_value["reason"].as_str());
        }
        for bad in [
            r#"{"decision":"maybe"}"#,
            r#"{"decision":"edit"}"#,
            r#"{"decision":"respond"}"#,
            r#"{"reason":"x"}"#,
        ] {
            assert!(
                serde_json::from_str::<ResumeDecision>(bad).is_err(),
                "{bad}"
            );
        }
    }

    /// Tool results journaled before the status was typed (a plain string) read back unchanged,
    /// and write back byte for byte.
    #[test]
    fn tool_result_status_keeps_its_stored_text() {
        for text in ["success", "error", "rejected", "responded"] {
            let stored = format!(
                r#"{{"toolCallId":"c1","name":"calculator","status":"{text}","output":null}}"#
            );
            let r: ToolResultRecord = serde_json::from_str(&stored).unwrap();
            assert_eq!(r.status.as_str(), text);
            assert_eq!(serde_json::to_string(&r).unwrap(), stored);
        }
        assert!(
            serde_json::from_str::<ToolResultRecord>(
                r#"{"toolCallId":"c1","name":"x","status":"maybe","output":null}"#
            )
            .is_err()
        );
        for p in RunPhase::ALL {
            assert_eq!(p.as_str().parse::<RunPhase>().unwrap(), *p);
        }
        assert_eq!(RunPhase::default(), RunPhase::New);
    }

    #[test]
    fn ids_reject_bad_characters_and_lengths() {
        assert!(ThreadId::parse("t-1.a:b_c").is_ok());
        assert!(ThreadId::parse("").is_err());
        assert!(ThreadId::parse("a b").is_err());
        assert!(ThreadId::parse(&"x".repeat(129)).is_err());
        assert!(ItemId::parse("step-1").is_ok());
        assert!(ItemId::parse("step:1").is_err());
        assert!(ItemId::parse(&"x".repeat(65)).is_err());
    }

    #[test]
    fn enums_round_trip_through_their_text() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>().unwrap(), *s);
        }
        for t in ObservationType::ALL {
            let json = serde_json::to_string(t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.as_str()));
        }
        assert!("nope".parse::<Decision>().is_err());
    }

    #[test]
    fn run_config_overrides_thread_config_field_by_field() {
        let thread = AgentConfig {
            model: Some("a".into()),
            max_iterations: Some(3),
            ..Default::default()
        };
        let run = AgentConfig {
            model: Some("b".into()),
            ..Default::default()
        };
        let merged = thread.overlay(&run);
        assert_eq!(merged.model.as_deref(), Some("b"));
        assert_eq!(merged.max_iterations, Some(3));
    }

    #[test]
    fn a_run_adds_approvals_and_narrows_tools_but_never_loosens_the_thread() {
        let names = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let thread = AgentConfig {
            tools: names(&["calculator", "current_time"]),
            require_approval: names(&["calculator"]),
            ..Default::default()
        };
        let run = AgentConfig {
            tools: names(&["current_time", "ask_user"]),
            require_approval: names(&["current_time"]),
            ..Default::default()
        };
        let merged = thread.overlay(&run);
        assert_eq!(merged.tools, names(&["current_time"]));
        assert_eq!(
            merged.require_approval,
            names(&["calculator", "current_time"])
        );
        let dropped = thread.overlay(&AgentConfig {
            require_approval: Some(vec![]),
            ..Default::default()
        });
        assert_eq!(dropped.require_approval, names(&["calculator"]));
        let open = AgentConfig::default().overlay(&run);
        assert_eq!(open.tools, names(&["current_time", "ask_user"]));
    }
}
