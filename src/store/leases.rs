//! Leases: what a worker may claim, extending a lease and giving a run back. The claim
//! statements themselves are per dialect (`postgres::claim_runs` locks with `SKIP LOCKED` in one
//! round trip; SQLite's writers are serialized) but pick runs by the same rules (`fragments`:
//! the candidates, and the tenants this process served, which break ties).

use std::time::Duration;

use uuid::Uuid;

use super::fragments::lease_secs;
use super::sql::{id_text, q};
use super::sql_store::{Db, SqlStore};
use super::{Claim, Fence, Signal, StoreError, StoreResult};
use crate::model::Run;

impl SqlStore {
    /// Claim up to `max` runnable runs at once: running runs whose lease expired (earliest
    /// expiry first), then the oldest queued run of each thread that has no running or suspended
    /// run (oldest first). Each claim bumps `attempt`, sets the lease owner and expiry and moves
    /// the run to `running`; never two running runs on one thread. Fewer than `max` runs means
    /// nothing else was claimable; [`Claim::next_expiry`] then says when to look again.
    ///
    /// Queued runs are taken tenant by tenant in turn (see
    /// [`super::fragments::queued_candidates`]): among tenants with equal turns, the one this
    /// process served longest ago goes first.
    pub async fn claim_runs(&self, owner: &str, lease: Duration, max: usize) -> StoreResult<Claim> {
        let served = self
            .served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .param();
        let claim = match &self.db {
            Db::Pg(_) => {
                super::postgres::claim_runs(self.write_one().await?, owner, lease, max, &served)
                    .await
            }
            Db::Lite { .. } => {
                super::sqlite::claim_runs(self.write().await?, owner, lease, max, &served).await
            }
        }?;
        if !claim.runs.is_empty() {
            let mut served = self
                .served
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for run in &claim.runs {
                served.note(&run.tenant);
            }
        }
        Ok(claim)
    }

    /// Claim the next runnable run (see [`SqlStore::claim_runs`]).
    pub async fn claim_run(&self, owner: &str, lease: Duration) -> StoreResult<Option<Run>> {
        Ok(self.claim_runs(owner, lease, 1).await?.runs.pop())
    }

    /// Extend the lease; returns whether a cancel was requested.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the fence no longer matches a running run.
    pub async fn heartbeat(&self, fence: Fence, lease: Duration) -> StoreResult<bool> {
        self.write_one()
            .await?
            .opt(
                q("UPDATE runs SET lease_expires_at = {later 3} \
                   WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
                   RETURNING cancel_requested")
                .bind(fence.run_id)
                .bind(fence.attempt)
                .bind(lease_secs(lease)),
            )
            .await?
            .ok_or(StoreError::LeaseLost)?
            .boolean("cancel_requested")
    }

    /// Extend the leases of many runs in one statement (a worker's heartbeat for every run it
    /// drives, so ten thousand runs waiting on a model cost one statement per period, not ten
    /// thousand): the runs whose fence still holds, each with whether a cancel was requested. A
    /// run missing from the answer lost its lease.
    pub async fn heartbeat_many(
        &self,
        fences: &[Fence],
        lease: Duration,
    ) -> StoreResult<Vec<(Uuid, bool)>> {
        if fences.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = fences.iter().map(|f| f.run_id).collect();
        // The run id narrows by primary key; `run:attempt` checks each fence.
        let keys: Vec<String> = fences
            .iter()
            .map(|f| format!("{}:{}", id_text(f.run_id), f.attempt))
            .collect();
        self.write_one()
            .await?
            .all(
                q("UPDATE runs SET lease_expires_at = {later 3} \
                   WHERE {in run_id 1} AND {in concat(run_id,':',attempt) 2} \
                     AND status = 'running' RETURNING run_id, cancel_requested")
                .bind(ids)
                .bind(keys)
                .bind(lease_secs(lease)),
            )
            .await?
            .iter()
            .map(|r| Ok((r.uuid("run_id")?, r.boolean("cancel_requested")?)))
            .collect()
    }

    /// Give a run that waited on remote agents (parked, still `running`) back to the queue
    /// without changing its status: its lease runs out at once, so the next claim, on any
    /// replica, takes it and the run goes on (the way it takes over a run whose worker died).
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the fence no longer holds.
    pub async fn requeue_run(&self, fence: Fence) -> StoreResult<()> {
        let mut tx = self.write().await?;
        let requeued = tx
            .exec(
                q(
                    "UPDATE runs SET lease_owner = NULL, lease_expires_at = {later 3} \
                   WHERE run_id = $1 AND attempt = $2 AND status = 'running'",
                )
                .bind(fence.run_id)
                .bind(fence.attempt)
                // A second in the past: claims take leases that expired strictly before now.
                .bind(super::sql::Arg::Float(-1.0)),
            )
            .await?;
        if requeued == 0 {
            return Err(StoreError::LeaseLost);
        }
        tx.notify(&Signal::RunReady).await?;
        tx.commit().await
    }

    /// Give a run back to the queue (graceful shutdown): `queued`, lease cleared.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the fence no longer matches.
    pub async fn release_run(&self, fence: Fence) -> StoreResult<()> {
        let mut tx = self.write().await?;
        let released = tx
            .exec(
                q("UPDATE runs SET status = 'queued', lease_owner = NULL, \
                     lease_expires_at = NULL \
                   WHERE run_id = $1 AND attempt = $2 AND status = 'running'")
                .bind(fence.run_id)
                .bind(fence.attempt),
            )
            .await?;
        if released == 0 {
            return Err(StoreError::LeaseLost);
        }
        tx.notify(&Signal::RunReady).await?;
        tx.commit().await
    }
}
