//! The agent configuration of a thread (and a run's overrides): how its fields combine, and
//! the tool policy floors a run cannot loosen.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::*;

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
    /// Delete the thread once it has had no run activity for this many seconds: no run queued,
    /// running or suspended, and its `updatedAt` (creation, last observation, last change)
    /// older than this. A thread setting (or its assistant's); a run may not set it. 0 keeps
    /// the thread forever, whatever the assistant or `PES_THREAD_TTL_SECONDS` say; absent, the
    /// assistant's, else the server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 315_360_000)]
    pub ttl_seconds: Option<u64>,
    /// Where to announce the end of runs (and their suspensions) with a signed webhook: a
    /// run's own wins over its thread's, which wins over its assistant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
    /// The memory store namespace the agent's `memory_search` and `memory_put` use (labels:
    /// 1–128 characters, no `.`, no control character); default `["threads", <threadId>]`, so
    /// each thread remembers on its own. An assistant typically sets `["users", "<id>"]`, so a
    /// user's threads share what the agent learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1)]
    pub memory_namespace: Option<Vec<String>>,
    /// What the run may spend on its model (`maxTokens`, `maxCostUsd`) and what happens at the
    /// limit (`onExceed`): checked before every model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
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

/// The longest thread time-to-live a client or the operator may ask for: ten years. Bounded so
/// the expiry can always be computed by either store.
pub const MAX_THREAD_TTL_SECONDS: u64 = 315_360_000;

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
            ttl_seconds: over.ttl_seconds.or(self.ttl_seconds),
            webhook: over.webhook.clone().or_else(|| self.webhook.clone()),
            memory_namespace: over
                .memory_namespace
                .clone()
                .or_else(|| self.memory_namespace.clone()),
            budget: over.budget.clone().or_else(|| self.budget.clone()),
        }
    }

    /// Check ranges a type cannot express, as text.
    ///
    /// # Errors
    /// As [`AgentConfig::check`].
    // The text is what `commands/policy.rs` answers (`ApiError::Validation` takes a String); it
    // can take `check`'s error instead.
    pub fn validate(&self) -> Result<(), String> {
        self.check().map_err(|e| e.to_string())
    }

    /// Check ranges a type cannot express.
    ///
    /// # Errors
    /// The field that is out of range (its API text names it), with the cause when a part of
    /// the config (its memory namespace, budget or webhook) is what is wrong.
    pub fn check(&self) -> Result<(), AgentConfigError> {
        if let Some(n) = self.max_iterations
            && !(1..=50).contains(&n)
        {
            return Err(AgentConfigError::Range(
                "config.maxIterations must be between 1 and 50".into(),
            ));
        }
        if let Some(n) = self.max_items
            && !(1..=100).contains(&n)
        {
            return Err(AgentConfigError::Range(
                "config.maxItems must be between 1 and 100".into(),
            ));
        }
        if let Some(n) = self.suspension_ttl_seconds
            && n > MAX_SUSPENSION_TTL_SECONDS
        {
            return Err(AgentConfigError::Range(format!(
                "config.suspensionTtlSeconds must be between 0 and {MAX_SUSPENSION_TTL_SECONDS} (one year)"
            )));
        }
        if let Some(n) = self.max_parallel_items
            && !(1..=32).contains(&n)
        {
            return Err(AgentConfigError::Range(
                "config.maxParallelItems must be between 1 and 32".into(),
            ));
        }
        if let Some(n) = self.compaction_threshold_chars
            && !(100..=1_000_000).contains(&n)
        {
            return Err(AgentConfigError::Range(
                "config.compactionThresholdChars must be between 100 and 1000000".into(),
            ));
        }
        if let Some(n) = self.max_team_depth
            && n > 5
        {
            return Err(AgentConfigError::Range(
                "config.maxTeamDepth must be between 0 and 5".into(),
            ));
        }
        if let Some(n) = self.ttl_seconds
            && n > MAX_THREAD_TTL_SECONDS
        {
            return Err(AgentConfigError::Range(format!(
                "config.ttlSeconds must be between 0 and {MAX_THREAD_TTL_SECONDS} (ten years)"
            )));
        }
        if let Some(ns) = &self.memory_namespace {
            super::memory::Namespace::parse(ns.clone(), usize::MAX, false)
                .map_err(AgentConfigError::MemoryNamespace)?;
        }
        if let Some(b) = &self.budget {
            b.validate("config.budget")?;
        }
        for (id, role) in self.roles.iter().flatten() {
            if ItemId::parse(id).is_err() {
                return Err(AgentConfigError::Range(format!(
                    "config.roles: role id `{id}` must be 1-64 characters of A-Za-z0-9_.-"
                )));
            }
            if role.name.trim().is_empty() {
                return Err(AgentConfigError::Range(format!(
                    "config.roles.{id}.name must not be empty"
                )));
            }
        }
        if let Some(w) = &self.webhook {
            w.try_check("config.webhook")?;
        }
        Ok(())
    }
}

/// Why a thread's config cannot be used. The text is the API's 422 detail, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentConfigError {
    /// A number or name out of its range (the message names the field and the range).
    #[error("{0}")]
    Range(String),
    #[error("config.memoryNamespace {0}")]
    MemoryNamespace(#[source] super::memory::NamespaceError),
    #[error(transparent)]
    Budget(#[from] super::budgets::BudgetError),
    #[error(transparent)]
    Webhook(#[from] super::webhooks::WebhookSpecError),
}
