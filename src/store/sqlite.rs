//! The SQLite backend: the embedded default for one process, with the same semantics as
//! Postgres (the conformance suite runs on both).
//!
//! SQLite has one writer. Writes go through a pool of **one** connection and every write
//! transaction starts with `BEGIN IMMEDIATE`: writers of this process queue on the pool instead
//! of spinning on `SQLITE_BUSY`, and a writer in another process is waited for by
//! `busy_timeout` before anything was read, so the read-then-upgrade deadlock cannot happen.
//! Reads use a separate pool and see committed data (WAL). Because writers are serialized, the
//! seq counter (`threads.last_seq`), fences and claims need no row locks.
//!
//! Storage conventions: ids are hyphenated UUID text, JSON is text, timestamps are text in the
//! fixed-width UTC format [`rows::SQLITE_TS_FORMAT`] (text order is time order); the clock is
//! this process's.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Row as _, Sqlite, Transaction};
use tracing::instrument;
use uuid::Uuid;

use super::rows;
use super::{
    AgentSnapshot, Applied, Batch, CancelledRun, Claim, CreatedRun, Fence, NewRun,
    ObservationQuery, Op, PageCursor, Resolution, ResolvedSuspension, RunUpdate, Store, StoreError,
    StoreResult, ThreadPatch,
};
use crate::model::{
    AgentConfig, AgentStateRow, Message, MultitaskStrategy, NewObservation, Observation, Run,
    RunPhase, RunStatus, Suspension, Thread, ThreadId, TodoItem, Usage, new_id,
};

/// The embedded SQLite migrations (`migrations/sqlite`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// See the Postgres twin: status derived from the runs; the thread row aliased `t`.
const THREAD_SELECT: &str = "SELECT t.tenant, t.thread_id, t.metadata, t.config, t.created_at, \
    t.updated_at, \
    CASE \
      WHEN EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                   AND r.status IN ('queued', 'running')) THEN 'busy' \
      WHEN EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                   AND r.status = 'suspended') THEN 'suspended' \
      WHEN (SELECT r.status FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
            ORDER BY r.created_at DESC, r.run_id DESC LIMIT 1) = 'failed' THEN 'error' \
      ELSE 'idle' \
    END AS status \
    FROM threads t";

/// Cancel the queued or suspended runs among the JSON array `$1`; `$2` is now.
const CANCEL_QUEUED_OR_SUSPENDED: &str = "UPDATE runs SET status = 'cancelled', ended_at = $2, \
    lease_owner = NULL, lease_expires_at = NULL \
    WHERE run_id IN (SELECT value FROM json_each($1)) AND status IN ('queued', 'suspended') \
    RETURNING *";

/// Cancel the pending suspensions of the runs in the JSON array `$1`; `$2` is now.
const CANCEL_PENDING_SUSPENSIONS: &str = "UPDATE suspensions SET status = 'cancelled', \
    resolved_at = $2 WHERE run_id IN (SELECT value FROM json_each($1)) AND status = 'pending'";

/// Running runs whose lease expired, earliest first; `$3` is now, `$4` how many.
const EXPIRED_CANDIDATES: &str = "SELECT run_id FROM runs \
    WHERE status = 'running' AND lease_expires_at < $3 ORDER BY lease_expires_at LIMIT $4";

/// The oldest queued run of each thread with no running or suspended run (so no two of one
/// thread), oldest first; `$4` is how many.
const QUEUED_CANDIDATES: &str = "SELECT r.run_id FROM runs r \
    WHERE r.status = 'queued' AND NOT EXISTS ( \
      SELECT 1 FROM runs o WHERE o.tenant = r.tenant AND o.thread_id = r.thread_id \
        AND (o.status IN ('running', 'suspended') \
             OR (o.status = 'queued' AND (o.created_at, o.run_id) < (r.created_at, r.run_id)))) \
    ORDER BY r.created_at, r.run_id LIMIT $4";

/// Whether any running run's lease expired, and when the earliest lease still in the future
/// runs out; `$1` is now.
const LEASES: &str = "SELECT COALESCE(MAX(lease_expires_at < $1), 0) AS any_expired, \
    MIN(CASE WHEN lease_expires_at >= $1 THEN lease_expires_at END) AS next_expiry \
    FROM runs WHERE status = 'running'";

/// The SQLite [`Store`].
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Exactly one connection: the only writer of this process.
    writer: SqlitePool,
    /// Readers (the writer pool itself for an in-memory database, which is per connection).
    reader: SqlitePool,
}

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
    pub async fn connect(url: &str) -> StoreResult<Self> {
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
            return Ok(Self {
                writer: pool.clone(),
                reader: pool,
            });
        }
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        if let Some(parent) = options.get_filename().parent()
            && !parent.as_os_str().is_empty()
        {
            create_folder(parent)?;
        }
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        Ok(Self { writer, reader })
    }

    /// Start a write transaction: `BEGIN IMMEDIATE` on the single writer connection.
    async fn write(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn thread_exists(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM threads WHERE tenant = $1 AND thread_id = $2)",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_one(&self.reader)
        .await?;
        Ok(exists)
    }
}

