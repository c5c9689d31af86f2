//! The use-case layer: what a client may ask of the service, whichever door it comes through
//! (the REST API, A2A, AG-UI, the MCP server, crons). [`UseCases`] checks a request
//! (`runs`: the query, the config, the tool policy floor, the tenant's quota; `decisions`: a
//! person's decision against its suspension; `assistants`: versioned configs and their use; `webhooks`: where a run's end may be announced, and
//! the deliveries; `crons`: schedules, and the scheduler that turns their ticks into runs;
//! [`memory`]: the memory store and its background passes; `operators`: the operator's view of a
//! tenant's day, raising it, deciding a suspension on it) and carries it out through [`RunCommands`]. Doors
//! parse their wire format and word the [`crate::problem::Refusal`] they get back; nothing here
//! imports a door. `retention` reads what a thread stores and deletes idle threads: pruned by
//! a tenant, or expired by the sweeper every replica runs.
//!
//! [`RunCommands`] is the one path of the commands that change a run from outside its worker: enqueue, cancel,
//! resume (a person's decision, or the sweeper's expiry), and deleting a thread (on request, or
//! because it stayed idle: `retention`). Each is the same
//! sequence, kept here once:
//!
//! 1. the store write, in one transaction (which also NOTIFYs other replicas, on Postgres);
//! 2. publish the observations it committed on this process's [`EventBus`];
//! 3. wake this process's worker when a run may have become claimable;
//! 4. reach the run at once when this process drives it: stop it (cancel, interrupt) or hand it a
//!    decision (through the [`RunRegistry`]).
//!
//! Other replicas learn the same through [`replicas`]: wake-ups from other processes sharing the
//! store (Postgres LISTEN, and a poll of the watched threads' `last_seq` for a lost
//! notification), delivered to the same bus, wake-up and registry.

mod assistants;
mod cases;
pub mod crons;
mod decisions;
mod flowchart_runs;
mod flowcharts;
mod follow;
pub mod memory;
mod operators;
mod policy;
pub mod replicas;
pub mod retention;
mod runs;
mod service;
mod steering;
mod storage;
mod threads;
mod webhooks;

use std::sync::Arc;

use tokio::sync::Notify;
use uuid::Uuid;

use crate::events::EventBus;
use crate::model::{MultitaskStrategy, RunStatus, ThreadId};

use crate::registry::RunRegistry;
/// The store's vocabulary the use cases speak in: what a door passes in (a query, a cursor, a
/// fork's cut) and reads back (a store error a door maps to its own wording).
pub use crate::store::{
    CancelledRun, Footprint, ForkRequest, ObservationQuery, PageCursor, RunFilter, StoreError,
    StoreResult,
};
use crate::store::{CreatedRun, Idle, NewRun, Resolution, ResolvedSuspension, SqlStore};
pub use assistants::AssistantInput;
pub use cases::{Handles, UseCases};
pub use decisions::{Decider, DecisionRequest, already_decided};
pub use flowchart_runs::FlowchartRunRequest;
pub use flowcharts::{Registered, flowchart_not_found};
pub use follow::{StreamItem, StreamSpec};
pub use operators::TenantRaised;
pub use policy::check_policy_floor;
pub use retention::{PruneRequest, Pruned};
pub use runs::RunRequest;
pub use service::Busy;
pub use steering::{MAX_STEERING_CHARS, check_steering_message};
pub use storage::StorageCounts;
pub use threads::{NewThread, ThreadUpdate};

/// Issues run commands (see the module doc). Cheap to clone: every clone shares the store, the
/// bus, the worker's wake-up and the registry of local runs.
#[derive(Clone)]
pub struct RunCommands {
    store: Arc<SqlStore>,
    bus: EventBus,
    runs: RunRegistry,
    /// Wakes this process's worker: a run may have become claimable.
    wake: Arc<Notify>,
}

impl RunCommands {
    /// Commands over `store`, publishing on `bus`, with a fresh worker wake-up and run registry
    /// (the worker built from these commands uses both).
    pub fn new(store: Arc<SqlStore>, bus: EventBus) -> Self {
        Self {
            store,
            bus,
            runs: RunRegistry::default(),
            wake: Arc::new(Notify::new()),
        }
    }

    /// The store the commands write to.
    pub fn store(&self) -> &Arc<SqlStore> {
        &self.store
    }

    /// The bus the commands publish on.
    pub fn bus(&self) -> &EventBus {
        &self.bus
    }

    /// The runs this process drives.
    pub fn runs(&self) -> &RunRegistry {
        &self.runs
    }

    /// Wake the worker: a run may have become claimable (a wake-up while it works is kept for
    /// its next sleep).
    pub fn wake_worker(&self) {
        self.wake.notify_one();
    }

    /// Resolves at the next [`RunCommands::wake_worker`] (or at once for one made while nobody
    /// waited): what the worker sleeps on.
    pub async fn worker_woken(&self) {
        self.wake.notified().await;
    }

