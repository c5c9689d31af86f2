//! Retention: which threads have had no run activity for long enough — their
//! own time-to-live passed, or a tenant's prune asks for them — deleting them one at a time
//! under the thread row's lock, and what a thread stores.
//!
//! A thread's last activity is its `updated_at`: set at creation, and moved by every observation
//! its runs commit (a run's start, each step, its end, a decision) and by every change of the
//! thread. Activity never counts a thread with a run queued, running or suspended: such a thread
//! is never selected, whatever its age. A suspended run waits for a person; its thread is kept
//! until the suspension is decided or expires (`suspensionTtlSeconds`), and the clock starts
//! again from the run's end.
//!
//! Deleting is exactly once across replicas: [`SqlStore::delete_idle_thread`] locks the thread
//! row only if it is still idle (Postgres `FOR UPDATE SKIP LOCKED`, so two replicas sweeping at
//! once never wait on each other and never both delete; SQLite's one writer serializes), then
//! checks for active runs in a fresh statement (a run enqueued before the lock is seen; one
//! enqueued after it waits for the thread row and finds the thread gone), and deletes.
//!
//! Dialect differences (reading an integer out of a JSON config, "now minus N seconds") are
//! rendered here, as they concern only these queries.

use super::sql::{Arg, Conn, Dialect, q};
use super::sql_store::SqlStore;
use super::{Signal, StoreResult};
use crate::model::{ThreadId, ThreadStatus};

/// Which threads are idle enough to delete.
#[derive(Debug, Clone)]
pub enum Idle {
    /// Threads whose time-to-live has passed: their config's `ttlSeconds`, else their
    /// assistant version's (the version's own value when it locks the field), else
    /// `default_ttl` (`PES_THREAD_TTL_SECONDS`); 0 at the first of these that is set means never.
    Expired { default_ttl: u64 },
    /// One tenant's threads without activity for `older_than` seconds, whose status (as the
    /// thread list shows it) is `status` when given: only `idle` or `error` can match, a thread
    /// with an active run never does.
    Stale {
        tenant: String,
        older_than: u64,
        status: Option<ThreadStatus>,
    },
}

/// Rows and bytes of one kind of record a thread owns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub rows: u64,
    /// The size of the rows' stored text and JSON (ids, timestamps and indexes not counted).
    pub bytes: u64,
}

/// The columns of an item (and of its versions) whose size counts in a thread's footprint.
const ITEM_TEXT: &[&str] = &[
    "item_id",
    "description",
    "dependencies",
    "required_tools",
    "expected_outcome",
    "tool_calls",
    "actual_tool_calls",
    "tool_results",
    "thoughts",
    "result",
    "error",
    "usage",
    "conversation",
    "tool_allowlist",
    "compacted_output",
];

/// What a thread stores, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadStorage {
    pub observations: Footprint,
    pub messages: Footprint,
    pub items: Footprint,
    pub runs: Footprint,
    /// The commit log and the versions of state rows (`history.rs`).
    pub history: Footprint,
}

/// `col`'s JSON member `ttlSeconds` as an integer (NULL when absent).
fn ttl_of(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Postgres => format!("({col}->>'ttlSeconds')::bigint"),
        Dialect::Sqlite => format!("json_extract({col}, '$.ttlSeconds')"),
    }
}

/// Whether the assistant version `v` locks `ttlSeconds`.
fn ttl_locked(d: Dialect) -> &'static str {
    match d {
        Dialect::Postgres => "COALESCE(v.locked @> '[\"ttlSeconds\"]'::jsonb, false)",
        Dialect::Sqlite => "EXISTS (SELECT 1 FROM json_each(v.locked) WHERE value = 'ttlSeconds')",
    }
}

/// The instant `secs` (an SQL integer expression) seconds ago, comparable with a stored
/// timestamp.
fn ago(d: Dialect, secs: &str) -> String {
    match d {
        Dialect::Postgres => format!("(now() - make_interval(secs => {secs}))"),
        Dialect::Sqlite => format!(
            "(strftime('%Y-%m-%dT%H:%M:%f', 'now', '-' || ({secs}) || ' seconds') || '000Z')"
        ),
    }
}

/// The joins that find a thread's assistant version (its pinned one, else the current one of a
/// live assistant).
const ASSISTANT_JOINS: &str = "LEFT JOIN assistants a ON a.tenant = t.tenant \
       AND a.assistant_id = t.assistant_id AND a.deleted_at IS NULL \
     LEFT JOIN assistant_versions v ON v.tenant = a.tenant AND v.assistant_id = a.assistant_id \
       AND v.version = COALESCE(t.assistant_version, a.current_version)";

/// No run of thread `t` occupies it, and no fork is being copied into it.
const NO_ACTIVE_RUN: &str = "NOT t.copying AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant \
    AND r.thread_id = t.thread_id AND r.status IN ('queued', 'running', 'suspended'))";

/// The status of thread `t`'s newest run.
const NEWEST_RUN_STATUS: &str = "(SELECT r.status FROM runs r WHERE r.tenant = t.tenant \
    AND r.thread_id = t.thread_id ORDER BY r.created_at DESC, r.run_id DESC LIMIT 1)";