fn create_folder(path: &Path) -> StoreResult<()> {
    std::fs::create_dir_all(path).map_err(|e| {
        StoreError::Database(sqlx::Error::Configuration(
            format!("cannot create the database folder {}: {e}", path.display()).into(),
        ))
    })
}

fn id_text(id: Uuid) -> String {
    id.hyphenated().to_string()
}

fn json_text<T: Serialize + ?Sized>(v: &T) -> StoreResult<String> {
    Ok(rows::to_json(v)?.to_string())
}

fn opt_json_text<T: Serialize>(v: Option<&T>) -> StoreResult<Option<String>> {
    v.map(json_text).transpose()
}

/// A JSON array of ids, for `IN (SELECT value FROM json_each(?))`.
fn id_list(ids: &[Uuid]) -> String {
    Value::from(ids.iter().map(|id| id_text(*id)).collect::<Vec<_>>()).to_string()
}

fn map_rows<T>(
    rows: &[SqliteRow],
    f: impl Fn(&SqliteRow) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    rows.iter().map(f).collect()
}

fn lease_expiry(now: DateTime<Utc>, lease: Duration) -> String {
    let lease = chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
    rows::ts_text(
        now.checked_add_signed(lease)
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    )
}

/// Append observations inside the caller's (immediate) transaction: bump the thread's counter,
/// insert the rows with the seqs it hands out. The caller commits.
async fn append_observations(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
    now: DateTime<Utc>,
    new: Vec<NewObservation>,
) -> StoreResult<Vec<Observation>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let n = i64::try_from(new.len()).map_err(|e| StoreError::Decode(e.to_string()))?;
    let now_text = rows::ts_text(now);
    let last: i64 = sqlx::query_scalar(
        "UPDATE threads SET last_seq = last_seq + $3, updated_at = $4 \
         WHERE tenant = $1 AND thread_id = $2 RETURNING last_seq",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(n)
    .bind(&now_text)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::ThreadNotFound)?;
    let first = last - n + 1;
    for (o, seq) in new.iter().zip(first..) {
        sqlx::query(
            "INSERT INTO observations \
               (tenant, thread_id, seq, id, run_id, parent_id, type, title, content, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(seq)
        .bind(id_text(o.id))
        .bind(o.run_id.map(id_text))
        .bind(&o.parent_id)
        .bind(o.kind.as_str())
        .bind(&o.title)
        .bind(o.content.to_string())
        .bind(&now_text)
        .execute(&mut *conn)
        .await?;
    }
    Ok(rows::committed(
        tenant,
        thread_id,
        first,
        rows::micros(now),
        new,
    ))
}

/// Fill `suspension` of the suspended runs among `runs`.
async fn attach_suspensions(conn: &mut SqliteConnection, runs: &mut [Run]) -> StoreResult<()> {
    let ids = rows::suspended_run_ids(runs);
    let pending = if ids.is_empty() {
        Vec::new()
    } else {
        let rows = sqlx::query(
            "SELECT * FROM suspensions \
             WHERE run_id IN (SELECT value FROM json_each($1)) AND status = 'pending'",
        )
        .bind(id_list(&ids))
        .fetch_all(conn)
        .await?;
        map_rows(&rows, rows::suspension_from_row)?
    };
    rows::attach_suspensions(runs, pending)
}

async fn get_thread_in(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
) -> StoreResult<Option<Thread>> {
    let sql = format!("{THREAD_SELECT} WHERE t.tenant = $1 AND t.thread_id = $2");
    sqlx::query(&sql)
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_optional(conn)
        .await?
        .as_ref()
        .map(rows::thread_from_row)
        .transpose()
}

async fn set_agent_state(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
    s: &AgentStateRow,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO agent_state (tenant, thread_id, intent, title, plan, current_step_id, version) \
         VALUES ($1, $2, $3, $4, $5, $6, 1) \
         ON CONFLICT (tenant, thread_id) DO UPDATE SET intent = excluded.intent, \
           title = excluded.title, plan = excluded.plan, \
           current_step_id = excluded.current_step_id, version = agent_state.version + 1",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(&s.intent)
    .bind(&s.title)
    .bind(&s.plan)
    .bind(&s.current_step_id)
    .execute(conn)
    .await?;
    Ok(())
}