    /// Enqueue a run (idempotency key and multitask strategy applied by the store). An
    /// `interrupt` also stops the thread's run this process drives at once, rather than at its
    /// next heartbeat.
    ///
    /// # Errors
    /// As [`SqlStore::create_run`].
    pub async fn enqueue(&self, new: NewRun) -> StoreResult<CreatedRun> {
        let strategy = new.strategy;
        if strategy == MultitaskStrategy::Steer
            && let Some(active) = self
                .store
                .newest_active_run(&new.tenant, &new.thread_id)
                .await?
        {
            match self
                .steer(&new.tenant, &new.thread_id, active, new.query.clone())
                .await
            {
                Ok(steered) => {
                    return Ok(CreatedRun {
                        run: steered.run,
                        created: false,
                        observations: steered.observations,
                    });
                }
                // It ended meanwhile, or it is a flowchart run (no steering): the query runs
                // on its own.
                Err(
                    crate::store::StoreError::Conflict(_) | crate::store::StoreError::RunNotFound,
                ) => {}
                Err(e) => return Err(e),
            }
        }
        let created = self.store.create_run(new).await?;
        self.bus.publish(&created.observations);
        if created.created {
            if strategy == MultitaskStrategy::Interrupt {
                let run = &created.run;
                self.runs
                    .cancel_thread(&run.tenant, &run.thread_id, run.run_id);
            }
            self.wake_worker();
        }
        Ok(created)
    }

    /// Cancel a queued, running or suspended run. A running run driven here stops at once;
    /// one driven elsewhere is stopped by its replica (signal) or at its next heartbeat.
    ///
    /// # Errors
    /// As [`SqlStore::cancel_run`].
    pub async fn cancel(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<CancelledRun> {
        let cancelled = self.store.cancel_run(tenant, thread_id, run_id).await?;
        self.bus.publish(&cancelled.observations);
        if cancelled.run.status == RunStatus::Running {
            self.runs.cancel(run_id);
        }
        // A cancelled queued or suspended run may free its thread for the next queued run.
        self.wake_worker();
        Ok(cancelled)
    }

    /// Resolve a pending suspension exactly once (a person's decision, or the sweeper's
    /// expiry). A suspended run goes back to the queue and the worker is woken; a run still
    /// busy with other items, when driven here, is handed the decision at once (on another
    /// replica the store's signal does that).
    ///
    /// # Errors
    /// As [`SqlStore::resolve_suspension`].
    pub async fn resume(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
    ) -> StoreResult<ResolvedSuspension> {
        let done = self
            .store
            .resolve_suspension(tenant, suspension_id, resolution)
            .await?;
        self.resumed(&done);
        Ok(done)
    }

    /// Resolve a pending suspension as [`RunCommands::resume`] does, raising its tenant's daily
    /// limits by `raise` in the same transaction (the operator's approval of a suspension on the
    /// tenant's day): the raise is made once, exactly when the suspension is resolved.
    ///
    /// # Errors
    /// As [`SqlStore::resolve_suspension_raising`].
    pub async fn resume_raising(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
        raise: crate::model::RaiseBy,
    ) -> StoreResult<ResolvedSuspension> {
        let done = self
            .store
            .resolve_suspension_raising(tenant, suspension_id, resolution, raise)
            .await?;
        self.resumed(&done);
        Ok(done)
    }

    /// A suspension was resolved: publish what it committed, and reach its run (handed the
    /// decision when driven here and busy, else the worker woken to claim it again).
    fn resumed(&self, done: &ResolvedSuspension) {
        self.bus.publish(&done.observations);
        match done.run.status {
            RunStatus::Running => {
                self.runs.decided(done.run.run_id);
            }
            _ => self.wake_worker(),
        }
    }

    /// Steer a run that has not ended: `message` is committed as a user message of the run
    /// (named `steering`) with its `STEERING` observation; a running run driven here reads it at
    /// once (one driven elsewhere, on the store's signal), a queued or suspended one when it goes
    /// on.
    ///
    /// # Errors
    /// As [`SqlStore::steer_run`]: not found, or 409 for a run that ended.
    pub async fn steer(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
        message: String,
    ) -> StoreResult<crate::store::SteeredRun> {
        let m = crate::model::Message {
            id: crate::model::new_id(),
            thread_id: thread_id.clone(),
            run_id: Some(run_id),
            role: crate::model::MessageRole::User,
            content: message.clone(),
            item_id: None,
            tool_call_id: None,
            name: Some(crate::agent::STEERING_NAME.to_owned()),
            tool_calls: vec![],
            created_at: chrono::Utc::now(),
        };
        let o = crate::model::NewObservation::of(
            run_id,
            None,
            crate::agent::prompts::truncate(&message, 120),
            &crate::model::payloads::SteeringContent {
                message,
                message_id: m.id,
            },
        );
        let steered = self
            .store
            .steer_run(tenant, thread_id, run_id, m, o)
            .await?;
        self.bus.publish(&steered.observations);
        if steered.run.status == RunStatus::Running {
            self.runs.steered(run_id);
        }
        Ok(steered)
    }

    /// Delete a thread with everything it owns; its streams here end (other replicas' end on
    /// the store's signal, or at their next poll). False when it did not exist.
    ///
    /// # Errors
    /// As [`SqlStore::delete_thread`].
    pub async fn delete_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        let deleted = self.store.delete_thread(tenant, thread_id).await?;
        if deleted {
            self.bus.thread_deleted(tenant, thread_id);
        }
        Ok(deleted)
    }

    /// Delete a thread as [`RunCommands::delete_thread`] does, but only if `which` still
    /// selects it and no run is active on it (its time-to-live passed, or a prune asks for it):
    /// false when it is gone, busy again, or being deleted by another replica.
    ///
    /// # Errors
    /// As [`SqlStore::delete_idle_thread`].
    pub async fn delete_idle_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        which: &Idle,
    ) -> StoreResult<bool> {
        let deleted = self
            .store
            .delete_idle_thread(tenant, thread_id, which)
            .await?;
        if deleted {
            self.bus.thread_deleted(tenant, thread_id);
        }
        Ok(deleted)
    }
}
