//! The Postgres backend: the production store and the coordination engine between replicas.
//!
//! What it owns and how it keeps the [`Store`] invariants:
//! - **Gap-free seqs.** `threads.last_seq` is bumped by the transaction that inserts the
//!   observations (`UPDATE … RETURNING last_seq`), so the row lock serializes appenders of one
//!   thread and a rollback takes the counter back with it.
//! - **Fences.** Every worker write matches `run_id` *and* `attempt` of a `running` run; zero rows
//!   means [`StoreError::LeaseLost`] and the transaction is rolled back.
//! - **One run per thread.** Claims pick rows with `FOR UPDATE SKIP LOCKED` (one statement fills
//!   every free slot of a worker); a partial unique index (`runs_one_running_per_thread_idx`)
//!   backs the rule up.
//! - **Lock order thread → run → suspension** in every multi-row transaction (`create_run`,
//!   `cancel_run`, `apply`, `resolve_suspension`), so they never deadlock each other; claims lock
//!   run rows and nothing else, and never wait for one (`SKIP LOCKED`).
//! - **One clock.** Every timestamp the store makes, and every lease comparison, uses the
//!   database's `now()`.
//!
//! SQL is checked at run time (`sqlx::query` + [`rows`](super::rows) mapping), not by macros.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;
use sqlx::Row as _;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use tracing::instrument;
use uuid::Uuid;

use super::rows;
use super::{
    AgentSnapshot, Applied, Batch, CancelledRun, Claim, CreatedRun, Fence, NewRun,
    ObservationQuery, Op, PageCursor, Resolution, ResolvedSuspension, Signal, Store, StoreError,
    StoreResult, ThreadPatch,
};
use crate::model::{
    AgentConfig, AgentStateRow, Message, MultitaskStrategy, NewObservation, Observation, Run,
    RunPhase, RunStatus, Suspension, Thread, ThreadId, TodoItem, Usage, new_id,
};

/// The embedded Postgres migrations (`migrations/postgres`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// A thread with its status derived from its runs: `busy` while one is queued or running,
/// `suspended` while one waits for a person, `error` when the newest failed, else `idle`.
/// Expects the thread row (or a CTE of it) aliased `t`.
const THREAD_COLUMNS: &str = "t.tenant, t.thread_id, t.metadata, t.config, t.created_at, \
    t.updated_at, \
    CASE \
      WHEN EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                   AND r.status IN ('queued', 'running')) THEN 'busy' \
      WHEN EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                   AND r.status = 'suspended') THEN 'suspended' \
      WHEN (SELECT r.status FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
            ORDER BY r.created_at DESC, r.run_id DESC LIMIT 1) = 'failed' THEN 'error' \
      ELSE 'idle' \
    END AS status";

/// Cancel the queued or suspended runs among `$1` (the store cancels those itself).
const CANCEL_QUEUED_OR_SUSPENDED: &str = "UPDATE runs SET status = 'cancelled', ended_at = now(), \
    lease_owner = NULL, lease_expires_at = NULL \
    WHERE run_id = ANY($1) AND status IN ('queued', 'suspended') RETURNING *";

/// Cancel the pending suspensions of the runs in `$1`.
const CANCEL_PENDING_SUSPENSIONS: &str = "UPDATE suspensions SET status = 'cancelled', \
    resolved_at = now() WHERE run_id = ANY($1) AND status = 'pending'";

/// The Postgres [`Store`].
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connect a pool of at most `max_connections` to `url` (`postgres://…`). Does not migrate.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the URL is invalid or the server cannot be reached.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        Ok(Self::from_pool(pool))
    }

    /// Wrap an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The underlying pool (e.g. for a `LISTEN` connection or benchmarks).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn thread_exists(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM threads WHERE tenant = $1 AND thread_id = $2)",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok(exists)
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn lease_lost_if_none<T>(v: Option<T>) -> StoreResult<T> {
    v.ok_or(StoreError::LeaseLost)
}

/// The NOTIFY payload of a signal.
fn signal_payload(s: &Signal) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Tell other replicas (at commit) that something happened.
async fn notify(conn: &mut PgConnection, s: &Signal) -> StoreResult<()> {
    sqlx::query("SELECT pg_notify('pes', $1)")
        .bind(signal_payload(s))
        .execute(conn)
        .await?;
    Ok(())
}

