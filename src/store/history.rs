//! Thread history: what every commit records so that any past state can be read,
//! and reading it. Every commit that hands out seqs marks its last observation as its end
//! (`observations.commit_changed`: whether it changed the state; `commit_phase`/`commit_usage`:
//! its run's phase and usage after it, what a fork continues from); every write of a state row
//! also writes a version of that row keyed by the same seq (`agent_state_versions`,
//! `todo_item_versions`, a deleted item as a tombstone); a message carries the seq of the commit
//! that wrote it, a suspension the seqs that made and ended it. A past state is then the newest
//! version of each row at or before the commit that holds the asked-for seq: a few index probes
//! whatever the length of the thread, with no replay.
//!
//! Why the commit's end is marked on its observation rather than in a table of commits: the
//! observation is written anyway, and a row more per commit cost W3 throughput (history may
//! cost it 5 % at most); the history tables hold no foreign key for the same reason.
//!
//! Why versions and not snapshots or a change log: a snapshot per commit writes every item at
//! every commit (a plan of forty items, forty rows per commit), and a log of changes needs
//! checkpoints and a replay to read a state. A version is written only for the rows a commit
//! touches, which the commit writes anyway, and it is read back by its key.
//!
//! What a commit writes for history is SQL below the store, which the dialects' commits use
//! (`fragments::copy_items` and `copy_state`); here are the bookkeeping of writes made outside
//! the engine's batches (`record_append`, used by `append_observations`), reading a past state,
//! and the list of points. Forks, which copy a prefix of all this, are in `forks.rs`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::rows;
use super::sql::{Arg, Conn, Dialect, q};
use super::sql_store::SqlStore;
use super::tables::item_view_columns;
use super::{AgentSnapshot, StoreError, StoreResult};
use crate::model::{AgentStateRow, SuspensionStatus, ThreadId};

/// Mark observation `last` as the end of its commit (inside the commit's transaction, after the
/// observation was inserted): `changed` says whether the commit changed the state; the phase
/// and usage are those of `run` as the commit left it (none for a commit outside the engine).
pub(crate) async fn mark_commit_end(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    last: i64,
    changed: bool,
    run: Option<Uuid>,
) -> StoreResult<()> {
    conn.exec(
        q("UPDATE observations SET commit_changed = $4, \
             commit_phase = (SELECT phase FROM runs WHERE run_id = $5), \
             commit_usage = (SELECT usage FROM runs WHERE run_id = $5) \
           WHERE tenant = $1 AND thread_id = $2 AND seq = $3")
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(last)
        .bind(changed)
        .bind(run),
    )
    .await?;
    Ok(())
}

