//! Leases: what a worker may claim, extending a lease and giving a run back. The claim
//! statements themselves are per dialect (`postgres::claim_runs` locks with `SKIP LOCKED` in one
//! round trip; SQLite's writers are serialized) but pick runs by the rules written here.

use std::time::Duration;

use super::rows::Cols;
use uuid::Uuid;

use super::sql::{Arg, id_text, q};
use super::sql_store::SqlStore;
use super::{Fence, Signal, StoreError, StoreResult};

/// Running runs whose lease expired (`$3` is how many), earliest expiry first.
pub(crate) const EXPIRED_CANDIDATES: &str = "SELECT run_id FROM runs \
    WHERE status = 'running' AND lease_expires_at < {now} ORDER BY lease_expires_at LIMIT $3";

/// The oldest queued run of each thread with no running or suspended run (so never two of one
/// thread), oldest first; `$3` is how many, less `taken` (SQL: the slots already filled).
pub(crate) fn queued_candidates(taken: &str) -> String {
    format!(
        "SELECT r.run_id FROM runs r \
         WHERE r.status = 'queued' AND NOT EXISTS ( \
           SELECT 1 FROM runs o WHERE o.tenant = r.tenant AND o.thread_id = r.thread_id \
             AND (o.status IN ('running', 'suspended') \
                  OR (o.status = 'queued' \
                      AND (o.created_at, o.run_id) < (r.created_at, r.run_id)))) \
         ORDER BY r.created_at, r.run_id LIMIT $3 - {taken}"
    )
}

/// Claim the runs a candidate query picked: `$1` the owner, `$2` the lease in seconds.
pub(crate) const CLAIM: &str = "UPDATE runs SET status = 'running', attempt = attempt + 1, \
    lease_owner = $1, lease_expires_at = {later 2}, started_at = COALESCE(started_at, {now})";

/// The lease in seconds, as a bind value.
pub(crate) fn lease_secs(lease: Duration) -> Arg {
    Arg::Float(lease.as_secs_f64())
}

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
