//! What only SQLite does: opening the file (pragmas, one writer connection, readers), its claim
//! (writers are serialized, so no row locks), the commit as one call, and inserting a list of
//! observations. A layer below [`super::SqlStore`] that knows nothing of it: functions over pools
//! or a [`Conn`], which the store's methods call; everything else is the store's shared logic.
//!
//! SQLite has one writer. Writes go through a pool of **one** connection and every write
//! transaction starts with `BEGIN IMMEDIATE` (see `SqlStore::write`). Reads use a separate pool
//! and see committed data (WAL). Because writers are serialized, the seq counter
//! (`threads.last_seq`), fences and claims need no row locks.
//!
//! Storage conventions: ids are hyphenated UUID text, JSON is text, timestamps are text in the
//! fixed-width UTC format `sql::SQLITE_TS_FORMAT` (text order is time order); the clock is
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

use super::commit::{AtCommit, Commit, Versions, bind_fence};
use super::fragments::{
    ANNOUNCED, RUN_UPDATE, cancel_suspensions, copy_items, copy_state, flag, outbox_insert,
};
use super::fragments::{CLAIM, EXPIRED_CANDIDATES, lease_secs, queued_candidates};
use super::rows;
use super::sql::{Arg, Conn, Dialect, Q, id_text, q};
use super::{Claim, StoreError, StoreResult};
use crate::model::{NewObservation, ThreadId};

/// The embedded SQLite migrations (`migrations/sqlite`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// Whether any running run's lease expired, when the earliest lease still in the future runs
/// out, and the time it was asked.
const LEASES: &str = "SELECT COALESCE(MAX(lease_expires_at < {now}), 0) AS any_expired, \
    MIN(CASE WHEN lease_expires_at >= {now} THEN lease_expires_at END) AS next_expiry, \
    {now} AS now FROM runs WHERE status = 'running'";

/// Prepared statements the writer connection keeps (sqlx's default is 100).
const WRITER_STATEMENTS: usize = 2048;

/// Opens the store on an SQLite file (or in memory): [`SqliteStore::connect`] builds the
/// [`super::SqlStore`] (in `sql_store.rs`, above this file) on the pools of [`pools`].
#[derive(Debug, Clone, Copy)]
pub struct SqliteStore;

/// Is this URL an in-memory database?
fn is_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// The writer pool (exactly one connection) and the readers' pool of the database at `url`
/// (the same pool for an in-memory database, which lives as long as its one connection), as
/// [`SqliteStore::connect`] documents them. Does not migrate.
pub(crate) async fn pools(url: &str) -> StoreResult<(SqlitePool, SqlitePool)> {
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
        return Ok((pool.clone(), pool));
    }
    if let Some(dir) = options.get_filename().parent()
        && !dir.as_os_str().is_empty()
    {
        create_folder(dir)?;
    }
    let options = options
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    // A commit is one call whose SQL depends on the batch's ops (one statement each): keep
    // many prepared, so the one writer does not prepare them again and again.
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.clone().statement_cache_capacity(WRITER_STATEMENTS))
        .await?;
    let reader = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    Ok((writer, reader))
}