async fn upsert_item(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
    item: &TodoItem,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO todo_items (tenant, thread_id, item_id, position, description, status, \
           dependencies, step_type, required_tools, tool_validation_mode, validation_status, \
           expected_outcome, tool_calls, actual_tool_calls, tool_results, thoughts, result, error, \
           attempts, usage, conversation, run_id, created_at, updated_at, started_at, completed_at, \
           kind, parent_item_id, role, tool_allowlist, compacted_output) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
           $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31) \
         ON CONFLICT (tenant, thread_id, item_id) DO UPDATE SET position = excluded.position, \
           description = excluded.description, status = excluded.status, \
           dependencies = excluded.dependencies, step_type = excluded.step_type, \
           required_tools = excluded.required_tools, \
           tool_validation_mode = excluded.tool_validation_mode, \
           validation_status = excluded.validation_status, \
           expected_outcome = excluded.expected_outcome, tool_calls = excluded.tool_calls, \
           actual_tool_calls = excluded.actual_tool_calls, tool_results = excluded.tool_results, \
           thoughts = excluded.thoughts, result = excluded.result, error = excluded.error, \
           attempts = excluded.attempts, usage = excluded.usage, \
           conversation = excluded.conversation, run_id = excluded.run_id, \
           created_at = excluded.created_at, updated_at = excluded.updated_at, \
           started_at = excluded.started_at, completed_at = excluded.completed_at, \
           kind = excluded.kind, parent_item_id = excluded.parent_item_id, role = excluded.role, \
           tool_allowlist = excluded.tool_allowlist, compacted_output = excluded.compacted_output",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(item.id.as_str())
    .bind(item.position)
    .bind(&item.description)
    .bind(item.status.as_str())
    .bind(json_text(&item.dependencies)?)
    .bind(item.step_type.as_str())
    .bind(json_text(&item.required_tools)?)
    .bind(item.tool_validation_mode.as_str())
    .bind(item.validation_status.as_str())
    .bind(&item.expected_outcome)
    .bind(json_text(&item.tool_calls)?)
    .bind(json_text(&item.actual_tool_calls)?)
    .bind(json_text(&item.tool_results)?)
    .bind(json_text(&item.thoughts)?)
    .bind(&item.result)
    .bind(opt_json_text(item.error.as_ref())?)
    .bind(i64::from(item.attempts))
    .bind(json_text(&item.usage)?)
    .bind(json_text(&item.conversation)?)
    .bind(item.run_id.map(id_text))
    .bind(rows::ts_text(item.created_at))
    .bind(rows::ts_text(item.updated_at))
    .bind(item.started_at.map(rows::ts_text))
    .bind(item.completed_at.map(rows::ts_text))
    .bind(item.kind.as_str())
    .bind(item.parent_item_id.as_ref().map(crate::model::ItemId::as_str))
    .bind(&item.role)
    .bind(opt_json_text(item.tool_allowlist.as_ref())?)
    .bind(&item.compacted_output)
    .execute(conn)
    .await?;
    Ok(())
}

async fn append_message(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
    m: &Message,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO messages (id, tenant, thread_id, run_id, role, content, item_id, \
           tool_call_id, created_at, name, tool_calls) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(id_text(m.id))
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(m.run_id.map(id_text))
    .bind(m.role.as_str())
    .bind(&m.content)
    .bind(&m.item_id)
    .bind(&m.tool_call_id)
    .bind(rows::ts_text(m.created_at))
    .bind(&m.name)
    .bind(if m.tool_calls.is_empty() {
        None
    } else {
        Some(json_text(&m.tool_calls)?)
    })
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_run(
    conn: &mut SqliteConnection,
    fence: Fence,
    now: DateTime<Utc>,
    u: &RunUpdate,
) -> StoreResult<()> {
    let clear_lease = u.status.is_some_and(rows::clears_lease);
    let done = sqlx::query(
        "UPDATE runs SET status = CASE WHEN $3 = 'suspended' AND EXISTS (SELECT 1 FROM suspensions s \
                            WHERE s.suspension_id IN (SELECT value FROM json_each($11)) \
                              AND s.status <> 'pending') \
                          THEN 'queued' ELSE COALESCE($3, status) END, \
           phase = COALESCE($4, phase), \
           usage = COALESCE($5, usage), error = COALESCE($6, error), \
           final_response = COALESCE($7, final_response), \
           ended_at = CASE WHEN $8 THEN $10 ELSE ended_at END, \
           lease_owner = CASE WHEN $9 THEN NULL ELSE lease_owner END, \
           lease_expires_at = CASE WHEN $9 THEN NULL ELSE lease_expires_at END \
         WHERE run_id = $1 AND attempt = $2",
    )
    .bind(id_text(fence.run_id))
    .bind(fence.attempt)
    .bind(u.status.map(RunStatus::as_str))
    .bind(u.phase.map(RunPhase::as_str))
    .bind(opt_json_text(u.usage.as_ref())?)
    .bind(opt_json_text(u.error.as_ref())?)
    .bind(u.final_response.as_ref().map(Value::to_string))
    .bind(u.ended)
    .bind(clear_lease)
    .bind(rows::ts_text(now))
    .bind(json_text(
        &u.unless_decided
            .iter()
            .map(|id| id_text(*id))
            .collect::<Vec<_>>(),
    )?)
    .execute(conn)
    .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::LeaseLost);
    }
    Ok(())
}