/// The history bookkeeping of a commit made outside the engine's batches (a cancel, a decision,
/// an expiry, a steering message, runs displaced by a new one), inside its transaction, after
/// the seqs `..=last` were reserved and their observations inserted: the suspensions this
/// transaction ended get `last` as the seq that ended them, and `last` is marked as the
/// commit's end (changed when it ended one).
pub(crate) async fn record_append(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    last: i64,
) -> StoreResult<()> {
    let ended = conn
        .exec(
            q(
                "UPDATE suspensions SET resolved_seq = $3 WHERE tenant = $1 AND thread_id = $2 \
               AND status <> 'pending' AND resolved_seq IS NULL",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(last),
        )
        .await?;
    mark_commit_end(conn, tenant, thread_id, last, ended > 0, None).await
}

/// Delete a thread's history rows, in the transaction that deletes the thread: on Postgres the
/// history tables hold no foreign key to `threads` (a referential check on every commit cost
/// W3 throughput), so the thread's delete does not cascade to them.
pub(crate) async fn delete_history(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
) -> StoreResult<()> {
    for table in ["agent_state_versions", "todo_item_versions"] {
        conn.exec(
            q(format!(
                "DELETE FROM {table} WHERE tenant = $1 AND thread_id = $2"
            ))
            .bind(tenant)
            .bind(thread_id.as_str()),
        )
        .await?;
    }
    Ok(())
}

/// A point of a thread's history: a commit that changed its state.
#[derive(Debug, Clone)]
pub struct HistoryPoint {
    /// The commit's last observation: read the state there with `state?atSeq=`.
    pub seq: i64,
    pub run_id: Option<Uuid>,
    /// The type of observation `seq`.
    pub kind: String,
    pub created_at: DateTime<Utc>,
}

/// A past state, as [`SqlStore::state_at`] reads it.
#[derive(Debug, Clone)]
pub struct PastState {
    pub snapshot: AgentSnapshot,
    /// The seq the state is read at: the last observation of the commit that holds the seq
    /// asked for (a commit is atomic: its observations share one state).
    pub seq: i64,
}

/// Why a past state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PastError {
    #[error("seq {asked} is past the thread's last observation ({last})")]
    OutOfRange { asked: i64, last: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The last seq of the commit that holds observation `seq`: a commit is atomic, so every seq
/// inside it reads the state after it. A seq no commit end covers (threads from before history
/// began, or 0) is its own end.
pub(crate) async fn commit_end(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    seq: i64,
) -> StoreResult<i64> {
    if seq <= 0 {
        return Ok(0);
    }
    let row = conn
        .opt(
            q(
                "SELECT seq FROM observations WHERE tenant = $1 AND thread_id = $2 \
                 AND seq >= $3 AND commit_changed IS NOT NULL ORDER BY seq LIMIT 1",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(seq),
        )
        .await?;
    Ok(row.map(|r| r.int("seq")).transpose()?.unwrap_or(seq))
}

/// SQLite: the live items of thread `$2` right after `$3`, read with `{columns}` from `x`: the
/// key of the newest version of each item at or before `$3`, from the primary key's index alone
/// (it holds every key column), then each of those versions by its key, tombstones left out.
/// (Picking the newest of whole rows read every version's every column, conversations
/// included.)
fn newest_items_sqlite(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM (SELECT item_id, max(seq) AS seq FROM todo_item_versions \
           WHERE tenant = $1 AND thread_id = $2 AND seq <= $3 GROUP BY item_id) k \
         JOIN todo_item_versions x ON x.tenant = $1 AND x.thread_id = $2 \
           AND x.item_id = k.item_id AND x.seq = k.seq \
         WHERE NOT x.deleted"
    )
}

/// Postgres, step one: the key of the newest version of each item at or before `$3`, from the
/// key columns only (a sort of whole versions spilled to disk at 10,000 observations), which the
/// primary key holds (an index-only scan once the table is vacuumed); tombstones are among
/// them, left out by step two.
const LATEST_KEYS_PG: &str = "SELECT DISTINCT ON (item_id) item_id, seq \
    FROM todo_item_versions WHERE tenant = $1 AND thread_id = $2 AND seq <= $3 \
    ORDER BY item_id, seq DESC";

/// Postgres, step two: the live versions (not tombstones) with the keys `$3`/`$4` (parallel
/// arrays), each found by its primary key, read with `{columns}`. Two statements rather than one
/// join, so that the plan cannot depend on statistics: as one statement, a generic plan on a
/// table not yet analyzed joined every item with every version of the thread (seconds at 10,000
/// observations).
fn items_by_key_pg(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM UNNEST($3::text[], $4::text[]) AS k(item_id, seq) \
         JOIN todo_item_versions v ON v.tenant = $1 AND v.thread_id = $2 \
           AND v.item_id = k.item_id AND v.seq = k.seq::bigint AND NOT v.deleted"
    )
}

/// The items of a thread right after commit `end` as the state view shows them (without their
/// conversations), in no particular order: the newest version of each at or before it, deleted
/// ones left out. (`forks.rs` copies the same rows whole, picked by [`latest_items_from`].)
pub(crate) async fn items_at(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    end: i64,
) -> StoreResult<Vec<super::sql::Row>> {
    match conn.dialect() {
        Dialect::Sqlite => {
            let rows = conn
                .all(
                    q(newest_items_sqlite(&item_view_columns(
                        Dialect::Sqlite,
                        "x",
                    )))
                    .bind(tenant)
                    .bind(thread_id.as_str())
                    .bind(end),
                )
                .await?;
            Ok(rows)
        }
        Dialect::Postgres => {
            let (ids, seqs) = newest_keys(conn, tenant, thread_id, end).await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let columns = item_view_columns(Dialect::Postgres, "v");
            conn.all(
                q(items_by_key_pg(&columns))
                    .bind(tenant)
                    .bind(thread_id.as_str())
                    .bind(Arg::Texts(ids))
                    .bind(Arg::Texts(seqs)),
            )
            .await
        }
    }
}

/// Postgres: the keys (item ids, seqs as text) of the newest version of each item at or before
/// `end`, tombstones included (their readers leave them out).
async fn newest_keys(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    end: i64,
) -> StoreResult<(Vec<String>, Vec<String>)> {
    let keys = conn
        .all(
            q(LATEST_KEYS_PG)
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(end),
        )
        .await?;
    let mut ids = Vec::with_capacity(keys.len());
    let mut seqs = Vec::with_capacity(keys.len());
    for k in &keys {
        ids.push(k.text("item_id")?);
        seqs.push(k.int("seq")?.to_string());
    }
    Ok((ids, seqs))
}

/// A `FROM` source of the live item versions of thread `$2` at or before `$3` for an
/// `INSERT … SELECT` (forks), with what it needs bound after `$3`: on Postgres the keys of
/// [`newest_keys`] as `$4`/`$5` … numbered from `first`.
pub(crate) async fn latest_items_from(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    end: i64,
    first: usize,
) -> StoreResult<(String, Vec<Arg>)> {
    Ok(match conn.dialect() {
        Dialect::Sqlite => (format!("({})", newest_items_sqlite("x.*")), Vec::new()),
        Dialect::Postgres => {
            let (ids, seqs) = newest_keys(conn, tenant, thread_id, end).await?;
            (
                format!(
                    "(SELECT x.* FROM UNNEST(${first}::text[], ${}::text[]) AS k(item_id, seq) \
                     JOIN todo_item_versions x ON x.tenant = $1 AND x.thread_id = $2 \
                       AND x.item_id = k.item_id AND x.seq = k.seq::bigint AND x.seq <= $3 \
                       AND NOT x.deleted)",
                    first + 1
                ),
                vec![Arg::Texts(ids), Arg::Texts(seqs)],
            )
        }
    })
}

/// The agent state row at or before `$3`.
pub(crate) const STATE_AT: &str = "SELECT * FROM agent_state_versions \
    WHERE tenant = $1 AND thread_id = $2 AND seq <= $3 ORDER BY seq DESC LIMIT 1";

/// The suspensions pending right after `$3`: made at or before it, ended after it or not yet.
pub(crate) const PENDING_AT: &str = "SELECT * FROM suspensions \
    WHERE tenant = $1 AND thread_id = $2 AND created_seq <= $3 \
      AND (resolved_seq IS NULL OR resolved_seq > $3) \
    ORDER BY created_at DESC, suspension_id DESC";

/// The state of a thread right after commit `end` (see [`commit_end`]), read on `conn`.
pub(crate) async fn snapshot_at(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    end: i64,
) -> StoreResult<AgentSnapshot> {
    let key = |sql: &'static str| q(sql).bind(tenant).bind(thread_id.as_str()).bind(end);
    let state = match conn.opt(key(STATE_AT)).await? {
        Some(row) => rows::agent_state_from_row(&row)?,
        None => AgentStateRow::default(),
    };
    let mut items = items_at(conn, tenant, thread_id, end)
        .await?
        .iter()
        .map(rows::item_from_row)
        .collect::<StoreResult<Vec<_>>>()?;
    // In plan order, as the present state is.
    items.sort_by(|a, b| (a.position, a.id.as_str()).cmp(&(b.position, b.id.as_str())));
    let pending = conn.all(key(PENDING_AT)).await?;
    let pending_suspension = match pending.first() {
        Some(row) => {
            // As it was then: waiting for a decision.
            let mut s = rows::suspension_from_row(row)?;
            s.status = SuspensionStatus::Pending;
            s.decision = None;
            s.resolved_at = None;
            Some(s)
        }
        None => None,
    };
    Ok(AgentSnapshot {
        state,
        items,
        pending_suspension,
    })
}

impl SqlStore {
    /// The thread's state right after observation `seq` was committed; `None` when the thread
    /// does not exist.
    ///
    /// # Errors
    /// [`PastError::OutOfRange`] when `seq` is past the thread's last observation.
    pub async fn state_at(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        seq: i64,
    ) -> Result<Option<PastState>, PastError> {
        // One snapshot for every read.
        let mut tx = self.snapshot().await?;
        let Some(row) = tx
            .opt(
                q(
                    "SELECT last_seq FROM threads WHERE tenant = $1 AND thread_id = $2 \
                   AND NOT copying",
                )
                .bind(tenant)
                .bind(thread_id.as_str()),
            )
            .await?
        else {
            return Ok(None);
        };
        let last = row.int("last_seq")?;
        if seq > last {
            return Err(PastError::OutOfRange { asked: seq, last });
        }
        let end = commit_end(&mut tx, tenant, thread_id, seq).await?;
        let snapshot = snapshot_at(&mut tx, tenant, thread_id, end).await?;
        tx.commit().await?;
        Ok(Some(PastState { snapshot, seq: end }))
    }

    /// The points a past state can be read at, newest first: at most `limit` commits that
    /// changed the state, before seq `before` when given; `None` when the thread does not exist.
    pub async fn history(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        before: Option<i64>,
    ) -> StoreResult<Option<Vec<HistoryPoint>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        let found = self
            .read()
            .await?
            .all(
                q("SELECT seq, run_id, type, created_at FROM observations \
                   WHERE tenant = $1 AND thread_id = $2 AND commit_changed AND seq < $3 \
                   ORDER BY seq DESC LIMIT $4")
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(before.unwrap_or(i64::MAX))
                .bind(rows::sql_limit(limit)),
            )
            .await?;
        found
            .iter()
            .map(|r| {
                Ok(HistoryPoint {
                    seq: r.int("seq")?,
                    run_id: r.opt_uuid("run_id")?,
                    kind: r.text("type")?,
                    created_at: r.ts("created_at")?,
                })
            })
            .collect::<StoreResult<_>>()
            .map(Some)
    }
}
