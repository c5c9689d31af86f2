//! Suspensions: reading them, resolving one exactly once (with its run and its `AGENT_RESUMED`
//! observation, atomically), and finding expired ones. Written once for both dialects.

use uuid::Uuid;

use super::apply::append_observations;
use super::rows;
use super::sql::q;
use super::sql_store::SqlStore;
use super::tenant_spend::insert_tenant_raise;
use super::threads::{lock_thread, map_rows};
use super::{Resolution, ResolvedSuspension, Signal, StoreError, StoreResult};
use crate::model::{RaiseBy, RunStatus, Suspension, ThreadId};

impl SqlStore {
    /// Pending suspensions of a thread (all of them with `include_resolved`), oldest first;
    /// `None` when the thread does not exist.
    pub async fn list_suspensions(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        include_resolved: bool,
    ) -> StoreResult<Option<Vec<Suspension>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        let found = self
            .read()
            .await?
            .all(
                q(
                    "SELECT * FROM suspensions WHERE tenant = $1 AND thread_id = $2 \
                     AND ($3 OR status = 'pending') ORDER BY created_at, suspension_id",
                )
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(include_resolved),
            )
            .await?;
        map_rows(&found, rows::suspension_from_row).map(Some)
    }

    /// A run's suspensions, any status, oldest first.
    pub async fn run_suspensions(
        &self,
        tenant: &str,
        run_id: Uuid,
    ) -> StoreResult<Vec<Suspension>> {
        let found = self
            .read()
            .await?
            .all(
                q(
                    "SELECT * FROM suspensions WHERE tenant = $1 AND run_id = $2 \
                   ORDER BY created_at, suspension_id",
                )
                .bind(tenant)
                .bind(run_id),
            )
            .await?;
        map_rows(&found, rows::suspension_from_row)
    }

    /// A suspension by id, within `tenant`.
    pub async fn get_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
    ) -> StoreResult<Option<Suspension>> {
        self.read()
            .await?
            .opt(
                q("SELECT * FROM suspensions WHERE tenant = $1 AND suspension_id = $2")
                    .bind(tenant)
                    .bind(suspension_id),
            )
            .await?
            .as_ref()
            .map(rows::suspension_from_row)
            .transpose()
    }

    /// Resolve a pending suspension exactly once, atomically: the suspension moves from
    /// `pending` to `resolution.status` (compare-and-set; concurrent callers get one success),
    /// its run from `suspended` back to `queued`, and an `AGENT_RESUMED` observation (parentId =
    /// the item id; content `{suspensionId, decision, reason?, expired?}`) is committed with them.
    ///
    /// # Errors
    /// [`StoreError::SuspensionNotFound`] for an unknown id or another tenant's;
    /// [`StoreError::Conflict`] when it is no longer pending.
    pub async fn resolve_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
    ) -> StoreResult<ResolvedSuspension> {
        self.resolve(tenant, suspension_id, resolution, None).await
    }

    /// Resolve a pending suspension as [`SqlStore::resolve_suspension`] does, and in the same
    /// transaction raise its tenant's daily limits by `raise` (the operator's approval of a
    /// suspension on the tenant's day): the raise is made exactly when the suspension moves.
    ///
    /// # Errors
    /// As [`SqlStore::resolve_suspension`].
    pub async fn resolve_suspension_raising(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
        raise: RaiseBy,
    ) -> StoreResult<ResolvedSuspension> {
        self.resolve(tenant, suspension_id, resolution, Some(raise))
            .await
    }

    async fn resolve(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
        raise: Option<RaiseBy>,
    ) -> StoreResult<ResolvedSuspension> {
        let Resolution {
            status,
            decision,
            trace_context,
        } = resolution;
        let expired = rows::resolution_is_expiry(status)?;
        let mut tx = self.write().await?;
        // Which thread and run to lock (no lock yet: the order is thread, run, suspension).
        let found = tx
            .opt(
                q("SELECT thread_id, run_id FROM suspensions \
                   WHERE tenant = $1 AND suspension_id = $2")
                .bind(tenant)
                .bind(suspension_id),
            )
            .await?
            .ok_or(StoreError::SuspensionNotFound)?;
        let thread_id = ThreadId::from_stored(found.text("thread_id")?);
        let run_id = found.uuid("run_id")?;
        // The thread lock serializes concurrent resolvers (and cancels, applies) of this thread.
        if lock_thread(&mut tx, tenant, &thread_id).await?.is_none() {
            return Err(StoreError::SuspensionNotFound);
        }
        let run_status = tx
            .opt(q("SELECT status FROM runs WHERE run_id = $1 {lock}").bind(run_id))
            .await?
            .map(|r| r.enumeration::<RunStatus>("status"))
            .transpose()?;
        // Compare-and-set: only a pending suspension moves.
        let row = tx
            .opt(
                q(
                    "UPDATE suspensions SET status = $3, decision = $4, resolved_at = {now} \
                   WHERE tenant = $1 AND suspension_id = $2 AND status = 'pending' RETURNING *",
                )
                .bind(tenant)
                .bind(suspension_id)
                .bind(status.as_str())
                .bind(rows::to_json(&decision)?),
            )
            .await?;
        let Some(row) = row else {
            let current = tx
                .opt(
                    q("SELECT status FROM suspensions WHERE suspension_id = $1")
                        .bind(suspension_id),
                )
                .await?;
            return Err(match current {
                Some(current) => {
                    StoreError::Conflict(format!("suspension already {}", current.text("status")?))
                }
                None => StoreError::SuspensionNotFound,
            });
        };
        let suspension = rows::suspension_from_row(&row)?;
        // A suspended run goes back to the queue (its lease was cleared when it suspended; the
        // next claim bumps attempt). A run still busy with other items, or queued, reads the
        // decision when it next looks (a running run that then finds nothing else to do is
        // queued again by its own suspend commit: see `RunUpdate::unless_decided`).
        let run_row = tx
            .opt(
                q("UPDATE runs SET \
                     status = CASE WHEN status = 'suspended' THEN 'queued' ELSE status END, \
                     trace_context = COALESCE($2, trace_context) \
                   WHERE run_id = $1 AND status IN ('suspended', 'queued', 'running') \
                   RETURNING *")
                .bind(run_id)
                .bind(&trace_context),
            )
            .await?;
        let Some(run_row) = run_row else {
            // Dropping `tx` rolls the suspension back: it stays pending.
            let run_status = run_status.map_or("gone", RunStatus::as_str);
            return Err(StoreError::Conflict(format!(
                "the suspension's run is {run_status}: it takes no more decisions"
            )));
        };
        if let Some(raise) = raise {
            insert_tenant_raise(&mut tx, tenant, raise, Some(suspension_id)).await?;
        }
        let obs = vec![rows::agent_resumed(&suspension, &decision, expired)];
        let observations = append_observations(&mut tx, tenant, &thread_id, obs).await?;
        tx.notify(&Signal::RunReady).await?;
        if run_status == Some(RunStatus::Running) {
            // The run is busy with other items on some replica: push the decision to it.
            tx.notify(&Signal::Decided { run: run_id }).await?;
        }
        tx.commit().await?;
        Ok(ResolvedSuspension {
            suspension,
            run: rows::run_from_row(&run_row)?,
            observations,
        })
    }

    /// Pending suspensions whose `expires_at` has passed, as `(tenant, suspension_id)`, oldest
    /// first, at most `limit`.
    pub async fn due_suspensions(&self, limit: u32) -> StoreResult<Vec<(String, Uuid)>> {
        // The predicate matches the partial index `suspensions_expiry_idx` (SQLite's fixed-width
        // timestamps compare as text).
        self.read()
            .await?
            .all(
                q("SELECT tenant, suspension_id FROM suspensions \
                   WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at < {now} \
                   ORDER BY expires_at, suspension_id LIMIT $1")
                .bind(rows::sql_limit(limit)),
            )
            .await?
            .iter()
            .map(|r| Ok((r.text("tenant")?, r.uuid("suspension_id")?)))
            .collect()
    }
}