/// `FROM … WHERE …` selecting the threads `which` names (aliased `t`), its bind values from
/// `$first` on; the caller adds its own conditions with `AND`.
fn idle_from(d: Dialect, which: &Idle, first: usize) -> (String, Vec<Arg>) {
    match which {
        Idle::Expired { default_ttl } => {
            let ttl = format!(
                "COALESCE(CASE WHEN {locked} THEN NULL ELSE {own} END, {theirs}, ${first})",
                locked = ttl_locked(d),
                own = ttl_of(d, "t.config"),
                theirs = ttl_of(d, "v.config"),
            );
            let sql = format!(
                "FROM threads t {ASSISTANT_JOINS} WHERE {ttl} > 0 AND t.updated_at < {cutoff}",
                cutoff = ago(d, &ttl)
            );
            let ttl = i64::try_from(*default_ttl).unwrap_or(i64::MAX);
            (sql, vec![Arg::Int(Some(ttl))])
        }
        Idle::Stale {
            tenant,
            older_than,
            status,
        } => {
            let status = match status {
                Some(ThreadStatus::Error) => format!(" AND {NEWEST_RUN_STATUS} = 'failed'"),
                Some(ThreadStatus::Idle) => {
                    format!(" AND COALESCE({NEWEST_RUN_STATUS}, '') <> 'failed'")
                }
                // Statuses that say a run is active: nothing idle has them.
                Some(_) => " AND 1 = 0".to_owned(),
                None => String::new(),
            };
            let sql = format!(
                "FROM threads t WHERE t.tenant = ${first} AND t.updated_at < {cutoff}{status}",
                cutoff = ago(d, &format!("${}", first + 1))
            );
            let older = i64::try_from(*older_than).unwrap_or(i64::MAX);
            (sql, vec![tenant.into(), Arg::Int(Some(older))])
        }
    }
}

/// Bind `args` in order.
fn bound(sql: String, args: Vec<Arg>) -> super::sql::Q {
    args.into_iter().fold(q(sql), super::sql::Q::bind)
}

/// What a thread stores, table by table: (the kind `ThreadStorage` reports it as, the table,
/// the columns whose size counts). The thread's own row comes first: no rows there, no thread.
const THREAD_TABLES: [(&str, &str, &[&str]); 7] = [
    ("thread", "threads", &["thread_id"]),
    (
        "observations",
        "observations",
        &["type", "title", "parent_id", "content"],
    ),
    (
        "messages",
        "messages",
        &[
            "role",
            "content",
            "item_id",
            "tool_call_id",
            "name",
            "tool_calls",
        ],
    ),
    ("items", "todo_items", ITEM_TEXT),
    (
        "runs",
        "runs",
        &[
            "query",
            "config",
            "usage",
            "error",
            "final_response",
            "idempotency_key",
        ],
    ),
    (
        "history",
        "agent_state_versions",
        &["intent", "title", "plan", "current_step_id"],
    ),
    ("history", "todo_item_versions", ITEM_TEXT),
];

/// `COALESCE(sum(bytes of each column), 0)`, each column counted as its text (JSON as written
/// out), NULL as nothing.
fn bytes_of(columns: &[&str]) -> String {
    let each: Vec<String> = columns
        .iter()
        .map(|c| format!("COALESCE(octet_length(CAST({c} AS TEXT)), 0)"))
        .collect();
    format!("COALESCE(sum({}), 0)", each.join(" + "))
}

