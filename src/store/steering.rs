//! Steering: a person's message to a run that has not ended, committed at once (a user message in
//! the thread's conversation and a `STEERING` observation) so the run reads it at its next safe
//! point, here or on any replica, or when it goes on after a queue or a suspension.

use uuid::Uuid;

use super::apply::append_observations;
use super::rows;
use super::sql::q;
use super::sql_store::SqlStore;
use super::tables::{MESSAGES, message_cols_at};
use super::threads::lock_thread;
use super::{Signal, StoreError, StoreResult};
use crate::model::{Message, NewObservation, Observation, Run, RunKind, RunStatus, ThreadId};

/// A run that was steered, and the observation that says so.
#[derive(Debug, Clone)]
pub struct SteeredRun {
    pub run: Run,
    pub observations: Vec<Observation>,
}

impl SqlStore {
    /// The newest queued, running or suspended run of a thread: the one a `steer` strategy
    /// steers.
    ///
    /// # Errors
    /// The store failed.
    pub async fn newest_active_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<Uuid>> {
        self.read()
            .await?
            .opt(
                q(
                    "SELECT run_id FROM runs WHERE tenant = $1 AND thread_id = $2 \
                   AND status IN ('queued', 'running', 'suspended') \
                   ORDER BY created_at DESC, run_id DESC LIMIT 1",
                )
                .bind(tenant)
                .bind(thread_id.as_str()),
            )
            .await?
            .map(|r| r.uuid("run_id"))
            .transpose()
    }

    /// Commit `message` (a user message of run `run_id`) and its `STEERING` observation, unless
    /// the run ended; a running run is pushed the news (on whichever replica drives it).
    ///
    /// # Errors
    /// [`StoreError::RunNotFound`]; [`StoreError::Conflict`] when the run already ended.
    pub async fn steer_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
        message: Message,
        observation: NewObservation,
    ) -> StoreResult<SteeredRun> {
        let mut tx = self.write().await?;
        // Lock order: thread, then run (as create_run and apply).
        if lock_thread(&mut tx, tenant, thread_id).await?.is_none() {
            return Err(StoreError::RunNotFound);
        }
        let row = tx
            .opt(
                q(
                    "SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3 \
                   {lock}",
                )
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(run_id),
            )
            .await?
            .ok_or(StoreError::RunNotFound)?;
        let run = rows::run_from_row(&row)?;
        if run.status.is_terminal() {
            return Err(StoreError::Conflict(format!(
                "run already {}: a finished run takes no steering",
                run.status
            )));
        }
        if run.kind == RunKind::Flowchart {
            // A fixed procedure has no planner to read it: a `steer` query on its thread runs on
            // its own after it instead (see `RunCommands::enqueue`).
            return Err(StoreError::Conflict(
                "a flowchart run takes no steering: it runs a fixed procedure".into(),
            ));
        }
        // Counted under the thread's lock, so concurrent steers never pass the limit.
        let max = self.max_steers;
        let held = tx
            .one(
                q(
                    "SELECT COUNT(*) AS n FROM (SELECT 1 FROM messages WHERE tenant = $1 \
                   AND thread_id = $2 AND run_id = $3 AND name = $4 LIMIT $5) s",
                )
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(run_id)
                .bind(crate::agent::STEERING_NAME)
                .bind(i64::try_from(max).unwrap_or(i64::MAX)),
            )
            .await?
            .int("n")?;
        if u64::try_from(held).unwrap_or(0) >= max {
            return Err(StoreError::SteeringQuota { max });
        }
        let observations =
            append_observations(&mut tx, tenant, thread_id, vec![observation]).await?;
        // The message carries the seq of the observation that reports it (history and forks).
        let seq = observations.last().map(|o| o.seq);
        MESSAGES
            .write(&mut tx, tenant, thread_id, message_cols_at(&message, seq)?)
            .await?;
        if run.status == RunStatus::Running {
            tx.notify(&Signal::Steered { run: run_id }).await?;
        }
        tx.commit().await?;
        Ok(SteeredRun { run, observations })
    }
}