/// Create the database's folder when missing and check that this process can write in it (SQLite
/// writes the database, its `-wal` and `-shm` files there). The error names the folder and what to
/// do, instead of SQLite's "unable to open database file".
fn create_folder(path: &Path) -> StoreResult<()> {
    let unusable = |what: &str, e: std::io::Error| {
        StoreError::Database(sqlx::Error::Configuration(
            format!(
                "the database folder {} {what} ({e}): make it a folder the service's user may \
                 write in (in the container: the volume at /var/lib/pes/data must be writable by \
                 uid 10001), or point PES_DATABASE_URL at one",
                path.display()
            )
            .into(),
        ))
    };
    std::fs::create_dir_all(path).map_err(|e| unusable("cannot be created", e))?;
    // Permission bits say nothing for root, nor about read-only mounts: try it.
    let probe = path.join(format!(".pes-write-check-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .map_err(|e| unusable("is not writable", e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
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
    served: &str,
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
    let kinds = [
        (leases.boolean("any_expired")?, expired, true),
        (true, queued, false),
    ];
    let mut taken_over = 0;
    for (wanted, sql, expired) in kinds {
        let left = max.saturating_sub(runs.len());
        if !wanted || left == 0 {
            continue;
        }
        let stmt = q(sql)
            .bind(owner)
            .bind(lease_secs(lease))
            .bind(i64::try_from(left).unwrap_or(i64::MAX));
        // Only the queued pick reads `$4`, the tenants served last.
        let stmt = if expired { stmt } else { stmt.bind(served) };
        let claimed = tx.all(stmt).await?;
        if expired {
            taken_over += claimed.len();
        }
        for row in &claimed {
            runs.push(rows::run_from_row(row)?);
        }
    }
    tx.commit().await?;
    Ok(Claim {
        runs,
        next_expiry,
        taken_over,
    })
}

/// A [`Commit`] as one call to SQLite's connection thread: its statements, separated by `;`,
/// sharing one list of `$N` parameters (a call is one round trip to that thread, where every
/// statement of its own cost two thread switches). The caller runs it inside `BEGIN IMMEDIATE`,
/// maybe beside other runs' calls (`group.rs`), and commits.
///
/// Writers are serialized, so the fence can gate every write: each statement writes only while
/// the run is still `running` under this attempt, and the run's own update comes last and
/// returns the row that says the lease held (no row: nothing was written). The statements run
/// in order and each sees the ones before: the versions copy the rows as written, and the outbox
/// row finds a suspension this call inserted. Observations are stamped `created_at` (SQLite's
/// `'now'` would differ between statements).
pub(crate) fn commit_call(c: &Commit<'_>, created_at: DateTime<Utc>) -> Q {
    const HELD: &str = "EXISTS (SELECT 1 FROM runs WHERE run_id = $1 AND attempt = $2 \
        AND status = 'running' AND tenant = $12 AND thread_id = $13)";
    let mut sql = String::new();
    let mut extra: Vec<Arg> = Vec::new();
    let param = |extra: &mut Vec<Arg>, a: Arg| {
        extra.push(a);
        format!("${}", 14 + extra.len())
    };
    if c.n > 0 {
        sql.push_str(&format!(
            "UPDATE threads SET last_seq = last_seq + $14, updated_at = {{now}} \
             WHERE tenant = $12 AND thread_id = $13 AND {HELD};"
        ));
    }
    // The seq every history row of this commit carries: the commit's last observation (the
    // thread's counter was bumped by the first statement).
    const SEQ: &str = "(SELECT last_seq FROM threads WHERE tenant = $12 AND thread_id = $13)";
    let gate = format!(" AND {HELD}");
    for w in &c.writes {
        for row in &w.rows {
            let names: Vec<&'static str> = row.iter().map(|(c, _)| *c).collect();
            let values: Vec<String> = row
                .iter()
                .map(
                    |(col, a)| match w.at_commit.iter().find(|(k, _)| k == col) {
                        Some((_, AtCommit::Seq)) => SEQ.to_owned(),
                        Some((_, AtCommit::Now)) => "{now}".to_owned(),
                        None => param(&mut extra, a.clone()),
                    },
                )
                .collect();
            sql.push_str(&format!(
                "INSERT INTO {name} (tenant, thread_id, {cols}) SELECT $12, $13, {values} \
                 WHERE {HELD}{conflict};",
                name = w.table.name,
                cols = names.join(", "),
                values = values.join(", "),
                conflict = w.table.on_conflict(&names),
            ));
            match w.versions {
                Versions::None => {}
                Versions::State => {
                    sql.push_str(&copy_state("$12", "$13", SEQ, &gate));
                    sql.push(';');
                }
                Versions::Items => {
                    let id = row
                        .iter()
                        .find(|(c, _)| *c == "item_id")
                        .map_or(Arg::Text(None), |(_, a)| a.clone());
                    let filter = format!("item_id = {}", param(&mut extra, id));
                    sql.push_str(&copy_items("$12", "$13", &filter, SEQ, false, &gate));
                    sql.push(';');
                }
            }
        }
    }
    for id in &c.deleted {
        let p = param(&mut extra, id.as_str().into());
        // The tombstone first: it copies the row the delete removes.
        let filter = format!("item_id = {p}");
        sql.push_str(&copy_items("$12", "$13", &filter, SEQ, true, &gate));
        sql.push_str(&format!(
            "; DELETE FROM todo_items WHERE tenant = $12 AND thread_id = $13 \
             AND item_id = {p} AND {HELD};"
        ));
    }
    if c.cancel_suspensions {
        sql.push_str(&cancel_suspensions(SEQ, &gate));
        sql.push(';');
    }
    if c.n > 0 {
        let at = param(&mut extra, created_at.into());
        let last = c.observations.len();
        for (k, o) in (1..).zip(c.observations) {
            let values = [
                format!("{SEQ} - $14 + {k}"),
                param(&mut extra, o.id.into()),
                param(&mut extra, o.run_id.into()),
                param(&mut extra, o.parent_id.as_deref().into()),
                param(&mut extra, o.kind.as_str().into()),
                param(&mut extra, o.title.as_str().into()),
                param(&mut extra, o.content.clone().into()),
            ];
            // The commit's last observation marks its end (see `history.rs`), with the phase
            // and usage the run leaves: its new values, or the row's where it keeps them (its
            // update comes last).
            let end = if k == last {
                format!(
                    "{changed}, (SELECT COALESCE($5, phase) FROM runs WHERE run_id = $1), \
                     (SELECT COALESCE($6, usage) FROM runs WHERE run_id = $1)",
                    changed = flag(c.changed)
                )
            } else {
                "NULL, NULL, NULL".to_owned()
            };
            sql.push_str(&format!(
                "INSERT INTO observations \
                   (tenant, thread_id, seq, id, run_id, parent_id, type, title, content, \
                    created_at, commit_changed, commit_phase, commit_usage) \
                 SELECT $12, $13, {}, {at}, {end} WHERE {HELD};",
                values.join(", ")
            ));
        }
    }
    sql.push_str(&format!(
        "{RUN_UPDATE} RETURNING cancel_requested, {SEQ} AS last_seq"
    ));
    if c.announces {
        // After the run's update, gated by it: `changes()` is what that update changed (one
        // row when the fence held), so a lost lease writes no outbox row either.
        let cond = format!("w.run_id = $1 AND w.attempt = $2 AND changes() = 1 AND {ANNOUNCED}");
        sql.push_str(&format!(
            "; {}",
            outbox_insert(Dialect::Sqlite, "runs", &cond, "suspensions")
        ));
    }
    let stmt = bind_fence(q(sql), c);
    extra.into_iter().fold(stmt, Q::bind)
}
