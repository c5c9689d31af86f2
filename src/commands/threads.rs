//! A thread as the doors see it: creating, updating and forking one (with the checks and limits
//! each takes), and reading it back — the thread, its runs, state now or at a past point, its
//! messages, history and observations. The reads return what the store holds (`None`: no such
//! thread of the tenant's) so each door words a missing thread its own way.

use serde_json::Value;
use uuid::Uuid;

use super::UseCases;
use crate::agent::DelegationLedger;
use crate::model::{
    AgentConfig, AssistantId, AssistantPin, Message, Observation, ObservationType, Run, Thread,
    ThreadId, ThreadSummary,
};
use crate::problem::Refusal;
use crate::store::{
    AgentSnapshot, ForkRequest, Forked, HistoryPoint, ObservationQuery, PageCursor, PastError,
    PastState, RunFilter, StoreResult, ThreadPatch,
};

/// A thread to create, as a door received it.
#[derive(Debug, Clone, Default)]
pub struct NewThread {
    /// The client's id; a UUIDv7 when absent.
    pub thread_id: Option<ThreadId>,
    /// A JSON object (`{}` when absent).
    pub metadata: Option<Value>,
    pub config: Option<AgentConfig>,
    /// The assistant whose config the thread's runs start from, and a pinned version of it.
    pub assistant_id: Option<AssistantId>,
    pub assistant_version: Option<i64>,
}

/// A change to a thread: fields present replace the stored ones (`Some(None)` clears).
#[derive(Debug, Clone, Default)]
pub struct ThreadUpdate {
    pub metadata: Option<Value>,
    pub config: Option<AgentConfig>,
    pub assistant_id: Option<Option<AssistantId>>,
    pub assistant_version: Option<Option<i64>>,
}

impl From<PastError> for Refusal {
    fn from(e: PastError) -> Self {
        match e {
            PastError::OutOfRange { .. } => Self::Unprocessable {
                code: "seq_out_of_range",
                detail: e.to_string(),
            },
            PastError::Store(e) => e.into(),
        }
    }
}

/// Metadata is a JSON object (or absent).
fn check_metadata(metadata: &Option<Value>) -> Result<(), Refusal> {
    match metadata {
        Some(Value::Object(_)) | None => Ok(()),
        Some(_) => Err(Refusal::Validation("metadata must be a JSON object".into())),
    }
}

/// `assistantVersion` must name a version (1 and up) of an assistant the same request names.
fn check_version(version: Option<i64>, has_assistant: bool) -> Result<(), Refusal> {
    match version {
        Some(v) if v < 1 => Err(Refusal::Validation(
            "assistantVersion must be 1 or more".into(),
        )),
        Some(_) if !has_assistant => Err(Refusal::Validation(
            "assistantVersion pins a version of an assistant: set assistantId too".into(),
        )),
        _ => Ok(()),
    }
}

/// 422 `seq_out_of_range` for a negative `atSeq`.
fn check_at_seq(at: i64) -> Result<(), Refusal> {
    if at < 0 {
        return Err(Refusal::Unprocessable {
            code: "seq_out_of_range",
            detail: format!("atSeq must be 0 or more, not {at}"),
        });
    }
    Ok(())
}

impl UseCases {
    /// Create a thread: the tenant's storage and thread quotas, its config against the policy
    /// floor, and the assistant it names (which the config may not override where it locks).
    ///
    /// # Errors
    /// 422 for a config or assistant that does not fit, 409 `thread_exists`, 429 over a quota.
    pub async fn create_thread(&self, tenant: &str, new: NewThread) -> Result<Thread, Refusal> {
        check_metadata(&new.metadata)?;
        check_version(new.assistant_version, new.assistant_id.is_some())?;
        self.storage_room(tenant).await?;
        let config = new.config.unwrap_or_default();
        self.check_config(tenant, &config).await?;
        let assistant = new.assistant_id.map(|assistant_id| AssistantPin {
            assistant_id,
            version: new.assistant_version,
        });
        if let Some(pin) = &assistant {
            self.check_thread_assistant(tenant, pin, &config).await?;
        }
        let id = new.thread_id.unwrap_or_else(ThreadId::generate);
        let metadata = new
            .metadata
            .unwrap_or_else(|| Value::Object(Default::default()));
        Ok(self
            .store
            .create_thread_using(tenant, &id, metadata, config, assistant.as_ref())
            .await?)
    }

