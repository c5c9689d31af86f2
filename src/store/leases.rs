//! Leases: what a worker may claim, extending a lease and giving a run back. The claim
//! statements themselves are per dialect (`postgres::claim_runs` locks with `SKIP LOCKED` in one
//! round trip; SQLite's writers are serialized) but pick runs by the rules written here.

use std::time::Duration;

use super::rows::Cols;
use uuid::Uuid;

use super::db::SqlStore;
use super::fragments::lease_secs;
use super::sql::{id_text, q};
use super::{Fence, Signal, StoreError, StoreResult};

impl SqlStore {
    pub(crate) async fn extend_lease(&self, fence: Fence, lease: Duration) -> StoreResult<bool> {
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

    pub(crate) async fn extend_leases(
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

    /// A parked run goes back to the queue still `running`: its lease runs out now, so the next
    /// claim (on any replica) takes it, the way it takes over a run whose worker died.
    pub(crate) async fn requeue(&self, fence: Fence) -> StoreResult<()> {
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

    pub(crate) async fn release(&self, fence: Fence) -> StoreResult<()> {
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
