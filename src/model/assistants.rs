//! Assistants: named, versioned agent configurations a thread or a run may use.
//! This file owns their types and the pure rules of using one: which config fields exist (so
//! `locked` can name only real ones), which fields a config sets, and how an assistant
//! version's config combines with a thread's and a run's, `locked` fields and policy floors kept.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::ids::check_id;
use super::*;

/// An assistant id: client-chosen or a server-made UUIDv7; 1–128 characters of
/// `A-Za-z0-9_.:-` (the same alphabet as thread ids).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(transparent)]
pub struct AssistantId(String);

impl AssistantId {
    /// Validate a client-supplied id.
    ///
    /// # Errors
    /// When the id is empty, too long or has characters outside the allowed set.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        check_id("assistantId", s, 128, &[':'])?;
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

impl std::fmt::Display for AssistantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AssistantId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AssistantId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Which assistant version a run ran with: recorded on the run when it is enqueued (the pinned
/// version, or the assistant's current one at that moment) and shown in its `RUN_STARTED`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssistantRef {
    #[schema(value_type = String)]
    pub assistant_id: AssistantId,
    /// The version whose config the run used.
    #[schema(minimum = 1)]
    pub version: i64,
}

/// The assistant a thread uses: `version` pins one, `None` follows the assistant's current
/// version (read each time a run is enqueued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssistantPin {
    pub assistant_id: AssistantId,
    pub version: Option<i64>,
}

/// One stored version of an assistant: immutable once made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssistantVersion {
    #[schema(value_type = String)]
    pub assistant_id: AssistantId,
    #[schema(minimum = 1)]
    pub version: i64,
    pub name: String,
    pub description: Option<String>,
    /// The thread config this version gives threads and runs that use it.
    pub config: AgentConfig,
    /// Config fields (camelCase names) that threads and runs using this version may not set.
    pub locked: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// An assistant as the API shows it: one of its versions (the current one unless another was
/// asked for) with the assistant's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assistant {
    #[schema(value_type = String)]
    pub assistant_id: AssistantId,
    /// The version shown (its name, description, config and locked fields).
    #[schema(minimum = 1)]
    pub version: i64,
    /// The version that runs: what a thread that pins no version gets when a run is enqueued.
    #[schema(minimum = 1)]
    pub current_version: i64,
    pub name: String,
    pub description: Option<String>,
    pub config: AgentConfig,
    /// Config fields (camelCase names) that threads and runs using this version may not set.
    pub locked: Vec<String>,
    /// When the assistant was created.
    pub created_at: DateTime<Utc>,
    /// When a version was last added or made current.
    pub updated_at: DateTime<Utc>,
}

impl Assistant {
    /// The assistant showing `v` (one of its versions).
    pub fn showing(
        v: AssistantVersion,
        current_version: i64,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
    ) -> Self {
        Assistant {
            assistant_id: v.assistant_id,
            version: v.version,
            current_version,
            name: v.name,
            description: v.description,
            config: v.config,
            locked: v.locked,
            created_at,
            updated_at,
        }
    }
}

/// The names of every field a config has (camelCase, as the API spells them), read from the
/// config's own schema so a field added later can be locked without touching this file.
pub fn config_field_names() -> &'static BTreeSet<String> {
    static NAMES: OnceLock<BTreeSet<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        use utoipa::openapi::{RefOr, schema::Schema};
        match <AgentConfig as utoipa::PartialSchema>::schema() {
            RefOr::T(Schema::Object(o)) => o.properties.keys().cloned().collect(),
            _ => BTreeSet::new(),
        }
    })
}

/// The config as a JSON object (every field it sets, and only those).
fn fields_of(cfg: &AgentConfig) -> serde_json::Map<String, Value> {
    match serde_json::to_value(cfg) {
        Ok(Value::Object(m)) => m.into_iter().filter(|(_, v)| !v.is_null()).collect(),
        _ => serde_json::Map::new(),
    }
}

/// A config from a JSON object made by [`fields_of`] (so it always parses back; `fallback` keeps
/// a caller safe should it ever not).
fn config_from(fields: serde_json::Map<String, Value>, fallback: &AgentConfig) -> AgentConfig {
    serde_json::from_value(Value::Object(fields)).unwrap_or_else(|_| fallback.clone())
}