    /// Update a thread's metadata, config or assistant (checked as on creation).
    ///
    /// # Errors
    /// 404 for no such thread, 422 for a config or assistant that does not fit.
    pub async fn update_thread(
        &self,
        tenant: &str,
        id: &ThreadId,
        update: ThreadUpdate,
    ) -> Result<Thread, Refusal> {
        check_metadata(&update.metadata)?;
        check_version(update.assistant_version.flatten(), true)?;
        if let Some(cfg) = &update.config {
            self.check_config(tenant, cfg).await?;
        }
        let assistant = self
            .patch_thread_assistant(
                tenant,
                id,
                update.assistant_id,
                update.assistant_version,
                update.config.as_ref(),
            )
            .await?;
        let patch = ThreadPatch {
            metadata: update.metadata,
            config: update.config,
            assistant,
        };
        self.store
            .update_thread(tenant, id, patch)
            .await?
            .ok_or_else(Refusal::thread_not_found)
    }

    /// Delete a thread with everything it holds (see [`super::RunCommands::delete_thread`]).
    ///
    /// # Errors
    /// 404 for no such thread.
    pub async fn delete_thread(&self, tenant: &str, id: &ThreadId) -> Result<(), Refusal> {
        if self.commands.delete_thread(tenant, id).await? {
            Ok(())
        } else {
            Err(Refusal::thread_not_found())
        }
    }

    /// Cancel a queued, running or suspended run (see [`super::RunCommands::cancel`]).
    ///
    /// # Errors
    /// As the store's cancel: no such run, or one that has ended.
    pub async fn cancel(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<crate::store::CancelledRun> {
        self.commands.cancel(tenant, thread_id, run_id).await
    }

    /// Fork a thread at `atSeq` (see [`crate::store::SqlStore::fork_thread`]), within the
    /// tenant's storage and thread quotas. The copy runs in the service's own task, so a client
    /// that hangs up does not stop it between its transactions; a run the fork continues is
    /// claimable at once, so the worker is woken.
    ///
    /// # Errors
    /// 404 for no such thread, 422 `seq_out_of_range`, 409 `thread_exists`, 429 over a quota.
    pub async fn fork(
        &self,
        tenant: &str,
        source: &ThreadId,
        req: ForkRequest,
    ) -> Result<Forked, Refusal> {
        check_metadata(&req.metadata)?;
        if let Some(at) = req.at_seq {
            check_at_seq(at)?;
        }
        self.storage_room(tenant).await?;
        let store = self.store.clone();
        let (owner, from) = (tenant.to_owned(), source.clone());
        let forked = self
            .tracker
            .spawn(async move { store.fork_thread(&owner, &from, req).await })
            .await
            .map_err(|e| Refusal::Internal(e.into()))??
            .ok_or_else(Refusal::thread_not_found)?;
        if !forked.runs.is_empty() {
            self.commands.wake_worker();
        }
        tracing::info!(
            source = %source, fork = %forked.thread.thread_id, at_seq = forked.at_seq,
            runs = forked.runs.len(), "thread forked"
        );
        Ok(forked)
    }

    /// The state right after observation `at`.
    ///
    /// # Errors
    /// 404 for no such thread, 422 `seq_out_of_range` for a negative `at` or one past the log.
    pub async fn state_at(
        &self,
        tenant: &str,
        id: &ThreadId,
        at: i64,
    ) -> Result<PastState, Refusal> {
        check_at_seq(at)?;
        self.store
            .state_at(tenant, id, at)
            .await?
            .ok_or_else(Refusal::thread_not_found)
    }

    /// The remote tasks a thread's items wait on (as of observation `upto`, or now), by item:
    /// `{itemId, submittedAt, taskIds}`.
    ///
    /// # Errors
    /// The store fails.
    pub async fn pending_remote_tasks(
        &self,
        tenant: &str,
        id: &ThreadId,
        upto: Option<i64>,
    ) -> StoreResult<Vec<Value>> {
        let read = |types: Vec<ObservationType>| {
            let query = ObservationQuery {
                after: 0,
                limit: 0,
                types: Some(types),
                parent_id: None,
                run_id: None,
            };
            async move {
                self.store
                    .list_observations(tenant, id, &query)
                    .await
                    .map(Option::unwrap_or_default)
                    .map(|mut found| {
                        // A past state waits on what was sent and unanswered by then.
                        found.retain(|o| upto.is_none_or(|at| o.seq <= at));
                        found
                    })
            }
        };
        // Most threads never delegate: their tool results are not read at all.
        let updates = read(vec![ObservationType::A2aTaskUpdate]).await?;
        if updates.is_empty() {
            return Ok(vec![]);
        }
        let mut seen = read(vec![ObservationType::ToolExecution]).await?;
        seen.extend(updates);
        // The ledger wants the log in commit order.
        seen.sort_by_key(|o| o.seq);
        let ledger = DelegationLedger::read(&seen);
        // By item, in the order first sent: (submittedAt, taskIds).
        let mut by_item: Vec<(String, Value, Vec<String>)> = Vec::new();
        for r in ledger.unanswered() {
            let (Some(item), Some(task)) = (&r.item_id, &r.task_id) else {
                continue;
            };
            match by_item.iter_mut().find(|(i, _, _)| i == item) {
                Some((_, _, tasks)) if !tasks.contains(task) => tasks.push(task.clone()),
                Some(_) => {}
                None => by_item.push((
                    item.clone(),
                    serde_json::json!(r.submitted_at),
                    vec![task.clone()],
                )),
            }
        }
        Ok(by_item
            .into_iter()
            .map(|(item, at, tasks)| {
                serde_json::json!({"itemId": item, "submittedAt": at, "taskIds": tasks})
            })
            .collect())
    }

    // Reads, as the store holds them (`None`: no such thread, run or suspension of the tenant).

    /// A thread.
    ///
    /// # Errors
    /// The store fails.
    pub async fn get_thread(&self, tenant: &str, id: &ThreadId) -> StoreResult<Option<Thread>> {
        self.store.get_thread(tenant, id).await
    }

    /// A page of the tenant's threads, newest first.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_threads(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<ThreadSummary>> {
        self.store.list_threads(tenant, limit, cursor).await
    }