async fn insert_suspension(
    conn: &mut SqliteConnection,
    tenant: &str,
    thread_id: &ThreadId,
    s: &Suspension,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO suspensions (suspension_id, tenant, thread_id, run_id, item_id, kind, \
           tool_call, allowed_decisions, question, input_schema, iteration_state, \
           partial_tool_results, status, decision, created_at, resolved_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
    )
    .bind(id_text(s.suspension_id))
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(id_text(s.run_id))
    .bind(s.item_id.as_str())
    .bind(s.kind.as_str())
    .bind(json_text(&s.tool_call)?)
    .bind(json_text(&s.allowed_decisions)?)
    .bind(&s.question)
    .bind(s.input_schema.as_ref().map(Value::to_string))
    .bind(s.iteration_state.to_string())
    .bind(json_text(&s.partial_tool_results)?)
    .bind(s.status.as_str())
    .bind(s.decision.as_ref().map(json_text).transpose()?)
    .bind(rows::ts_text(s.created_at))
    .bind(s.resolved_at.map(rows::ts_text))
    .bind(s.expires_at.map(rows::ts_text))
    .execute(conn)
    .await?;
    Ok(())
}

/// Run one op of a batch inside the apply transaction.
async fn apply_op(
    conn: &mut SqliteConnection,
    fence: Fence,
    now: DateTime<Utc>,
    tenant: &str,
    thread_id: &ThreadId,
    op: &Op,
) -> StoreResult<()> {
    match op {
        Op::SetAgentState(s) => set_agent_state(conn, tenant, thread_id, s).await,
        Op::UpsertItem(item) => upsert_item(conn, tenant, thread_id, item).await,
        Op::DeleteItem(id) => {
            sqlx::query(
                "DELETE FROM todo_items WHERE tenant = $1 AND thread_id = $2 AND item_id = $3",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(id.as_str())
            .execute(conn)
            .await?;
            Ok(())
        }
        Op::AppendMessage(m) => append_message(conn, tenant, thread_id, m).await,
        Op::UpdateRun(u) => update_run(conn, fence, now, u).await,
        Op::InsertSuspension(s) => insert_suspension(conn, tenant, thread_id, s).await,
    }
}

/// The claim statement; `candidates` selects the run ids.
fn claim_sql(candidates: &str) -> String {
    format!(
        "UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = $1, \
           lease_expires_at = $2, started_at = COALESCE(started_at, $3) \
         WHERE run_id IN ({candidates}) RETURNING *"
    )
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    /// Runs the embedded migrations on the writer connection (the only writer of the process).
    async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    async fn ready(&self) -> StoreResult<()> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.reader)
                .await?;
        for m in MIGRATOR.iter() {
            if !applied.contains(&m.version) {
                return Err(StoreError::Conflict(format!(
                    "migration {} ({}) is not applied",
                    m.version, m.description
                )));
            }
        }
        Ok(())
    }

    #[instrument(skip_all, fields(%tenant, %thread_id))]
    async fn create_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        metadata: Value,
        config: AgentConfig,
    ) -> StoreResult<Thread> {
        let now = rows::ts_text(rows::now_micros());
        let mut tx = self.write().await?;
        let row = sqlx::query(
            "INSERT INTO threads (tenant, thread_id, metadata, config, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $5) \
             RETURNING tenant, thread_id, metadata, config, created_at, updated_at, \
               'idle' AS status",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(metadata.to_string())
        .bind(json_text(&config)?)
        .bind(&now)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| {
            if rows::is_unique_violation(&e, None) {
                StoreError::ThreadExists
            } else {
                e.into()
            }
        })?;
        sqlx::query("INSERT INTO agent_state (tenant, thread_id) VALUES ($1, $2)")
            .bind(tenant)
            .bind(thread_id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        rows::thread_from_row(&row)
    }

    async fn get_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<Option<Thread>> {
        let mut conn = self.reader.acquire().await?;
        get_thread_in(&mut conn, tenant, thread_id).await
    }

    async fn list_threads(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<Thread>> {
        let after = if cursor.is_some() {
            "AND (t.created_at, t.thread_id) < ($3, $4)"
        } else {
            ""
        };
        let sql = format!(
            "{THREAD_SELECT} WHERE t.tenant = $1 {after} \
             ORDER BY t.created_at DESC, t.thread_id DESC LIMIT $2"
        );
        let mut q = sqlx::query(&sql).bind(tenant).bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            q = q.bind(rows::ts_text(c.created_at)).bind(&c.id);
        }
        map_rows(&q.fetch_all(&self.reader).await?, rows::thread_from_row)
    }

    async fn update_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        patch: ThreadPatch,
    ) -> StoreResult<Option<Thread>> {
        let now = rows::ts_text(rows::now_micros());
        let mut tx = self.write().await?;
        let done = sqlx::query(
            "UPDATE threads SET metadata = COALESCE($3, metadata), \
               config = COALESCE($4, config), updated_at = $5 \
             WHERE tenant = $1 AND thread_id = $2",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(patch.metadata.as_ref().map(Value::to_string))
        .bind(opt_json_text(patch.config.as_ref())?)
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        let thread = get_thread_in(&mut tx, tenant, thread_id).await?;
        tx.commit().await?;
        Ok(thread)
    }

    #[instrument(skip_all, fields(%tenant, %thread_id))]
    async fn delete_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        let mut tx = self.write().await?;
        let done = sqlx::query("DELETE FROM threads WHERE tenant = $1 AND thread_id = $2")
            .bind(tenant)
            .bind(thread_id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn agent_snapshot(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>> {
        // A read transaction: one snapshot for the three reads.
        let mut tx = self.reader.begin().await?;
        let Some(state) =
            sqlx::query("SELECT * FROM agent_state WHERE tenant = $1 AND thread_id = $2")
                .bind(tenant)
                .bind(thread_id.as_str())
                .fetch_optional(&mut *tx)
                .await?
        else {
            return Ok(None);
        };
        let items = sqlx::query(
            "SELECT * FROM todo_items WHERE tenant = $1 AND thread_id = $2 \
             ORDER BY position, item_id",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let pending = sqlx::query(
            "SELECT * FROM suspensions WHERE tenant = $1 AND thread_id = $2 \
               AND status = 'pending' ORDER BY created_at DESC, suspension_id DESC LIMIT 1",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(AgentSnapshot {
            state: rows::agent_state_from_row(&state)?,
            items: map_rows(&items, rows::item_from_row)?,
            pending_suspension: pending
                .as_ref()
                .map(rows::suspension_from_row)
                .transpose()?,
        }))
    }

    async fn list_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Message>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        let after = if cursor.is_some() {
            "AND (created_at, id) > ($4, $5)"
        } else {
            ""
        };
        let sql = format!(
            "SELECT * FROM messages WHERE tenant = $1 AND thread_id = $2 {after} \
             ORDER BY created_at, id LIMIT $3"
        );
        let mut q = sqlx::query(&sql)
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            q = q
                .bind(rows::ts_text(c.created_at))
                .bind(id_text(rows::cursor_uuid(&c.id)?));
        }
        map_rows(&q.fetch_all(&self.reader).await?, rows::message_from_row).map(Some)
    }

    async fn recent_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
    ) -> StoreResult<Vec<Message>> {
        let rows = sqlx::query(
            "SELECT * FROM (SELECT * FROM messages WHERE tenant = $1 AND thread_id = $2 \
               AND item_id IS NULL AND role IN ('user', 'assistant') \
             ORDER BY created_at DESC, id DESC LIMIT $3) m \
             ORDER BY created_at, id",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        map_rows(&rows, rows::message_from_row)
    }

    #[instrument(skip_all, fields(tenant = %new.tenant, thread_id = %new.thread_id))]
    async fn create_run(&self, new: NewRun) -> StoreResult<CreatedRun> {
        let (tenant, thread_id) = (new.tenant.as_str(), &new.thread_id);
        let mut tx = self.write().await?;
        // Taken after BEGIN IMMEDIATE: runs of a thread sort in the order they were enqueued.
        let now = rows::now_micros();
        let now_text = rows::ts_text(now);
        let last_seq_sql = "SELECT last_seq FROM threads WHERE tenant = $1 AND thread_id = $2";
        let mut last_seq: Option<i64> = sqlx::query_scalar(last_seq_sql)
            .bind(tenant)
            .bind(thread_id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if last_seq.is_none() && new.create_thread {
            sqlx::query(
                "INSERT INTO threads (tenant, thread_id, created_at, updated_at) \
                 VALUES ($1, $2, $3, $3)",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(&now_text)
            .execute(&mut *tx)
            .await?;
            sqlx::query("INSERT INTO agent_state (tenant, thread_id) VALUES ($1, $2)")
                .bind(tenant)
                .bind(thread_id.as_str())
                .execute(&mut *tx)
                .await?;
            last_seq = Some(0);
        }
        let last_seq = last_seq.ok_or(StoreError::ThreadNotFound)?;

        if let Some(key) = &new.idempotency_key {
            let existing = sqlx::query(
                "SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 AND idempotency_key = $3",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                let mut run = rows::run_from_row(&row)?;
                attach_suspensions(&mut tx, std::slice::from_mut(&mut run)).await?;
                tx.commit().await?;
                return Ok(CreatedRun {
                    run,
                    created: false,
                    observations: Vec::new(),
                });
            }
        }

        let active: Vec<(String, String)> = sqlx::query_as(
            "SELECT run_id, status FROM runs WHERE tenant = $1 AND thread_id = $2 \
               AND status IN ('queued', 'running', 'suspended') ORDER BY created_at, run_id",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let active = active
            .into_iter()
            .map(|(id, status)| {
                let id = Uuid::parse_str(&id).map_err(|e| StoreError::Decode(e.to_string()))?;
                let status: RunStatus = status.parse().map_err(StoreError::Decode)?;
                Ok((id, status))
            })
            .collect::<StoreResult<Vec<_>>>()?;

        let run_id = new_id();
        let mut observations = Vec::new();
        match new.strategy {
            MultitaskStrategy::Reject => {
                if let Some((active_run, _)) = active.first() {
                    return Err(StoreError::ThreadBusy {
                        active_run: *active_run,
                    });
                }
            }
            MultitaskStrategy::Enqueue => {}
            MultitaskStrategy::Interrupt => {
                let (running, displaced): (Vec<(Uuid, RunStatus)>, Vec<_>) = active
                    .into_iter()
                    .partition(|(_, s)| *s == RunStatus::Running);
                let running: Vec<Uuid> = running.into_iter().map(|(id, _)| id).collect();
                let displaced: Vec<Uuid> = displaced.into_iter().map(|(id, _)| id).collect();
                if !displaced.is_empty() {
                    sqlx::query(CANCEL_QUEUED_OR_SUSPENDED)
                        .bind(id_list(&displaced))
                        .bind(&now_text)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(CANCEL_PENDING_SUSPENSIONS)
                        .bind(id_list(&displaced))
                        .bind(&now_text)
                        .execute(&mut *tx)
                        .await?;
                    let obs = displaced
                        .iter()
                        .map(|id| rows::run_cancelled(*id, Some(run_id)))
                        .collect();
                    observations =
                        append_observations(&mut tx, tenant, thread_id, now, obs).await?;
                }
                if !running.is_empty() {
                    sqlx::query(
                        "UPDATE runs SET cancel_requested = 1 \
                         WHERE run_id IN (SELECT value FROM json_each($1))",
                    )
                    .bind(id_list(&running))
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        let start_seq = observations.last().map_or(last_seq, |o| o.seq);
        let row = sqlx::query(
            "INSERT INTO runs (run_id, tenant, thread_id, status, query, config, \
               multitask_strategy, idempotency_key, created_at, usage, attempt, phase, \
               cancel_requested, start_seq) \
             VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, $8, $9, 0, 'new', 0, $10) \
             RETURNING *",
        )
        .bind(id_text(run_id))
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(&new.query)
        .bind(json_text(&new.config)?)
        .bind(new.strategy.as_str())
        .bind(&new.idempotency_key)
        .bind(&now_text)
        .bind(json_text(&Usage::default())?)
        .bind(start_seq)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(CreatedRun {
            run: rows::run_from_row(&row)?,
            created: true,
            observations,
        })
    }

    async fn get_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<Option<Run>> {
        let mut tx = self.reader.begin().await?;
        let Some(row) =
            sqlx::query("SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3")
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(id_text(run_id))
                .fetch_optional(&mut *tx)
                .await?
        else {
            return Ok(None);
        };
        let mut run = rows::run_from_row(&row)?;
        attach_suspensions(&mut tx, std::slice::from_mut(&mut run)).await?;
        tx.commit().await?;
        Ok(Some(run))
    }

    async fn list_runs(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Run>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        let after = if cursor.is_some() {
            "AND (created_at, run_id) < ($4, $5)"
        } else {
            ""
        };
        let sql = format!(
            "SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 {after} \
             ORDER BY created_at DESC, run_id DESC LIMIT $3"
        );
        let mut q = sqlx::query(&sql)
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            q = q
                .bind(rows::ts_text(c.created_at))
                .bind(id_text(rows::cursor_uuid(&c.id)?));
        }
        let mut tx = self.reader.begin().await?;
        let mut runs = map_rows(&q.fetch_all(&mut *tx).await?, rows::run_from_row)?;
        attach_suspensions(&mut tx, &mut runs).await?;
        tx.commit().await?;
        Ok(Some(runs))
    }

    #[instrument(skip_all, fields(%tenant, %thread_id, %run_id))]
    async fn cancel_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<CancelledRun> {
        let mut tx = self.write().await?;
        let now = rows::now_micros();
        let now_text = rows::ts_text(now);
        let status: String = sqlx::query_scalar(
            "SELECT status FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(id_text(run_id))
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::RunNotFound)?;
        let status: RunStatus = status.parse().map_err(StoreError::Decode)?;
        let (row, observations) = match status {
            RunStatus::Queued | RunStatus::Suspended => {
                let ids = id_list(&[run_id]);
                let row = sqlx::query(CANCEL_QUEUED_OR_SUSPENDED)
                    .bind(&ids)
                    .bind(&now_text)
                    .fetch_one(&mut *tx)
                    .await?;
                sqlx::query(CANCEL_PENDING_SUSPENSIONS)
                    .bind(&ids)
                    .bind(&now_text)
                    .execute(&mut *tx)
                    .await?;
                let obs = vec![rows::run_cancelled(run_id, None)];
                let obs = append_observations(&mut tx, tenant, thread_id, now, obs).await?;
                (row, obs)
            }
            RunStatus::Running => {
                let row = sqlx::query(
                    "UPDATE runs SET cancel_requested = 1 WHERE run_id = $1 RETURNING *",
                )
                .bind(id_text(run_id))
                .fetch_one(&mut *tx)
                .await?;
                (row, Vec::new())
            }
            done => return Err(StoreError::Conflict(format!("run already {done}"))),
        };
        tx.commit().await?;
        Ok(CancelledRun {
            run: rows::run_from_row(&row)?,
            observations,
        })
    }

    #[instrument(skip_all, fields(%owner, max))]
    async fn claim_runs(&self, owner: &str, lease: Duration, max: usize) -> StoreResult<Claim> {
        let mut tx = self.write().await?;
        let now = rows::now_micros();
        let now_text = rows::ts_text(now);
        let expires = lease_expiry(now, lease);
        let leases = sqlx::query(LEASES)
            .bind(&now_text)
            .fetch_one(&mut *tx)
            .await?;
        let any_expired: bool = leases.try_get("any_expired")?;
        let next_expiry = match leases.try_get::<Option<String>, _>("next_expiry")? {
            Some(t) => Some(
                (rows::parse_ts_text(&t)? - now)
                    .to_std()
                    .unwrap_or(Duration::ZERO),
            ),
            None => None,
        };
        let mut runs = Vec::new();
        // Expired leases first; the statement is skipped when none is (the idle case).
        let kinds = [(any_expired, EXPIRED_CANDIDATES), (true, QUEUED_CANDIDATES)];
        for (wanted, candidates) in kinds {
            let left = max.saturating_sub(runs.len());
            if !wanted || left == 0 {
                continue;
            }
            let claimed = sqlx::query(&claim_sql(candidates))
                .bind(owner)
                .bind(&expires)
                .bind(&now_text)
                .bind(i64::try_from(left).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await;
            match claimed {
                Ok(rows) => {
                    for row in &rows {
                        runs.push(rows::run_from_row(row)?);
                    }
                }
                // Cannot happen while writers are serialized; kept in step with Postgres (the
                // dropped transaction takes every claim back).
                Err(e) if rows::is_unique_violation(&e, None) => {
                    return Ok(Claim {
                        runs: Vec::new(),
                        next_expiry: Some(Duration::ZERO),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        tx.commit().await?;
        Ok(Claim { runs, next_expiry })
    }

    async fn heartbeat(&self, fence: Fence, lease: Duration) -> StoreResult<bool> {
        let mut tx = self.write().await?;
        let expires = lease_expiry(rows::now_micros(), lease);
        let cancel: Option<bool> = sqlx::query_scalar(
            "UPDATE runs SET lease_expires_at = $3 \
             WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
             RETURNING cancel_requested",
        )
        .bind(id_text(fence.run_id))
        .bind(fence.attempt)
        .bind(expires)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        cancel.ok_or(StoreError::LeaseLost)
    }

    #[instrument(skip_all, fields(run_id = %fence.run_id, attempt = fence.attempt))]
    async fn release_run(&self, fence: Fence) -> StoreResult<()> {
        let mut tx = self.write().await?;
        let done = sqlx::query(
            "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL \
             WHERE run_id = $1 AND attempt = $2 AND status = 'running'",
        )
        .bind(id_text(fence.run_id))
        .bind(fence.attempt)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        Ok(())
    }

    #[instrument(skip_all, fields(run_id = %fence.run_id, attempt = fence.attempt))]
    async fn apply(&self, fence: Fence, lease: Duration, batch: Batch) -> StoreResult<Applied> {
        let Batch {
            tenant,
            thread_id,
            ops,
            observations,
        } = batch;
        let mut tx = self.write().await?;
        let now = rows::now_micros();
        let cancel_requested: Option<bool> = sqlx::query_scalar(
            "UPDATE runs SET lease_expires_at = $3 \
             WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
               AND tenant = $4 AND thread_id = $5 \
             RETURNING cancel_requested",
        )
        .bind(id_text(fence.run_id))
        .bind(fence.attempt)
        .bind(lease_expiry(now, lease))
        .bind(&tenant)
        .bind(thread_id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        // No row: the lease is gone; dropping `tx` rolls back.
        let cancel_requested = cancel_requested.ok_or(StoreError::LeaseLost)?;
        for op in &ops {
            apply_op(&mut tx, fence, now, &tenant, &thread_id, op).await?;
        }
        let observations =
            append_observations(&mut tx, &tenant, &thread_id, now, observations).await?;
        tx.commit().await?;
        Ok(Applied {
            observations,
            cancel_requested,
        })
    }

    async fn list_observations(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        query: &ObservationQuery,
    ) -> StoreResult<Option<Vec<Observation>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        let types = query
            .types
            .as_ref()
            .map(|ts| Value::from(ts.iter().map(|t| t.as_str()).collect::<Vec<_>>()).to_string());
        let rows = sqlx::query(
            "SELECT * FROM observations WHERE tenant = $1 AND thread_id = $2 AND seq > $3 \
               AND ($4 IS NULL OR type IN (SELECT value FROM json_each($4))) \
               AND ($5 IS NULL OR parent_id = $5) \
               AND ($6 IS NULL OR run_id = $6) \
             ORDER BY seq LIMIT $7",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(query.after)
        .bind(types)
        .bind(&query.parent_id)
        .bind(query.run_id.map(id_text))
        .bind(rows::sql_limit(query.limit))
        .fetch_all(&self.reader)
        .await?;
        map_rows(&rows, rows::observation_from_row).map(Some)
    }

    async fn list_suspensions(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        include_resolved: bool,
    ) -> StoreResult<Option<Vec<Suspension>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        let rows = sqlx::query(
            "SELECT * FROM suspensions WHERE tenant = $1 AND thread_id = $2 \
               AND ($3 OR status = 'pending') ORDER BY created_at, suspension_id",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(include_resolved)
        .fetch_all(&self.reader)
        .await?;
        map_rows(&rows, rows::suspension_from_row).map(Some)
    }

    async fn get_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
    ) -> StoreResult<Option<Suspension>> {
        sqlx::query("SELECT * FROM suspensions WHERE tenant = $1 AND suspension_id = $2")
            .bind(tenant)
            .bind(id_text(suspension_id))
            .fetch_optional(&self.reader)
            .await?
            .as_ref()
            .map(rows::suspension_from_row)
            .transpose()
    }

    #[instrument(skip_all, fields(%tenant, %suspension_id))]
    async fn resolve_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
    ) -> StoreResult<ResolvedSuspension> {
        let Resolution { status, decision } = resolution;
        let expired = rows::resolution_is_expiry(status)?;
        // BEGIN IMMEDIATE: concurrent resolvers are serialized, the second sees the first's commit.
        let mut tx = self.write().await?;
        let now = rows::now_micros();
        let now_text = rows::ts_text(now);
        let (thread_id, run_id, current): (String, String, String) = sqlx::query_as(
            "SELECT thread_id, run_id, status FROM suspensions \
             WHERE tenant = $1 AND suspension_id = $2",
        )
        .bind(tenant)
        .bind(id_text(suspension_id))
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::SuspensionNotFound)?;
        let thread_id = ThreadId::from_stored(thread_id);
        // Compare-and-set, as on Postgres (here the status read above cannot have moved).
        let row = sqlx::query(
            "UPDATE suspensions SET status = $3, decision = $4, resolved_at = $5 \
             WHERE tenant = $1 AND suspension_id = $2 AND status = 'pending' RETURNING *",
        )
        .bind(tenant)
        .bind(id_text(suspension_id))
        .bind(status.as_str())
        .bind(json_text(&decision)?)
        .bind(&now_text)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::Conflict(format!("suspension already {current}")))?;
        let suspension = rows::suspension_from_row(&row)?;
        // A suspended run goes back to the queue (its lease was cleared when it suspended; the
        // next claim bumps attempt). A run still busy with other items, or queued, reads the
        // decision when it next looks (a running run that then finds nothing else to do is
        // queued again by its own suspend commit: see `RunUpdate::unless_decided`).
        let run_row = sqlx::query(
            "UPDATE runs SET status = CASE WHEN status = 'suspended' THEN 'queued' ELSE status END \
             WHERE run_id = $1 AND status IN ('suspended', 'queued', 'running') RETURNING *",
        )
        .bind(&run_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(run_row) = run_row else {
            let run_status: Option<String> =
                sqlx::query_scalar("SELECT status FROM runs WHERE run_id = $1")
                    .bind(&run_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            // Dropping `tx` rolls the suspension back: it stays pending.
            let run_status = run_status.as_deref().unwrap_or("gone");
            return Err(StoreError::Conflict(format!(
                "the suspension's run is {run_status}: it takes no more decisions"
            )));
        };
        let obs = vec![rows::agent_resumed(&suspension, &decision, expired)];
        let observations = append_observations(&mut tx, tenant, &thread_id, now, obs).await?;
        tx.commit().await?;
        Ok(ResolvedSuspension {
            suspension,
            run: rows::run_from_row(&run_row)?,
            observations,
        })
    }

    async fn due_suspensions(&self, limit: u32) -> StoreResult<Vec<(String, Uuid)>> {
        // The predicate matches the partial index `suspensions_expiry_idx`; fixed-width
        // timestamps compare as text.
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT tenant, suspension_id FROM suspensions \
             WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at < $1 \
             ORDER BY expires_at, suspension_id LIMIT $2",
        )
        .bind(rows::ts_text(rows::now_micros()))
        .bind(rows::sql_limit(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter()
            .map(|(tenant, id)| {
                Uuid::parse_str(&id)
                    .map(|id| (tenant, id))
                    .map_err(|e| StoreError::Decode(format!("column suspension_id: {e}")))
            })
            .collect()
    }
}
