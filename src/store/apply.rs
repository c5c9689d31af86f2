//! Committing the engine's change sets: the fence, the run's update, the ops, and the
//! observations with their gap-free seqs, all or nothing. The batch is taken apart once
//! (`fragments::Commit`) and its rows mapped once (`tables.rs`); each dialect then commits it
//! its fastest way: one statement on Postgres (`postgres::one_statement`, else the transaction
//! below), one call in a shared transaction on SQLite (`sqlite::one_call`, `group.rs`). Also here:
//! appending observations inside another write (a cancel, a resolution). A commit that ends or
//! suspends a run writes its webhook outbox row in the same statement or transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::fragments::{
    ANNOUNCED, Commit, RUN_UPDATE, bind_fence, copy_items, copy_state, outbox_insert,
};
use super::history;
use super::rows;
use super::sql::{Conn, Raw, q};
use super::sql_store::{Db, SqlStore};
use super::tables::{
    AGENT_STATE, MESSAGES, SUSPENSIONS, TODO_ITEMS, item_cols, message_cols_at, state_cols,
    suspension_cols,
};
use super::threads::lock_thread;
use super::{Applied, Batch, Fence, Op, Signal, StoreError, StoreResult};
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
    let n = count(&new)?;
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
    insert_observations(conn, tenant, thread_id, last - n + 1, now, &new).await?;
    history::record_append(conn, tenant, thread_id, last).await?;
    Ok(rows::committed(
        tenant,
        thread_id,
        last - n + 1,
        rows::micros(now),
        new,
    ))
}

fn count(new: &[NewObservation]) -> StoreResult<i64> {
    i64::try_from(new.len()).map_err(|e| StoreError::Decode(e.to_string()))
}

/// Insert observations whose seqs were reserved: `first_seq..first_seq + n` (how a list is
/// bound is the dialect's).
async fn insert_observations(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    first_seq: i64,
    created_at: DateTime<Utc>,
    new: &[NewObservation],
) -> StoreResult<()> {
    if new.is_empty() {
        return Ok(());
    }
    let origin = conn.origin().to_owned();
    match conn.raw() {
        Raw::Pg(c) => {
            super::postgres::insert_observations(
                c, &origin, tenant, thread_id, first_seq, created_at, new,
            )
            .await
        }
        Raw::Lite(c) => {
            super::sqlite::insert_observations(c, tenant, thread_id, first_seq, created_at, new)
                .await
        }
    }
}

/// Run one op of a batch inside the apply transaction, with its history: each state row written
/// gets its version at `seq`, the commit's last seq (a deleted item a tombstone, copied before
/// it goes), a message that seq, a suspension the seq that made it.
async fn apply_op(
    conn: &mut Conn,
    fence: Fence,
    tenant: &str,
    thread_id: &ThreadId,
    seq: i64,
    op: &Op,
) -> StoreResult<()> {
    let version = |sql: String| q(sql).bind(tenant).bind(thread_id.as_str()).bind(seq);
    match op {
        Op::SetAgentState(s) => {
            AGENT_STATE
                .write(conn, tenant, thread_id, state_cols(s))
                .await?;
            conn.exec(version(copy_state("$1", "$2", "$3", ""))).await?;
        }
        Op::UpsertItem(item) => {
            TODO_ITEMS
                .write(conn, tenant, thread_id, item_cols(item)?)
                .await?;
            let copy = copy_items("$1", "$2", "item_id = $4", "$3", false, "");
            conn.exec(version(copy).bind(item.id.as_str())).await?;
        }
        Op::DeleteItem(id) => {
            let copy = copy_items("$1", "$2", "item_id = $4", "$3", true, "");
            conn.exec(version(copy).bind(id.as_str())).await?;
            conn.exec(
                q("DELETE FROM todo_items WHERE tenant = $1 AND thread_id = $2 AND item_id = $3")
                    .bind(tenant)
                    .bind(thread_id.as_str())
                    .bind(id.as_str()),
            )
            .await?;
        }
        Op::AppendMessage(m) => {
            MESSAGES
                .write(conn, tenant, thread_id, message_cols_at(m, Some(seq))?)
                .await?;
        }
        // Applied by the fence statement, with the lease check.
        Op::UpdateRun(_) => {}
        Op::InsertSuspension(s) => {
            SUSPENSIONS
                .write(conn, tenant, thread_id, suspension_cols(s)?)
                .await?;
            conn.exec(
                q("UPDATE suspensions SET created_seq = $2 WHERE suspension_id = $1")
                    .bind(s.suspension_id)
                    .bind(seq),
            )
            .await?;
        }
        Op::CancelSuspensions => {
            conn.exec(q(CANCEL_RUN_SUSPENSIONS).bind(fence.run_id).bind(seq))
                .await?;
        }
    }
    Ok(())
}

/// Resolve run `$1`'s pending suspensions as cancelled by the commit that ends at seq `$2`.
pub(crate) const CANCEL_RUN_SUSPENSIONS: &str = "UPDATE suspensions SET status = 'cancelled', \
    resolved_at = {now}, resolved_seq = $2 WHERE run_id = $1 AND status = 'pending'";