impl SqlStore {
    /// Threads `which` selects that have no active run, oldest activity first: at most `limit`
    /// (`tenant`, `thread_id`) pairs. Read without locks: [`SqlStore::delete_idle_thread`]
    /// checks each again.
    pub async fn idle_threads(
        &self,
        which: &Idle,
        limit: u32,
    ) -> StoreResult<Vec<(String, ThreadId)>> {
        let d = self.dialect();
        let (from, mut args) = idle_from(d, which, 1);
        args.push(Arg::Int(Some(i64::from(limit))));
        let sql = format!(
            "SELECT t.tenant, t.thread_id {from} AND {NO_ACTIVE_RUN} \
             ORDER BY t.updated_at, t.tenant, t.thread_id LIMIT ${}",
            args.len()
        );
        let rows = self.read().await?.all(bound(sql, args)).await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.text("tenant")?,
                    ThreadId::from_stored(r.text("thread_id")?),
                ))
            })
            .collect()
    }

    /// Delete the thread with everything it owns if `which` still selects it and no run is
    /// active on it, telling other replicas (their streams of it end); false when it is gone,
    /// no longer idle, or being deleted by another replica right now. Exactly once across
    /// replicas (see the module doc).
    pub async fn delete_idle_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        which: &Idle,
    ) -> StoreResult<bool> {
        let mut tx = self.write().await?;
        let d = tx.dialect();
        let (from, mut args) = idle_from(d, which, 1);
        let n = args.len();
        args.push(tenant.into());
        args.push(thread_id.as_str().into());
        let skip = match d {
            Dialect::Postgres => "FOR UPDATE OF t SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "SELECT 1 AS one {from} AND t.tenant = ${} AND t.thread_id = ${} {skip}",
            n + 1,
            n + 2
        );
        if tx.opt(bound(sql, args)).await?.is_none() {
            return Ok(false);
        }
        // A fresh statement: sees every run committed before the lock was taken.
        if active_run(&mut tx, tenant, thread_id).await? {
            return Ok(false);
        }
        super::history::delete_history(&mut tx, tenant, thread_id).await?;
        let deleted = tx
            .exec(
                q("DELETE FROM threads WHERE tenant = $1 AND thread_id = $2")
                    .bind(tenant)
                    .bind(thread_id.as_str()),
            )
            .await?
            > 0;
        if deleted {
            tx.notify(&Signal::ThreadDeleted {
                tenant: tenant.to_owned(),
                thread: thread_id.as_str().to_owned(),
            })
            .await?;
        }
        tx.commit().await?;
        Ok(deleted)
    }

    /// Delete at most `batch` forks whose copy stopped (its process died mid-copy): threads
    /// still `copying` that no batch touched for `idle_secs`. How many were deleted.
    pub async fn delete_stalled_forks(&self, idle_secs: u64, batch: u32) -> StoreResult<u64> {
        let d = self.dialect();
        let stalled = self
            .read()
            .await?
            .all(
                q(format!(
                    "SELECT tenant, thread_id FROM threads WHERE copying \
                     AND updated_at < {cutoff} LIMIT $2",
                    cutoff = ago(d, "$1")
                ))
                .bind(i64::try_from(idle_secs).unwrap_or(i64::MAX))
                .bind(i64::from(batch)),
            )
            .await?;
        let mut deleted = 0;
        for row in &stalled {
            let (tenant, thread) = (row.text("tenant")?, row.text("thread_id")?);
            let mut tx = self.write().await?;
            // Checked again under the writer: a copy that moved since is not stalled.
            deleted += tx
                .exec(
                    q(format!(
                        "DELETE FROM threads WHERE tenant = $1 AND thread_id = $2 AND copying \
                         AND updated_at < {cutoff}",
                        cutoff = ago(d, "$3")
                    ))
                    .bind(tenant)
                    .bind(thread)
                    .bind(i64::try_from(idle_secs).unwrap_or(i64::MAX)),
                )
                .await?;
            tx.commit().await?;
        }
        Ok(deleted)
    }

    /// The bytes the tenant stores: what [`SqlStore::thread_storage`] counts, over all its
    /// threads, plus its memory store items. One read of every row the tenant owns, so callers
    /// count it now and then (see `PES_TENANT_STORAGE_RECOUNT_SECONDS`), not on every write.
    pub async fn tenant_bytes(&self, tenant: &str) -> StoreResult<u64> {
        let parts: Vec<String> = THREAD_TABLES
            .iter()
            .map(|(_, table, columns)| (*table, *columns))
            .chain([(
                "memory_items",
                &["namespace", "key", "value", "content"][..],
            )])
            .map(|(table, columns)| {
                format!(
                    "(SELECT {bytes} FROM {table} WHERE tenant = $1)",
                    bytes = bytes_of(columns)
                )
            })
            .collect();
        let n = self
            .read()
            .await?
            .one(q(format!("SELECT {} AS bytes", parts.join(" + "))).bind(tenant))
            .await?
            .int("bytes")?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// What the thread stores: rows and bytes of its observations, messages, todo items, runs
    /// and history, read in one statement (one consistent view); `None` when the tenant has no such
    /// thread.
    pub async fn thread_storage(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<ThreadStorage>> {
        let sql = THREAD_TABLES
            .iter()
            .map(|(name, table, columns)| {
                format!(
                    "SELECT '{name}' AS kind, count(*) AS n, {bytes} AS bytes FROM {table} \
                     WHERE tenant = $1 AND thread_id = $2",
                    bytes = bytes_of(columns)
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let rows = self
            .read()
            .await?
            .all(q(sql).bind(tenant).bind(thread_id.as_str()))
            .await?;
        let mut storage = ThreadStorage::default();
        for row in &rows {
            let n = |c: &str| row.int(c).map(|v| u64::try_from(v).unwrap_or(0));
            let footprint = Footprint {
                rows: n("n")?,
                bytes: n("bytes")?,
            };
            match row.text("kind")?.as_str() {
                "thread" if footprint.rows == 0 => return Ok(None),
                "observations" => storage.observations = footprint,
                "messages" => storage.messages = footprint,
                "items" => storage.items = footprint,
                "runs" => storage.runs = footprint,
                "history" => {
                    storage.history.rows += footprint.rows;
                    storage.history.bytes += footprint.bytes;
                }
                _ => {}
            }
        }
        Ok(Some(storage))
    }
}

/// Whether a run of the thread is queued, running or suspended.
async fn active_run(conn: &mut Conn, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
    Ok(conn
        .opt(
            q(
                "SELECT 1 AS one FROM runs WHERE tenant = $1 AND thread_id = $2 \
               AND status IN ('queued', 'running', 'suspended') LIMIT 1",
            )
            .bind(tenant)
            .bind(thread_id.as_str()),
        )
        .await?
        .is_some())
}