    /// A thread's agent state, items and pending suspension now.
    ///
    /// # Errors
    /// The store fails.
    pub async fn state_snapshot(
        &self,
        tenant: &str,
        id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>> {
        self.store.state_snapshot(tenant, id).await
    }

    /// A page of a thread's conversation, oldest first.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_messages(
        &self,
        tenant: &str,
        id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Message>>> {
        self.store.list_messages(tenant, id, limit, cursor).await
    }

    /// A page of the points a thread's past state can be read at, newest first.
    ///
    /// # Errors
    /// The store fails.
    pub async fn history(
        &self,
        tenant: &str,
        id: &ThreadId,
        limit: u32,
        before: Option<i64>,
    ) -> StoreResult<Option<Vec<HistoryPoint>>> {
        self.store.history(tenant, id, limit, before).await
    }

    /// The observations `query` selects, in `seq` order.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_observations(
        &self,
        tenant: &str,
        id: &ThreadId,
        query: &ObservationQuery,
    ) -> StoreResult<Option<Vec<Observation>>> {
        self.store.list_observations(tenant, id, query).await
    }

    /// A run of a thread.
    ///
    /// # Errors
    /// The store fails.
    pub async fn get_run(
        &self,
        tenant: &str,
        id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<Option<Run>> {
        self.store.get_run(tenant, id, run_id).await
    }

    /// A run of the tenant, by its id alone (A2A's task id).
    ///
    /// # Errors
    /// The store fails.
    pub async fn find_run(&self, tenant: &str, run_id: Uuid) -> StoreResult<Option<Run>> {
        self.store.find_run(tenant, run_id).await
    }

    /// A page of a thread's runs, newest first.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_runs(
        &self,
        tenant: &str,
        id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Run>>> {
        self.store.list_runs(tenant, id, limit, cursor).await
    }

    /// A page of the tenant's runs across threads that `filter` selects, and how many it selects.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_tenant_runs(
        &self,
        tenant: &str,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<(Vec<Run>, u64)> {
        self.store
            .list_tenant_runs(tenant, filter, limit, cursor)
            .await
    }
}
