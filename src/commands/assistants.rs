//! Assistants: named, versioned configurations, and what using one means for
//! threads and runs. An assistant's `config` is checked exactly as a thread's is
//! ([`UseCases::check_config`]), plus its size and its `locked` names; a thread or run that uses
//! an assistant may not set a field the version locks (422 `field_locked` naming each), nor
//! loosen its tool policy (422 `policy_floor`). Unpinned, a run uses the version that is current
//! when it is enqueued.
//!
//! A reference to an assistant in a request body (a thread's or a run's `assistantId`, `POST
//! …/current {version}`) that names nothing answers 422; the assistant routes themselves answer
//! 404 for an id or version in their path or query.

use super::UseCases;
use super::policy::{check_floor, check_policy_floor};
use crate::model::{
    AgentConfig, Assistant, AssistantId, AssistantPin, AssistantRef, AssistantVersion, ThreadId,
    check_locked,
};
use crate::problem::{FieldError, Refusal};
use crate::store::{AssistantDraft, PageCursor, StoreError};

/// An assistant (or a new version of one) as a door asks for it, once parsed.
#[derive(Debug, Clone, Default)]
pub struct AssistantInput {
    /// On create: the id to use (a UUIDv7 when absent). Ignored on update.
    pub assistant_id: Option<AssistantId>,
    /// Required on create; on update `None` keeps the current version's.
    pub name: Option<String>,
    /// On update `None` keeps the current version's.
    pub description: Option<String>,
    pub config: AgentConfig,
    /// Config field names threads and runs may not set; on update `None` keeps the current
    /// version's.
    pub locked: Option<Vec<String>>,
}

/// How long a name and a description may be, in characters.
const MAX_NAME_CHARS: usize = 200;
const MAX_DESCRIPTION_CHARS: usize = 4000;

/// A `/path: message` problem.
fn field(path: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        message: message.into(),
    }
}