/// Lock the thread row; its `last_seq`, or `None` when the thread does not exist.
async fn lock_thread(
    conn: &mut PgConnection,
    tenant: &str,
    thread_id: &ThreadId,
) -> StoreResult<Option<i64>> {
    let seq = sqlx::query_scalar(
        "SELECT last_seq FROM threads WHERE tenant = $1 AND thread_id = $2 FOR UPDATE",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .fetch_optional(conn)
    .await?;
    Ok(seq)
}

/// Insert observations whose seqs were already reserved: `first_seq..first_seq + n`.
async fn insert_observations(
    conn: &mut PgConnection,
    tenant: &str,
    thread_id: &ThreadId,
    first_seq: i64,
    created_at: DateTime<Utc>,
    new: Vec<NewObservation>,
) -> StoreResult<Vec<Observation>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let n = new.len();
    let mut seqs = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut run_ids = Vec::with_capacity(n);
    let mut parents = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    let mut titles = Vec::with_capacity(n);
    let mut contents = Vec::with_capacity(n);
    for (o, seq) in new.iter().zip(first_seq..) {
        seqs.push(seq);
        ids.push(o.id);
        run_ids.push(o.run_id);
        parents.push(o.parent_id.clone());
        types.push(o.kind.as_str());
        titles.push(o.title.as_str());
        contents.push(o.content.clone());
    }
    let signal = signal_payload(&Signal::Observations {
        tenant: tenant.to_owned(),
        thread: thread_id.to_string(),
        seq: first_seq + n as i64 - 1,
    });
    // The insert and the wake-up for other replicas in one statement; NOTIFY is delivered at
    // commit, so a listener never reads before the rows are visible.
    sqlx::query(
        "WITH ins AS (INSERT INTO observations \
           (tenant, thread_id, seq, id, run_id, parent_id, type, title, content, created_at) \
         SELECT $1, $2, u.seq, u.id, u.run_id, u.parent_id, u.type, u.title, u.content, $10 \
         FROM UNNEST($3::bigint[], $4::uuid[], $5::uuid[], $6::text[], $7::text[], $8::text[], \
                     $9::jsonb[]) AS u(seq, id, run_id, parent_id, type, title, content)) \
         SELECT pg_notify('pes', $11)",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(&seqs)
    .bind(&ids)
    .bind(&run_ids)
    .bind(&parents)
    .bind(&types)
    .bind(&titles)
    .bind(&contents)
    .bind(created_at)
    .bind(signal)
    .execute(conn)
    .await?;
    Ok(rows::committed(
        tenant, thread_id, first_seq, created_at, new,
    ))
}

/// Append observations inside the caller's transaction: reserve their seqs on the thread row,
/// then insert them. The caller commits.
async fn append_observations(
    conn: &mut PgConnection,
    tenant: &str,
    thread_id: &ThreadId,
    new: Vec<NewObservation>,
) -> StoreResult<Vec<Observation>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let n = i64::try_from(new.len()).map_err(|e| StoreError::Decode(e.to_string()))?;
    let row = sqlx::query(
        "UPDATE threads SET last_seq = last_seq + $3, updated_at = now() \
         WHERE tenant = $1 AND thread_id = $2 RETURNING last_seq, now() AS now",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(n)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::ThreadNotFound)?;
    let last: i64 = row.try_get("last_seq")?;
    let now: DateTime<Utc> = row.try_get("now")?;
    insert_observations(conn, tenant, thread_id, last - n + 1, now, new).await
}

/// Fill `suspension` of the suspended runs among `runs`.
async fn attach_suspensions(conn: &mut PgConnection, runs: &mut [Run]) -> StoreResult<()> {
    let ids = rows::suspended_run_ids(runs);
    let pending = if ids.is_empty() {
        Vec::new()
    } else {
        sqlx::query("SELECT * FROM suspensions WHERE run_id = ANY($1) AND status = 'pending'")
            .bind(&ids)
            .fetch_all(conn)
            .await?
            .iter()
            .map(rows::suspension_from_row)
            .collect::<StoreResult<Vec<_>>>()?
    };
    rows::attach_suspensions(runs, pending)
}

