//! What only SQLite does: opening the file (pragmas, one writer connection, readers), its claim
//! (writers are serialized, so no row locks), and inserting a list of observations. Everything
//! else is the shared logic of [`SqlStore`].
//!
//! SQLite has one writer. Writes go through a pool of **one** connection and every write
//! transaction starts with `BEGIN IMMEDIATE` (see [`SqlStore::write`]). Reads use a separate pool
//! and see committed data (WAL). Because writers are serialized, the seq counter
//! (`threads.last_seq`), fences and claims need no row locks.
//!
//! Storage conventions: ids are hyphenated UUID text, JSON is text, timestamps are text in the
//! fixed-width UTC format [`rows::SQLITE_TS_FORMAT`] (text order is time order); the clock is
//! SQLite's own (`'now'`, which keeps milliseconds).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use super::leases::{CLAIM, EXPIRED_CANDIDATES, lease_secs, queued_candidates};
use super::rows::{self, Cols};
use super::sql::{Conn, id_text, q};
use super::sql_store::{Db, SqlStore};
use super::{Claim, StoreError, StoreResult};
use crate::model::{NewObservation, ThreadId};

/// The embedded SQLite migrations (`migrations/sqlite`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// Whether any running run's lease expired, when the earliest lease still in the future runs
/// out, and the time it was asked.
const LEASES: &str = "SELECT COALESCE(MAX(lease_expires_at < {now}), 0) AS any_expired, \
    MIN(CASE WHEN lease_expires_at >= {now} THEN lease_expires_at END) AS next_expiry, \
    {now} AS now FROM runs WHERE status = 'running'";

/// Opens the store on an SQLite file (or in memory).
#[derive(Debug, Clone, Copy)]
pub struct SqliteStore;

/// Is this URL an in-memory database?
fn is_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

impl SqliteStore {
    /// Open (creating the file and its folder when missing) the database at `url`:
    /// `sqlite://relative/path.db`, `sqlite:///absolute/path.db` or `sqlite::memory:`.
    /// Every connection gets `foreign_keys=ON`, `busy_timeout`, and for files WAL with
    /// `synchronous=NORMAL`. Does not migrate.
    ///
    /// # Errors
    /// [`StoreError::Database`] for a malformed URL, a folder that cannot be created or a
    /// database that cannot be opened.
    pub async fn connect(url: &str) -> StoreResult<SqlStore> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        if is_memory(url) {
            // The database lives as long as a connection to it: keep exactly one, forever.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(options)
                .await?;
            return Ok(SqlStore::new(Db::Lite {
                writer: pool.clone(),
                reader: pool,
            }));
        }
        if let Some(dir) = options.get_filename().parent()
            && !dir.as_os_str().is_empty()
        {
            create_folder(dir)?;
        }
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        Ok(SqlStore::new(Db::Lite { writer, reader }))
    }
}

fn create_folder(path: &Path) -> StoreResult<()> {
    std::fs::create_dir_all(path).map_err(|e| {
        StoreError::Database(sqlx::Error::Configuration(
            format!("cannot create the database folder {}: {e}", path.display()).into(),
        ))
    })
}

/// Runs the embedded migrations on the writer connection (the only writer of the process).
pub(crate) async fn migrate(writer: &SqlitePool) -> StoreResult<()> {
    MIGRATOR.run(writer).await?;
    Ok(())
}

/// Insert observations whose seqs were reserved: one multi-row `INSERT` (SQLite caps a
/// statement's parameters, so very long lists go in chunks).
pub(crate) async fn insert_observations(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
    first_seq: i64,
    created_at: DateTime<Utc>,
    new: &[NewObservation],
) -> StoreResult<()> {
    const COLUMNS: usize = 10;
    const ROWS_PER_STATEMENT: usize = 500;
    let created_at = rows::ts_text(created_at);
    for (chunk_no, chunk) in new.chunks(ROWS_PER_STATEMENT).enumerate() {
        let mut sql = String::from(
            "INSERT INTO observations \
             (tenant, thread_id, seq, id, run_id, parent_id, type, title, content, created_at) \
             VALUES ",
        );
        for i in 0..chunk.len() {
            let p = i * COLUMNS;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for c in 1..=COLUMNS {
                if c > 1 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("${}", p + c));
            }
            sql.push(')');
        }
        let mut query = sqlx::query(&sql);
        let first = first_seq + (chunk_no * ROWS_PER_STATEMENT) as i64;
        for (o, seq) in chunk.iter().zip(first..) {
            query = query
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(seq)
                .bind(id_text(o.id))
                .bind(o.run_id.map(id_text))
                .bind(o.parent_id.as_deref())
                .bind(o.kind.as_str())
                .bind(o.title.as_str())
                .bind(o.content.to_string())
                .bind(created_at.as_str());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Claim up to `max` runs in the write transaction `tx`: expired leases first (the statement is
/// skipped when none is, the idle case), then queued runs.
pub(crate) async fn claim_runs(
    mut tx: Conn,
    owner: &str,
    lease: Duration,
    max: usize,
) -> StoreResult<Claim> {
    let leases = tx.one(q(LEASES)).await?;
    let now = leases.ts("now")?;
    let next_expiry = leases
        .opt_ts("next_expiry")?
        .map(|t| (t - now).to_std().unwrap_or(Duration::ZERO));
    let mut runs = Vec::new();
    let expired = format!("{CLAIM} WHERE run_id IN ({EXPIRED_CANDIDATES}) RETURNING *");
    let queued = format!(
        "{CLAIM} WHERE run_id IN ({}) RETURNING *",
        queued_candidates("0")
    );
    let kinds = [(leases.boolean("any_expired")?, expired), (true, queued)];
    for (wanted, sql) in kinds {
        let left = max.saturating_sub(runs.len());
        if !wanted || left == 0 {
            continue;
        }
        let claimed = tx
            .all(
                q(sql)
                    .bind(owner)
                    .bind(lease_secs(lease))
                    .bind(i64::try_from(left).unwrap_or(i64::MAX)),
            )
            .await?;
        for row in &claimed {
            runs.push(rows::run_from_row(row)?);
        }
    }
    tx.commit().await?;
    Ok(Claim { runs, next_expiry })
}