/// The problem that lists `errors`, when there are any.
fn invalid(errors: Vec<FieldError>) -> Result<(), Refusal> {
    if errors.is_empty() {
        return Ok(());
    }
    let detail = format!(
        "the assistant is not valid: {}",
        errors
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Err(Refusal::InvalidFields { detail, errors })
}

/// A reference from a request body to an assistant (or version) that is not there: 422, with
/// what to do about it.
pub(super) fn unusable(e: StoreError, whose: &str) -> Refusal {
    match e {
        StoreError::AssistantNotFound(id) => Refusal::Unprocessable {
            code: "assistant_not_found",
            detail: format!(
                "{whose} assistant `{id}` does not exist (never created, or deleted): \
                 `GET /v1/assistants` lists the tenant's assistants"
            ),
        },
        StoreError::AssistantVersionNotFound {
            assistant_id,
            version,
        } => Refusal::Unprocessable {
            code: "assistant_version_not_found",
            detail: format!(
                "{whose} assistant `{assistant_id}` has no version {version} (never made, or \
                 pruned past PES_ASSISTANT_MAX_VERSIONS): `GET \
                 /v1/assistants/{assistant_id}/versions` lists those kept"
            ),
        },
        other => other.into(),
    }
}

/// 422 `field_locked` when `cfg` sets fields `v` locks, naming each.
fn check_unlocked(v: &AssistantVersion, cfg: &AgentConfig, whose: &str) -> Result<(), Refusal> {
    let set = v.locked_fields_set(cfg);
    if set.is_empty() {
        return Ok(());
    }
    let fields = set
        .iter()
        .map(|f| format!("config.{f}"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Refusal::Unprocessable {
        code: "field_locked",
        detail: format!(
            "{fields} {} locked by assistant `{}` (version {}): a {whose} using it may not set \
             {}",
            if set.len() == 1 { "is" } else { "are" },
            v.assistant_id,
            v.version,
            if set.len() == 1 { "it" } else { "them" }
        ),
    })
}

impl UseCases {
    /// Check what a create or an update asks for, every problem at once: the name, the
    /// description, the `locked` names, the config's size and the config itself.
    async fn check_assistant(
        &self,
        tenant: &str,
        input: &AssistantInput,
        creating: bool,
    ) -> Result<Option<Vec<String>>, Refusal> {
        let mut errors = Vec::new();
        match &input.name {
            Some(n) if n.trim().is_empty() => errors.push(field("/name", "must not be empty")),
            Some(n) if n.chars().count() > MAX_NAME_CHARS => errors.push(field(
                "/name",
                format!("must be at most {MAX_NAME_CHARS} characters"),
            )),
            None if creating => errors.push(field("/name", "is required")),
            _ => {}
        }
        if let Some(d) = &input.description
            && d.chars().count() > MAX_DESCRIPTION_CHARS
        {
            errors.push(field(
                "/description",
                format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
            ));
        }
        let locked = match input.locked.as_deref().map(check_locked).transpose() {
            Ok(l) => l,
            Err(bad) => {
                let known = crate::model::config_field_names()
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                for (i, name) in bad {
                    errors.push(field(
                        format!("/locked/{i}"),
                        format!("`{name}` is not a config field (fields: {known})"),
                    ));
                }
                None
            }
        };
        let size = serde_json::to_vec(&input.config).map_or(0, |b| b.len());
        let max = self.config.assistant_max_config_bytes;
        if size as u64 > max {
            errors.push(field(
                "/config",
                format!(
                    "is {size} bytes as JSON; at most {max} are kept \
                     (PES_ASSISTANT_MAX_CONFIG_BYTES)"
                ),
            ));
        } else if let Err(e) = self.check_config(tenant, &input.config).await {
            match e {
                Refusal::Validation(message) => errors.push(field("/config", message)),
                other => return Err(other),
            }
        }
        invalid(errors)?;
        Ok(locked)
    }

    /// Create an assistant: version 1 (or, for the id of a deleted one, the next number),
    /// current.
    ///
    /// # Errors
    /// 422 naming every invalid field; 409 `assistant_exists`; 429 `quota_exceeded` past
    /// `PES_TENANT_MAX_ASSISTANTS`.
    pub async fn create_assistant(
        &self,
        tenant: &str,
        input: AssistantInput,
    ) -> Result<Assistant, Refusal> {
        let locked = self.check_assistant(tenant, &input, true).await?;
        let id = input.assistant_id.unwrap_or_else(AssistantId::generate);
        let draft = AssistantDraft {
            name: input.name.map(|n| n.trim().to_owned()),
            description: input.description,
            config: input.config,
            locked: Some(locked.unwrap_or_default()),
        };
        let max = self.config.tenant_max_assistants;
        self.store
            .create_assistant(tenant, &id, &draft, max)
            .await?
            .ok_or_else(|| Refusal::QuotaExceeded {
                detail: format!(
                    "the tenant has {max} assistants, its quota (PES_TENANT_MAX_ASSISTANTS): \
                     delete one to create `{id}`"
                ),
                retry_after_seconds: 60,
            })
    }

    /// Add a version to an assistant and make it current.
    ///
    /// # Errors
    /// 422 naming every invalid field; 404 `assistant_not_found`.
    pub async fn update_assistant(
        &self,
        tenant: &str,
        id: &AssistantId,
        input: AssistantInput,
    ) -> Result<Assistant, Refusal> {
        // Not found before invalid: another tenant learns nothing from the checks.
        self.store.get_assistant(tenant, id, None).await?;
        let locked = self.check_assistant(tenant, &input, false).await?;
        let draft = AssistantDraft {
            name: input.name.map(|n| n.trim().to_owned()),
            description: input.description,
            config: input.config,
            locked,
        };
        Ok(self
            .store
            .update_assistant(tenant, id, &draft, self.config.assistant_max_versions)
            .await?)
    }

    /// An assistant showing `version` (the current one when `None`).
    ///
    /// # Errors
    /// 404 `assistant_not_found` or `assistant_version_not_found`.
    pub async fn get_assistant(
        &self,
        tenant: &str,
        id: &AssistantId,
        version: Option<i64>,
    ) -> Result<Assistant, Refusal> {
        Ok(self.store.get_assistant(tenant, id, version).await?)
    }

    /// The tenant's assistants, newest first: `limit` after `cursor` (the caller asks one more
    /// than it shows, to know whether a next page exists).
    ///
    /// # Errors
    /// Store failures only.
    pub async fn list_assistants(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> Result<Vec<Assistant>, Refusal> {
        Ok(self.store.list_assistants(tenant, limit, cursor).await?)
    }

    /// An assistant's versions, newest first: `limit` below version `before`.
    ///
    /// # Errors
    /// 404 `assistant_not_found`.
    pub async fn list_assistant_versions(
        &self,
        tenant: &str,
        id: &AssistantId,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<AssistantVersion>, Refusal> {
        Ok(self
            .store
            .list_assistant_versions(tenant, id, limit, before)
            .await?)
    }

    /// Make `version` the one runs use from now on (roll back or forward).
    ///
    /// # Errors
    /// 404 `assistant_not_found`; 422 `assistant_version_not_found` for a version not kept.
    pub async fn set_current_assistant_version(
        &self,
        tenant: &str,
        id: &AssistantId,
        version: i64,
    ) -> Result<Assistant, Refusal> {
        if version < 1 {
            return Err(Refusal::Validation("version must be 1 or more".into()));
        }
        self.store
            .set_current_assistant_version(tenant, id, version)
            .await
            .map_err(|e| match e {
                e @ StoreError::AssistantVersionNotFound { .. } => unusable(e, "the"),
                other => other.into(),
            })
    }

    /// Delete an assistant: runs already enqueued with it finish; new ones naming it, and runs
    /// of threads that use it, are refused (422 `assistant_not_found`).
    ///
    /// # Errors
    /// 404 `assistant_not_found`.
    pub async fn delete_assistant(&self, tenant: &str, id: &AssistantId) -> Result<(), Refusal> {
        Ok(self.store.delete_assistant(tenant, id).await?)
    }

    /// The version `pin` names (or the current one), for a thread or run about to use it.
    async fn version_to_use(
        &self,
        tenant: &str,
        pin: &AssistantPin,
        whose: &str,
    ) -> Result<AssistantVersion, Refusal> {
        let id = &pin.assistant_id;
        if let Some(v) = self
            .store
            .assistant_version(tenant, id, pin.version, false)
            .await?
        {
            return Ok(v);
        }
        // Not there: the store says whether the assistant or only the version is missing.
        let why = match self.store.get_assistant(tenant, id, pin.version).await {
            Err(e) => e,
            Ok(_) => StoreError::AssistantNotFound(id.to_string()),
        };
        Err(unusable(why, whose))
    }

    /// Check that a thread whose config is `config` may use the assistant `pin` names: it
    /// exists, the thread sets none of the fields the version locks, and the thread's tool
    /// policy stays within the version's.
    ///
    /// # Errors
    /// 422 `assistant_not_found`, `assistant_version_not_found`, `field_locked` or
    /// `policy_floor`.
    pub async fn check_thread_assistant(
        &self,
        tenant: &str,
        pin: &AssistantPin,
        config: &AgentConfig,
    ) -> Result<(), Refusal> {
        let v = self.version_to_use(tenant, pin, "the thread's").await?;
        check_unlocked(&v, config, "thread")?;
        check_floor(&v.config, config, "assistant")
    }

    /// What a PATCH of a thread does to its assistant: `assistant_id` `Some(None)` detaches it,
    /// `Some(Some(id))` sets it (pinned to `assistant_version`, else following its current
    /// version), and `assistant_version` alone re-pins the thread's assistant. The resulting
    /// assistant and config are checked as on create. `None` when the assistant is unchanged.
    ///
    /// # Errors
    /// 404 for a missing thread; 422 as [`UseCases::check_thread_assistant`], or for a version
    /// without an assistant.
    pub async fn patch_thread_assistant(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        assistant_id: Option<Option<AssistantId>>,
        assistant_version: Option<Option<i64>>,
        config: Option<&AgentConfig>,
    ) -> Result<Option<Option<AssistantPin>>, Refusal> {
        if assistant_id.is_none() && assistant_version.is_none() && config.is_none() {
            return Ok(None);
        }
        let thread = self
            .store
            .get_thread(tenant, thread_id)
            .await?
            .ok_or_else(Refusal::thread_not_found)?;
        let no_assistant = || {
            Refusal::Validation(
                "assistantVersion pins a version of the thread's assistant, and the thread has \
                 none: set assistantId too"
                    .into(),
            )
        };
        let patch = match (assistant_id, assistant_version) {
            (None, None) => None,
            (Some(None), Some(Some(_))) => return Err(no_assistant()),
            (Some(None), _) => Some(None),
            (Some(Some(id)), version) => Some(Some(AssistantPin {
                assistant_id: id,
                version: version.flatten(),
            })),
            // Unpinning a thread that has no assistant changes nothing.
            (None, Some(None)) if thread.assistant_id.is_none() => None,
            (None, Some(version)) => {
                let id = thread.assistant_id.clone().ok_or_else(no_assistant)?;
                Some(Some(AssistantPin {
                    assistant_id: id,
                    version,
                }))
            }
        };
        let pin = match &patch {
            Some(p) => p.clone(),
            None => thread.assistant_id.clone().map(|id| AssistantPin {
                assistant_id: id,
                version: thread.assistant_version,
            }),
        };
        if let Some(pin) = pin {
            self.check_thread_assistant(tenant, &pin, config.unwrap_or(&thread.config))
                .await?;
        }
        Ok(patch)
    }

    /// The assistant version a run posted now uses, checked against the run's config, or
    /// `None` to let the enqueue use the thread's own (done in its transaction: the common run,
    /// which names no assistant and overrides nothing, costs no read here).
    ///
    /// # Errors
    /// 422 `assistant_not_found`, `assistant_version_not_found`, `field_locked`,
    /// `policy_floor`, or `validation_failed` for a version without an assistant.
    pub(super) async fn assistant_for_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        assistant_id: Option<AssistantId>,
        assistant_version: Option<i64>,
        config: &AgentConfig,
    ) -> Result<Option<AssistantRef>, Refusal> {
        if assistant_id.is_none() && assistant_version.is_none() && *config == Default::default() {
            return Ok(None);
        }
        // A thread that does not exist yet (`ifNotExists`) has no assistant and no config.
        let thread = self.store.get_thread(tenant, thread_id).await?;
        let (thread_pin, thread_config) = match thread {
            Some(t) => (
                t.assistant_id.map(|id| AssistantPin {
                    assistant_id: id,
                    version: t.assistant_version,
                }),
                t.config,
            ),
            None => (None, AgentConfig::default()),
        };
        let named = assistant_id.is_some();
        let pin = match (assistant_id, assistant_version, thread_pin) {
            (Some(id), version, _) => Some(AssistantPin {
                assistant_id: id,
                version,
            }),
            (None, Some(version), Some(p)) => Some(AssistantPin {
                assistant_id: p.assistant_id,
                version: Some(version),
            }),
            (None, Some(_), None) => {
                return Err(Refusal::Validation(
                    "assistantVersion pins a version of the thread's assistant, and the thread \
                     has none: name assistantId too"
                        .into(),
                ));
            }
            (None, None, pin) => pin,
        };
        let Some(pin) = pin else {
            check_policy_floor(&thread_config, config)?;
            return Ok(None);
        };
        let whose = if named { "the run's" } else { "the thread's" };
        let v = self.version_to_use(tenant, &pin, whose).await?;
        check_unlocked(&v, config, "run")?;
        check_policy_floor(&v.base_for(&thread_config), config)?;
        Ok(Some(AssistantRef {
            assistant_id: v.assistant_id,
            version: v.version,
        }))
    }
}