fn map_rows<T>(rows: &[PgRow], f: impl Fn(&PgRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(f).collect()
}

async fn set_agent_state(
    conn: &mut PgConnection,
    tenant: &str,
    thread_id: &ThreadId,
    s: &AgentStateRow,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO agent_state (tenant, thread_id, intent, title, plan, current_step_id, version) \
         VALUES ($1, $2, $3, $4, $5, $6, 1) \
         ON CONFLICT (tenant, thread_id) DO UPDATE SET intent = EXCLUDED.intent, \
           title = EXCLUDED.title, plan = EXCLUDED.plan, \
           current_step_id = EXCLUDED.current_step_id, version = agent_state.version + 1",
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
    conn: &mut PgConnection,
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
         ON CONFLICT (tenant, thread_id, item_id) DO UPDATE SET position = EXCLUDED.position, \
           description = EXCLUDED.description, status = EXCLUDED.status, \
           dependencies = EXCLUDED.dependencies, step_type = EXCLUDED.step_type, \
           required_tools = EXCLUDED.required_tools, \
           tool_validation_mode = EXCLUDED.tool_validation_mode, \
           validation_status = EXCLUDED.validation_status, \
           expected_outcome = EXCLUDED.expected_outcome, tool_calls = EXCLUDED.tool_calls, \
           actual_tool_calls = EXCLUDED.actual_tool_calls, tool_results = EXCLUDED.tool_results, \
           thoughts = EXCLUDED.thoughts, result = EXCLUDED.result, error = EXCLUDED.error, \
           attempts = EXCLUDED.attempts, usage = EXCLUDED.usage, \
           conversation = EXCLUDED.conversation, run_id = EXCLUDED.run_id, \
           created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, \
           started_at = EXCLUDED.started_at, completed_at = EXCLUDED.completed_at, \
           kind = EXCLUDED.kind, parent_item_id = EXCLUDED.parent_item_id, role = EXCLUDED.role, \
           tool_allowlist = EXCLUDED.tool_allowlist, compacted_output = EXCLUDED.compacted_output",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(item.id.as_str())
    .bind(item.position)
    .bind(&item.description)
    .bind(item.status.as_str())
    .bind(rows::to_json(&item.dependencies)?)
    .bind(item.step_type.as_str())
    .bind(rows::to_json(&item.required_tools)?)
    .bind(item.tool_validation_mode.as_str())
    .bind(item.validation_status.as_str())
    .bind(&item.expected_outcome)
    .bind(rows::to_json(&item.tool_calls)?)
    .bind(rows::to_json(&item.actual_tool_calls)?)
    .bind(rows::to_json(&item.tool_results)?)
    .bind(rows::to_json(&item.thoughts)?)
    .bind(&item.result)
    .bind(rows::opt_json(item.error.as_ref())?)
    .bind(i64::from(item.attempts))
    .bind(rows::to_json(&item.usage)?)
    .bind(rows::to_json(&item.conversation)?)
    .bind(item.run_id)
    .bind(item.created_at)
    .bind(item.updated_at)
    .bind(item.started_at)
    .bind(item.completed_at)
    .bind(item.kind.as_str())
    .bind(item.parent_item_id.as_ref().map(crate::model::ItemId::as_str))
    .bind(&item.role)
    .bind(rows::opt_json(item.tool_allowlist.as_ref())?)
    .bind(&item.compacted_output)
    .execute(conn)
    .await?;
    Ok(())
}

async fn append_message(
    conn: &mut PgConnection,
    tenant: &str,
    thread_id: &ThreadId,
    m: &Message,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO messages (id, tenant, thread_id, run_id, role, content, item_id, \
           tool_call_id, created_at, name, tool_calls) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(m.id)
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(m.run_id)
    .bind(m.role.as_str())
    .bind(&m.content)
    .bind(&m.item_id)
    .bind(&m.tool_call_id)
    .bind(m.created_at)
    .bind(&m.name)
    .bind(if m.tool_calls.is_empty() {
        None
    } else {
        Some(rows::to_json(&m.tool_calls)?)
    })
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_suspension(
    conn: &mut PgConnection,
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
    .bind(s.suspension_id)
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(s.run_id)
    .bind(s.item_id.as_str())
    .bind(s.kind.as_str())
    .bind(rows::to_json(&s.tool_call)?)
    .bind(rows::to_json(&s.allowed_decisions)?)
    .bind(&s.question)
    .bind(&s.input_schema)
    .bind(&s.iteration_state)
    .bind(rows::to_json(&s.partial_tool_results)?)
    .bind(s.status.as_str())
    .bind(s.decision.as_ref().map(rows::to_json).transpose()?)
    .bind(s.created_at)
    .bind(s.resolved_at)
    .bind(s.expires_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Run one op of a batch inside the apply transaction.
async fn apply_op(
    conn: &mut PgConnection,
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
        // Applied by `apply`'s fence statement, with the lease check.
        Op::UpdateRun(_) => Ok(()),
        Op::InsertSuspension(s) => insert_suspension(conn, tenant, thread_id, s).await,
    }
}

/// One round trip claims up to `$3` runs: running runs whose lease expired (earliest first),
/// then, for the slots left, the oldest queued run of each thread with no running or suspended
/// run and no older queued run. Both picks lock with `SKIP LOCKED`, so concurrent claimers take
/// different runs; `runs_one_running_per_thread_idx` backs the one-run-per-thread rule up.
///
/// It returns a row per claimed run, or one row of NULL run columns when none was claimed; every
/// row carries `next_expiry`, the seconds until the earliest lease still in the future runs out
/// (read from the statement's snapshot: the expired leases claimed here do not count, and an
/// expired one that another claimer has locked is that claimer's to take).
const CLAIM_RUNS: &str = "WITH expired AS ( \
      SELECT run_id FROM runs WHERE status = 'running' AND lease_expires_at < now() \
      ORDER BY lease_expires_at LIMIT $3 FOR UPDATE SKIP LOCKED), \
    queued AS ( \
      SELECT r.run_id FROM runs r \
      WHERE r.status = 'queued' AND NOT EXISTS ( \
        SELECT 1 FROM runs o WHERE o.tenant = r.tenant AND o.thread_id = r.thread_id \
          AND (o.status IN ('running', 'suspended') \
               OR (o.status = 'queued' AND (o.created_at, o.run_id) < (r.created_at, r.run_id)))) \
      ORDER BY r.created_at, r.run_id LIMIT $3 - (SELECT count(*) FROM expired) \
      FOR UPDATE OF r SKIP LOCKED), \
    claimed AS ( \
      UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = $1, \
        lease_expires_at = now() + make_interval(secs => $2), \
        started_at = COALESCE(started_at, now()) \
      WHERE run_id IN (SELECT run_id FROM expired UNION ALL SELECT run_id FROM queued) \
      RETURNING *) \
    SELECT c.*, n.next_expiry FROM ( \
      SELECT EXTRACT(EPOCH FROM min(lease_expires_at) - now())::float8 AS next_expiry \
      FROM runs WHERE status = 'running' AND lease_expires_at >= now()) n \
    LEFT JOIN claimed c ON true \
    ORDER BY c.created_at, c.run_id";

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    /// Runs the embedded migrations. sqlx's migrator holds a session advisory lock
    /// (`pg_advisory_lock`) while it works, so replicas starting together apply them once.
    async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ready(&self) -> StoreResult<()> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.pool)
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
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "INSERT INTO threads (tenant, thread_id, metadata, config, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, now(), now()) \
             RETURNING tenant, thread_id, metadata, config, created_at, updated_at, \
               'idle' AS status",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(&metadata)
        .bind(rows::to_json(&config)?)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| {
            if rows::is_unique_violation(&e, Some("threads_pkey")) {
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
        let sql = format!(
            "SELECT {THREAD_COLUMNS} FROM threads t WHERE t.tenant = $1 AND t.thread_id = $2"
        );
        sqlx::query(&sql)
            .bind(tenant)
            .bind(thread_id.as_str())
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(rows::thread_from_row)
            .transpose()
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
            "SELECT {THREAD_COLUMNS} FROM threads t WHERE t.tenant = $1 {after} \
             ORDER BY t.created_at DESC, t.thread_id DESC LIMIT $2"
        );
        let mut q = sqlx::query(&sql).bind(tenant).bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            q = q.bind(c.created_at).bind(&c.id);
        }
        map_rows(&q.fetch_all(&self.pool).await?, rows::thread_from_row)
    }

    async fn update_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        patch: ThreadPatch,
    ) -> StoreResult<Option<Thread>> {
        let sql = format!(
            "WITH t AS (UPDATE threads SET metadata = COALESCE($3, metadata), \
               config = COALESCE($4, config), updated_at = now() \
             WHERE tenant = $1 AND thread_id = $2 RETURNING *) \
             SELECT {THREAD_COLUMNS} FROM t"
        );
        sqlx::query(&sql)
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(&patch.metadata)
            .bind(rows::opt_json(patch.config.as_ref())?)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(rows::thread_from_row)
            .transpose()
    }

    #[instrument(skip_all, fields(%tenant, %thread_id))]
    async fn delete_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM threads WHERE tenant = $1 AND thread_id = $2")
            .bind(tenant)
            .bind(thread_id.as_str())
            .execute(&mut *tx)
            .await?;
        let deleted = done.rows_affected() > 0;
        if deleted {
            let signal = Signal::ThreadDeleted {
                tenant: tenant.to_owned(),
                thread: thread_id.as_str().to_owned(),
            };
            notify(&mut tx, &signal).await?;
        }
        tx.commit().await?;
        Ok(deleted)
    }

    async fn agent_snapshot(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>> {
        // One snapshot for the three reads.
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await?;
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
            q = q.bind(c.created_at).bind(rows::cursor_uuid(&c.id)?);
        }
        map_rows(&q.fetch_all(&self.pool).await?, rows::message_from_row).map(Some)
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
        .fetch_all(&self.pool)
        .await?;
        map_rows(&rows, rows::message_from_row)
    }

    #[instrument(skip_all, fields(tenant = %new.tenant, thread_id = %new.thread_id))]
    async fn create_run(&self, new: NewRun) -> StoreResult<CreatedRun> {
        let mut tx = self.pool.begin().await?;
        let (tenant, thread_id) = (new.tenant.as_str(), &new.thread_id);
        let mut last_seq = lock_thread(&mut tx, tenant, thread_id).await?;
        if last_seq.is_none() && new.create_thread {
            // Concurrent creators wait on the primary key; the loser inserts nothing.
            sqlx::query(
                "INSERT INTO threads (tenant, thread_id, created_at, updated_at) \
                 VALUES ($1, $2, now(), now()) ON CONFLICT DO NOTHING",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO agent_state (tenant, thread_id) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .execute(&mut *tx)
            .await?;
            last_seq = lock_thread(&mut tx, tenant, thread_id).await?;
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

        // Lock the active runs: a concurrent claim either finished (we see `running`) or skips them.
        let active: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT run_id, status FROM runs WHERE tenant = $1 AND thread_id = $2 \
               AND status IN ('queued', 'running', 'suspended') \
             ORDER BY created_at, run_id FOR UPDATE",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .fetch_all(&mut *tx)
        .await?;

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
                let (running, displaced): (Vec<_>, Vec<_>) = active
                    .iter()
                    .partition(|(_, s)| s == RunStatus::Running.as_str());
                let running: Vec<Uuid> = running.into_iter().map(|(id, _)| *id).collect();
                let displaced: Vec<Uuid> = displaced.into_iter().map(|(id, _)| *id).collect();
                if !displaced.is_empty() {
                    sqlx::query(CANCEL_QUEUED_OR_SUSPENDED)
                        .bind(&displaced)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(CANCEL_PENDING_SUSPENSIONS)
                        .bind(&displaced)
                        .execute(&mut *tx)
                        .await?;
                    let obs = displaced
                        .iter()
                        .map(|id| rows::run_cancelled(*id, Some(run_id)))
                        .collect();
                    observations = append_observations(&mut tx, tenant, thread_id, obs).await?;
                }
                if !running.is_empty() {
                    sqlx::query("UPDATE runs SET cancel_requested = TRUE WHERE run_id = ANY($1)")
                        .bind(&running)
                        .execute(&mut *tx)
                        .await?;
                    for run in &running {
                        notify(&mut tx, &Signal::Cancel { run: *run }).await?;
                    }
                }
            }
        }
        let start_seq = observations.last().map_or(last_seq, |o| o.seq);
        // clock_timestamp(): taken after the thread lock, so runs of a thread sort in the order
        // they were enqueued.
        let row = sqlx::query(
            "INSERT INTO runs (run_id, tenant, thread_id, status, query, config, \
               multitask_strategy, idempotency_key, created_at, usage, attempt, phase, \
               cancel_requested, start_seq) \
             VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, clock_timestamp(), $8, 0, 'new', \
               FALSE, $9) RETURNING *",
        )
        .bind(run_id)
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(&new.query)
        .bind(rows::to_json(&new.config)?)
        .bind(new.strategy.as_str())
        .bind(&new.idempotency_key)
        .bind(rows::to_json(&Usage::default())?)
        .bind(start_seq)
        .fetch_one(&mut *tx)
        .await?;
        notify(&mut tx, &Signal::RunReady).await?;
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
        let mut conn = self.pool.acquire().await?;
        let Some(row) =
            sqlx::query("SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3")
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(run_id)
                .fetch_optional(&mut *conn)
                .await?
        else {
            return Ok(None);
        };
        let mut run = rows::run_from_row(&row)?;
        attach_suspensions(&mut conn, std::slice::from_mut(&mut run)).await?;
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
            q = q.bind(c.created_at).bind(rows::cursor_uuid(&c.id)?);
        }
        let mut conn = self.pool.acquire().await?;
        let mut runs = map_rows(&q.fetch_all(&mut *conn).await?, rows::run_from_row)?;
        attach_suspensions(&mut conn, &mut runs).await?;
        Ok(Some(runs))
    }

    #[instrument(skip_all, fields(%tenant, %thread_id, %run_id))]
    async fn cancel_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<CancelledRun> {
        let mut tx = self.pool.begin().await?;
        // Lock order: thread, then run (as create_run and apply).
        if lock_thread(&mut tx, tenant, thread_id).await?.is_none() {
            return Err(StoreError::RunNotFound);
        }
        let status: String = sqlx::query_scalar(
            "SELECT status FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3 \
             FOR UPDATE",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::RunNotFound)?;
        let status: RunStatus = status.parse().map_err(StoreError::Decode)?;
        let (row, observations) = match status {
            RunStatus::Queued | RunStatus::Suspended => {
                let ids = [run_id];
                let row = sqlx::query(CANCEL_QUEUED_OR_SUSPENDED)
                    .bind(&ids[..])
                    .fetch_one(&mut *tx)
                    .await?;
                sqlx::query(CANCEL_PENDING_SUSPENSIONS)
                    .bind(&ids[..])
                    .execute(&mut *tx)
                    .await?;
                let obs = vec![rows::run_cancelled(run_id, None)];
                let obs = append_observations(&mut tx, tenant, thread_id, obs).await?;
                (row, obs)
            }
            RunStatus::Running => {
                let row = sqlx::query(
                    "UPDATE runs SET cancel_requested = TRUE WHERE run_id = $1 RETURNING *",
                )
                .bind(run_id)
                .fetch_one(&mut *tx)
                .await?;
                notify(&mut tx, &Signal::Cancel { run: run_id }).await?;
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
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = match sqlx::query(CLAIM_RUNS)
            .bind(owner)
            .bind(secs(lease))
            .bind(max)
            .fetch_all(&self.pool)
            .await
        {
            Ok(rows) => rows,
            // Another claimer won a thread in a race the candidate query cannot see: nothing was
            // claimed (the statement is atomic); look again at once.
            Err(e) if rows::is_unique_violation(&e, Some("runs_one_running_per_thread_idx")) => {
                return Ok(Claim {
                    runs: Vec::new(),
                    next_expiry: Some(Duration::ZERO),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let mut claim = Claim::default();
        for row in &rows {
            let next: Option<f64> = row.try_get("next_expiry")?;
            claim.next_expiry = next.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
            let run_id: Option<Uuid> = row.try_get("run_id")?;
            if run_id.is_some() {
                claim.runs.push(rows::run_from_row(row)?);
            }
        }
        Ok(claim)
    }

    async fn heartbeat(&self, fence: Fence, lease: Duration) -> StoreResult<bool> {
        let cancel: Option<bool> = sqlx::query_scalar(
            "UPDATE runs SET lease_expires_at = now() + make_interval(secs => $3) \
             WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
             RETURNING cancel_requested",
        )
        .bind(fence.run_id)
        .bind(fence.attempt)
        .bind(secs(lease))
        .fetch_optional(&self.pool)
        .await?;
        lease_lost_if_none(cancel)
    }

    #[instrument(skip_all, fields(run_id = %fence.run_id, attempt = fence.attempt))]
    async fn release_run(&self, fence: Fence) -> StoreResult<()> {
        let done = sqlx::query(
            "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL \
             WHERE run_id = $1 AND attempt = $2 AND status = 'running'",
        )
        .bind(fence.run_id)
        .bind(fence.attempt)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        notify(&mut *self.pool.acquire().await?, &Signal::RunReady).await?;
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
        let n = i64::try_from(observations.len()).map_err(|e| StoreError::Decode(e.to_string()))?;
        // The run's own update (a batch holds at most one: `Batch::op` merges them) rides on the
        // fence statement instead of costing a statement of its own.
        let update = ops.iter().find_map(|op| match op {
            Op::UpdateRun(u) => Some(u.clone()),
            _ => None,
        });
        let u = update.clone().unwrap_or_default();
        let clear_lease = u.status.is_some_and(rows::clears_lease);
        let mut tx = self.pool.begin().await?;
        if !u.unless_decided.is_empty() {
            // A suspend that must see every decision committed before it: take the thread lock
            // first (a resolver holds it while it decides), so the statement below starts with a
            // snapshot taken after any such decision. Inside one statement that waited for the
            // lock, the EXISTS would still read the snapshot from before the wait.
            lock_thread(&mut tx, &tenant, &thread_id).await?;
        }
        // One round trip: lock the thread row and reserve the seqs (thread first: lock order),
        // then check the fence, extend the lease and apply the run's update. No row: the lease is
        // gone; the rollback (dropping `tx`) also takes the counter back.
        let row = sqlx::query(
            "WITH t AS (UPDATE threads SET last_seq = last_seq + $5, \
                          updated_at = CASE WHEN $5 > 0 THEN now() ELSE updated_at END \
                        WHERE tenant = $3 AND thread_id = $4 RETURNING last_seq) \
             UPDATE runs SET \
               lease_expires_at = CASE WHEN $13 THEN NULL \
                                  ELSE now() + make_interval(secs => $6) END, \
               lease_owner = CASE WHEN $13 THEN NULL ELSE lease_owner END, \
               status = CASE WHEN $7 = 'suspended' AND EXISTS (SELECT 1 FROM suspensions s \
                          WHERE s.suspension_id = ANY($14) AND s.status <> 'pending') \
                        THEN 'queued' ELSE COALESCE($7, status) END, \
               phase = COALESCE($8, phase), \
               usage = COALESCE($9, usage), error = COALESCE($10, error), \
               final_response = COALESCE($11, final_response), \
               ended_at = CASE WHEN $12 THEN now() ELSE ended_at END \
             WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
               AND tenant = $3 AND thread_id = $4 AND EXISTS (SELECT 1 FROM t) \
             RETURNING cancel_requested, (SELECT last_seq FROM t) AS last_seq, now() AS now",
        )
        .bind(fence.run_id)
        .bind(fence.attempt)
        .bind(&tenant)
        .bind(thread_id.as_str())
        .bind(n)
        .bind(secs(lease))
        .bind(u.status.map(RunStatus::as_str))
        .bind(u.phase.map(RunPhase::as_str))
        .bind(rows::opt_json(u.usage.as_ref())?)
        .bind(rows::opt_json(u.error.as_ref())?)
        .bind(&u.final_response)
        .bind(u.ended)
        .bind(clear_lease)
        .bind(&u.unless_decided)
        .fetch_optional(&mut *tx)
        .await?;
        let row = lease_lost_if_none(row)?;
        let cancel_requested: bool = row.try_get("cancel_requested")?;
        let last_seq: i64 = row.try_get("last_seq")?;
        let now: DateTime<Utc> = row.try_get("now")?;
        for op in &ops {
            apply_op(&mut tx, &tenant, &thread_id, op).await?;
        }
        if clear_lease {
            // The thread is free (or the run waits for a person): a queued run may start.
            notify(&mut tx, &Signal::RunReady).await?;
        }
        let observations = insert_observations(
            &mut tx,
            &tenant,
            &thread_id,
            last_seq - n + 1,
            now,
            observations,
        )
        .await?;
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
        let types: Option<Vec<&str>> = query
            .types
            .as_ref()
            .map(|ts| ts.iter().map(|t| t.as_str()).collect());
        let rows = sqlx::query(
            "SELECT * FROM observations WHERE tenant = $1 AND thread_id = $2 AND seq > $3 \
               AND ($4::text[] IS NULL OR type = ANY($4)) \
               AND ($5::text IS NULL OR parent_id = $5) \
               AND ($6::uuid IS NULL OR run_id = $6) \
             ORDER BY seq LIMIT $7",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(query.after)
        .bind(types)
        .bind(&query.parent_id)
        .bind(query.run_id)
        .bind(rows::sql_limit(query.limit))
        .fetch_all(&self.pool)
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
        .fetch_all(&self.pool)
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
            .bind(suspension_id)
            .fetch_optional(&self.pool)
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
        let mut tx = self.pool.begin().await?;
        // Which thread and run to lock (no lock yet: the order is thread, run, suspension).
        let (thread_id, run_id): (String, Uuid) = sqlx::query_as(
            "SELECT thread_id, run_id FROM suspensions WHERE tenant = $1 AND suspension_id = $2",
        )
        .bind(tenant)
        .bind(suspension_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::SuspensionNotFound)?;
        let thread_id = ThreadId::from_stored(thread_id);
        // The thread lock serializes concurrent resolvers (and cancels, applies) of this thread.
        if lock_thread(&mut tx, tenant, &thread_id).await?.is_none() {
            return Err(StoreError::SuspensionNotFound);
        }
        let run_status: Option<String> =
            sqlx::query_scalar("SELECT status FROM runs WHERE run_id = $1 FOR UPDATE")
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await?;
        // Compare-and-set: only a pending suspension moves.
        let row = sqlx::query(
            "UPDATE suspensions SET status = $3, decision = $4, resolved_at = now() \
             WHERE tenant = $1 AND suspension_id = $2 AND status = 'pending' RETURNING *",
        )
        .bind(tenant)
        .bind(suspension_id)
        .bind(status.as_str())
        .bind(rows::to_json(&decision)?)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            let current: Option<String> =
                sqlx::query_scalar("SELECT status FROM suspensions WHERE suspension_id = $1")
                    .bind(suspension_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            return Err(match current {
                Some(current) => StoreError::Conflict(format!("suspension already {current}")),
                None => StoreError::SuspensionNotFound,
            });
        };
        let suspension = rows::suspension_from_row(&row)?;
        // A suspended run goes back to the queue (its lease was cleared when it suspended; the
        // next claim bumps attempt). A run still busy with other items, or queued, reads the
        // decision when it next looks (a running run that then finds nothing else to do is
        // queued again by its own suspend commit: see `RunUpdate::unless_decided`).
        let run_row = sqlx::query(
            "UPDATE runs SET status = CASE WHEN status = 'suspended' THEN 'queued' ELSE status END \
             WHERE run_id = $1 AND status IN ('suspended', 'queued', 'running') RETURNING *",
        )
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(run_row) = run_row else {
            // Dropping `tx` rolls the suspension back: it stays pending.
            let run_status = run_status.as_deref().unwrap_or("gone");
            return Err(StoreError::Conflict(format!(
                "the suspension's run is {run_status}: it takes no more decisions"
            )));
        };
        let obs = vec![rows::agent_resumed(&suspension, &decision, expired)];
        let observations = append_observations(&mut tx, tenant, &thread_id, obs).await?;
        notify(&mut tx, &Signal::RunReady).await?;
        if run_status.as_deref() == Some("running") {
            notify(&mut tx, &Signal::Decided { run: run_id }).await?;
        }
        tx.commit().await?;
        Ok(ResolvedSuspension {
            suspension,
            run: rows::run_from_row(&run_row)?,
            observations,
        })
    }

    async fn due_suspensions(&self, limit: u32) -> StoreResult<Vec<(String, Uuid)>> {
        // The predicate matches the partial index `suspensions_expiry_idx`.
        let due = sqlx::query_as(
            "SELECT tenant, suspension_id FROM suspensions \
             WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at < now() \
             ORDER BY expires_at, suspension_id LIMIT $1",
        )
        .bind(rows::sql_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(due)
    }

    async fn signals(&self) -> StoreResult<Option<BoxStream<'static, Signal>>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen("pes").await?;
        // `into_stream` reconnects after a lost connection (notifications sent meanwhile are
        // lost: the callers' polls cover that); errors in between are skipped.
        let stream = listener
            .into_stream()
            .filter_map(|n| async move {
                match n {
                    Ok(n) => serde_json::from_str::<Signal>(n.payload()).ok(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection error; reconnecting");
                        None
                    }
                }
            })
            .boxed();
        Ok(Some(stream))
    }

    async fn thread_seqs(
        &self,
        threads: &[(String, ThreadId)],
    ) -> StoreResult<Vec<(String, ThreadId, i64)>> {
        if threads.is_empty() {
            return Ok(Vec::new());
        }
        let tenants: Vec<&str> = threads.iter().map(|(t, _)| t.as_str()).collect();
        let ids: Vec<&str> = threads.iter().map(|(_, id)| id.as_str()).collect();
        let rows = sqlx::query(
            "SELECT t.tenant, t.thread_id, t.last_seq FROM threads t \
             JOIN UNNEST($1::text[], $2::text[]) AS k(tenant, thread_id) \
               ON t.tenant = k.tenant AND t.thread_id = k.thread_id",
        )
        .bind(&tenants)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>("tenant")?,
                    ThreadId::from_stored(r.try_get("thread_id")?),
                    r.try_get::<i64, _>("last_seq")?,
                ))
            })
            .collect()
    }
}
