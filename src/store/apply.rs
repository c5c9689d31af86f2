//! Committing the engine's change sets, all or nothing: [`SqlStore::apply`]. What a commit
//! writes is described once (`commit.rs`: the fence and the run's update, the rows, their
//! history versions, the observations with their gap-free seqs, the webhook outbox row); each
//! dialect renders it its fastest way and this file runs it: one statement on Postgres
//! (`postgres::commit_statement`; after the thread's lock, in a transaction, for a suspend that
//! must see decisions taken meanwhile), one call in a transaction shared with other runs' calls
//! on SQLite (`sqlite::commit_call`, `group.rs`). Also here: appending observations inside
//! another write (a cancel, a resolution, a steering message, a fork).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::commit::Commit;
use super::history;
use super::rows;
use super::sql::{Conn, Raw, q};
use super::sql_store::{Db, SqlStore};
use super::threads::lock_thread;
use super::{Applied, Batch, Fence, StoreError, StoreResult};
use crate::model::{NewObservation, Observation, ThreadId};

/// Reserve `$3` seqs on the thread row (the row lock serializes appenders of one thread; a
/// rollback takes the counter back with it).
const RESERVE_SEQS: &str = "UPDATE threads SET last_seq = last_seq + $3, updated_at = {now} \
    WHERE tenant = $1 AND thread_id = $2 RETURNING last_seq, {now} AS now";

/// Append observations inside the caller's transaction: reserve their seqs on the thread row,
/// then insert them. The caller commits.
pub(crate) async fn append_observations(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    new: Vec<NewObservation>,
) -> StoreResult<Vec<Observation>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let n = i64::try_from(new.len()).map_err(|e| StoreError::Decode(e.to_string()))?;
    let row = conn
        .opt(
            q(RESERVE_SEQS)
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(n),
        )
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
    let (last, now) = (row.int("last_seq")?, row.ts("now")?);
    let first = last - n + 1;
    let origin = conn.origin().to_owned();
    // How a list is bound is the dialect's.
    match conn.raw() {
        Raw::Pg(c) => {
            super::postgres::insert_observations(c, &origin, tenant, thread_id, first, now, &new)
                .await?;
        }
        Raw::Lite(c) => {
            super::sqlite::insert_observations(c, tenant, thread_id, first, now, &new).await?;
        }
    }
    history::record_append(conn, tenant, thread_id, last).await?;
    Ok(rows::committed(
        tenant,
        thread_id,
        first,
        rows::micros(now),
        new,
    ))
}

impl SqlStore {
    /// Commit a batch under the run's fence, extending its lease.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] (nothing is written) when the fence does not match a running run.
    pub async fn apply(&self, fence: Fence, lease: Duration, batch: Batch) -> StoreResult<Applied> {
        let c = Commit::new(fence, lease, &batch)?;
        // A commit that found no free connection wrote nothing: it waits its turn again rather
        // than stop the run (ten thousand runs whose model answers at once queue for a pool of a
        // few connections), for as long as its lease could still hold.
        let started = std::time::Instant::now();
        let (cancel_requested, last_seq, now) = loop {
            match self.commit_once(&c).await {
                Err(StoreError::Database(sqlx::Error::PoolTimedOut))
                    if started.elapsed() < lease =>
                {
                    tracing::debug!("no free database connection for a commit; waiting again");
                }
                done => break done?,
            }
        };
        let (announces, n) = (c.announces, c.n);
        drop(c);
        if announces {
            self.webhook_written();
        }
        Ok(Applied {
            observations: rows::committed(
                &batch.tenant,
                &batch.thread_id,
                last_seq - n + 1,
                rows::micros(now),
                batch.observations,
            ),
            cancel_requested,
        })
    }

    /// One attempt at a commit, the backend's way: the run's `cancel_requested`, the last seq
    /// reserved and the commit's time.
    async fn commit_once(&self, c: &Commit<'_>) -> StoreResult<(bool, i64, DateTime<Utc>)> {
        Ok(match &self.db {
            Db::Pg(_) => {
                let stmt = super::postgres::commit_statement(&self.origin, c);
                let row = if c.waits_for_decisions() {
                    // The thread's lock first (a resolver holds it while it decides), so the
                    // statement's snapshot is taken after any such decision.
                    let mut tx = self.write().await?;
                    lock_thread(&mut tx, c.tenant, c.thread_id).await?;
                    // No row: the lease is gone; dropping `tx` rolls back.
                    let row = tx.opt(stmt).await?.ok_or(StoreError::LeaseLost)?;
                    tx.commit().await?;
                    row
                } else {
                    // The common case: one round trip, no BEGIN or COMMIT.
                    let mut conn = self.write_one().await?;
                    conn.opt(stmt).await?.ok_or(StoreError::LeaseLost)?
                };
                let last_seq = row.opt_int("last_seq")?.unwrap_or(0);
                (row.boolean("cancel_requested")?, last_seq, row.ts("now")?)
            }
            Db::Lite { .. } => {
                // One call to the connection's thread, between a BEGIN and a COMMIT it may share
                // with other runs' batches (`group.rs`).
                let now = rows::micros(Utc::now());
                let stmt = super::sqlite::commit_call(c, now);
                let (cancel_requested, last_seq) = self.group.commit(stmt, || self.write()).await?;
                (cancel_requested, last_seq, now)
            }
        })
    }
}