impl SqlStore {
    /// Commit a batch under the run's fence, extending its lease.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] (nothing is written) when the fence does not match a running run.
    pub async fn apply(&self, fence: Fence, lease: Duration, batch: Batch) -> StoreResult<Applied> {
        let Batch {
            tenant,
            thread_id,
            ops,
            observations,
        } = batch;
        // The run's own update (a batch holds at most one: `Batch::op` merges them) rides on the
        // fence statement instead of costing a statement of its own.
        let update = ops
            .iter()
            .find_map(|op| match op {
                Op::UpdateRun(u) => Some(u.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let c = Commit {
            tenant: &tenant,
            thread_id: &thread_id,
            usage: rows::opt_json(update.usage.as_ref())?,
            error: rows::opt_json(update.error.as_ref())?,
            clear_lease: update.status.is_some_and(rows::clears_lease),
            announces: update
                .status
                .and_then(crate::model::WebhookEvent::for_status)
                .is_some(),
            update: &update,
            changed: history::changes_state(&ops),
            n: count(&observations)?,
            ops: &ops,
            observations: &observations,
        };
        // A commit that found no free connection wrote nothing: it waits its turn again rather
        // than stop the run (ten thousand runs whose model answers at once queue for a pool of a
        // few connections), for as long as its lease could still hold.
        let started = std::time::Instant::now();
        let (cancel_requested, last_seq, now) = loop {
            match self.commit_once(fence, lease, &c).await {
                Err(StoreError::Database(sqlx::Error::PoolTimedOut))
                    if started.elapsed() < lease =>
                {
                    tracing::debug!("no free database connection for a commit; waiting again");
                }
                done => break done?,
            }
        };
        if c.announces {
            self.webhook_written();
        }
        Ok(Applied {
            observations: rows::committed(
                &tenant,
                &thread_id,
                last_seq - c.n + 1,
                rows::micros(now),
                observations,
            ),
            cancel_requested,
        })
    }

    /// One attempt at a commit: the common one-statement (Postgres) or one-call (SQLite) way,
    /// else statement by statement.
    async fn commit_once(
        &self,
        fence: Fence,
        lease: Duration,
        c: &Commit<'_>,
    ) -> StoreResult<(bool, i64, DateTime<Utc>)> {
        Ok(match &self.db {
            Db::Pg(_) => match super::postgres::one_statement(&self.origin, fence, lease, c)? {
                // The common case on Postgres: one round trip, no BEGIN or COMMIT.
                Some(stmt) => {
                    let mut conn = self.write_one().await?;
                    let row = conn.opt(stmt).await?.ok_or(StoreError::LeaseLost)?;
                    let last_seq = row.opt_int("last_seq")?.unwrap_or(0);
                    (row.boolean("cancel_requested")?, last_seq, row.ts("now")?)
                }
                None => self.commit_in_transaction(fence, lease, c).await?,
            },
            Db::Lite { .. } => {
                // One call to the connection's thread, between a BEGIN and a COMMIT it may share with
                // other runs' batches (`group.rs`).
                let now = rows::micros(Utc::now());
                let stmt = super::sqlite::one_call(fence, lease, c, now)?;
                let (cancel_requested, last_seq) = self.group.commit(stmt, || self.write()).await?;
                (cancel_requested, last_seq, now)
            }
        })
    }

    /// Postgres, for the batches one statement cannot carry (see `postgres::one_statement`):
    /// statement by statement in one transaction; the run's `cancel_requested`, the last seq
    /// reserved and the commit's time. (SQLite commits every batch as one call, `group.rs`.)
    async fn commit_in_transaction(
        &self,
        fence: Fence,
        lease: Duration,
        c: &Commit<'_>,
    ) -> StoreResult<(bool, i64, DateTime<Utc>)> {
        let (tenant, thread_id, n) = (c.tenant, c.thread_id, c.n);
        let mut tx = self.write().await?;
        if !c.update.unless_decided.is_empty() {
            // A suspend that must see every decision committed before it: take the thread lock
            // first (a resolver holds it while it decides), so the statement below starts with a
            // snapshot taken after any such decision. (Inside one statement that waited for the
            // lock, the EXISTS would still read the snapshot from before the wait.)
            lock_thread(&mut tx, tenant, thread_id).await?;
        }
        // One round trip: reserve the seqs on the thread row (thread first: lock order), then
        // check the fence and update the run.
        let fenced = q(format!(
            "WITH t AS (UPDATE threads SET last_seq = last_seq + $14, \
               updated_at = CASE WHEN $14 > 0 THEN now() ELSE updated_at END \
             WHERE tenant = $12 AND thread_id = $13 RETURNING last_seq) \
             {RUN_UPDATE} AND EXISTS (SELECT 1 FROM t) \
             RETURNING cancel_requested, (SELECT last_seq FROM t) AS last_seq, now() AS now"
        ));
        // No row: the lease is gone; dropping `tx` rolls back (the counter too).
        let row = tx
            .opt(bind_fence(fenced, fence, lease, c))
            .await?
            .ok_or(StoreError::LeaseLost)?;
        let cancel_requested = row.boolean("cancel_requested")?;
        let now = row.ts("now")?;
        let last_seq = row.int("last_seq")?;
        for op in c.ops {
            apply_op(&mut tx, fence, tenant, thread_id, last_seq, op).await?;
        }
        if c.announces {
            // After the ops: a suspension this batch inserted is the one the event is about.
            let cond = format!("w.run_id = $1 AND {ANNOUNCED}");
            tx.exec(q(outbox_insert(tx.dialect(), "runs", &cond)).bind(fence.run_id))
                .await?;
        }
        if c.clear_lease {
            // The thread is free (or the run waits for a person): a queued run may start.
            tx.notify(&Signal::RunReady).await?;
        }
        insert_observations(
            &mut tx,
            tenant,
            thread_id,
            last_seq - n + 1,
            now,
            c.observations,
        )
        .await?;
        if n > 0 {
            // The commit's end, after the fence statement: the run's phase and usage as it
            // left them.
            history::mark_commit_end(
                &mut tx,
                tenant,
                thread_id,
                last_seq,
                c.changed,
                Some(fence.run_id),
            )
            .await?;
        }
        tx.commit().await?;
        Ok((cancel_requested, last_seq, now))
    }
}