impl AssistantVersion {
    /// The fields of `cfg` this version locks, in the order `locked` names them.
    pub fn locked_fields_set(&self, cfg: &AgentConfig) -> Vec<String> {
        let set = fields_of(cfg);
        self.locked
            .iter()
            .filter(|f| set.contains_key(f.as_str()))
            .cloned()
            .collect()
    }

    /// The config a thread using this version runs with, before a run's overrides: this
    /// version's config overlaid by the thread's (so the version's `requireApproval` stays a
    /// floor and the thread's `tools` only narrow it), then every locked field set back to this
    /// version's value. A thread that set a field before a later version locked it gets the
    /// lock's value.
    pub fn base_for(&self, thread: &AgentConfig) -> AgentConfig {
        let merged = self.config.overlay(thread);
        let mut fields = fields_of(&merged);
        let own = fields_of(&self.config);
        for f in &self.locked {
            match own.get(f) {
                Some(v) => fields.insert(f.clone(), v.clone()),
                None => fields.remove(f),
            };
        }
        config_from(fields, &merged)
    }

    /// A run's overrides without the fields this version locks (the enqueue refuses a run that
    /// sets one; this keeps the rule whatever the stored run says).
    pub fn run_overrides(&self, run: &AgentConfig) -> AgentConfig {
        let mut fields = fields_of(run);
        for f in &self.locked {
            fields.remove(f);
        }
        config_from(fields, run)
    }
}

/// `locked` as a client sent it, checked: every name a config field, duplicates dropped (first
/// kept). The names that are not config fields are the error.
///
/// # Errors
/// The positions and names of the entries that name no config field.
pub fn check_locked(locked: &[String]) -> Result<Vec<String>, Vec<(usize, String)>> {
    let known = config_field_names();
    let bad: Vec<(usize, String)> = locked
        .iter()
        .enumerate()
        .filter(|(_, n)| !known.contains(n.as_str()))
        .map(|(i, n)| (i, n.clone()))
        .collect();
    if !bad.is_empty() {
        return Err(bad);
    }
    let mut seen = BTreeSet::new();
    Ok(locked
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(config: AgentConfig, locked: &[&str]) -> AssistantVersion {
        AssistantVersion {
            assistant_id: AssistantId::parse("a").unwrap(),
            version: 1,
            name: "a".into(),
            description: None,
            config,
            locked: locked.iter().map(|s| s.to_string()).collect(),
            created_at: Utc::now(),
        }
    }

    #[test]
    fn every_config_field_can_be_named_and_nothing_else() {
        let names = config_field_names();
        for f in ["systemPrompt", "requireApproval", "tools", "model", "roles"] {
            assert!(names.contains(f), "{f} in {names:?}");
        }
        assert_eq!(
            check_locked(&["model".into(), "nope".into(), "model".into()]),
            Err(vec![(1, "nope".into())])
        );
        assert_eq!(
            check_locked(&["model".into(), "tools".into(), "model".into()]),
            Ok(vec!["model".into(), "tools".into()])
        );
    }

    #[test]
    fn a_locked_field_keeps_the_assistants_value_and_floors_hold() {
        let names = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let v = version(
            AgentConfig {
                system_prompt: Some("assistant".into()),
                require_approval: names(&["calculator"]),
                tools: names(&["calculator", "current_time"]),
                max_iterations: Some(3),
                ..Default::default()
            },
            &["systemPrompt", "model"],
        );
        let thread = AgentConfig {
            system_prompt: Some("thread".into()),
            model: Some("m".into()),
            max_iterations: Some(7),
            require_approval: Some(vec![]),
            tools: names(&["current_time", "ask_user"]),
            ..Default::default()
        };
        assert_eq!(v.locked_fields_set(&thread), vec!["systemPrompt", "model"]);
        let base = v.base_for(&thread);
        assert_eq!(base.system_prompt.as_deref(), Some("assistant"));
        assert_eq!(base.model, None, "locked and unset by the assistant");
        assert_eq!(base.max_iterations, Some(7), "not locked: the thread wins");
        assert_eq!(base.require_approval, names(&["calculator"]));
        assert_eq!(base.tools, names(&["current_time"]));
        let run = v.run_overrides(&AgentConfig {
            system_prompt: Some("run".into()),
            max_items: Some(2),
            ..Default::default()
        });
        assert_eq!(run.system_prompt, None);
        assert_eq!(run.max_items, Some(2));
    }
}
