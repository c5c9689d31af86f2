//! Threads, their agent state, conversation and observation log: create, read, list, patch,
//! delete, the engine's snapshot, the messages and the observations. Written once for both
//! dialects.

use serde_json::Value;

use super::ItemDetail;
use super::rows;
use super::sql::{Arg, Conn, Q, Row, q};
use super::sql_store::SqlStore;
use super::tables::item_view_columns;
use super::{
    AgentSnapshot, ObservationQuery, PageCursor, Signal, StoreError, StoreResult, ThreadPatch,
};
use crate::model::{
    AgentConfig, AssistantPin, LAST_QUERY_CHARS, Message, Observation, Thread, ThreadId,
    ThreadSummary,
};

/// Refuse one more thread of `tenant` when it holds `max` already ([`StoreError::OverQuota`]):
/// counted exactly, under the tenant's lock, in the transaction that creates the thread (see
/// `quotas`). Forks count, the ones still being copied included.
pub(crate) async fn thread_quota(conn: &mut Conn, tenant: &str, max: u64) -> StoreResult<()> {
    let counted = "FROM threads WHERE tenant = $1";
    if super::quotas::room(conn, "threads", counted, tenant, max, 1).await? {
        return Ok(());
    }
    Err(StoreError::OverQuota {
        what: "threads",
        setting: "PES_TENANT_MAX_THREADS; forks count",
        max,
        hint: "delete threads, or let them expire, first",
        retry_after_seconds: 60,
    })
}

/// A thread with its status derived from its runs: `busy` while one is queued or running,
/// `suspended` while one waits for a person, `error` when the newest failed, else `idle`.
/// Expects the thread row aliased `t`.
const THREAD_COLUMNS: &str = "t.tenant, t.thread_id, t.metadata, t.config, t.created_at, \
    t.updated_at, t.assistant_id, t.assistant_version, \
    CASE \
      WHEN EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                   AND r.status IN ('queued', 'running')) THEN 'busy' \
      WHEN EXISTS (SELECT 1 FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                   AND r.status = 'suspended') THEN 'suspended' \
      WHEN (SELECT r.status FROM runs r WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
            ORDER BY r.created_at DESC, r.run_id DESC LIMIT 1) = 'failed' THEN 'error' \
      ELSE 'idle' \
    END AS status";

pub(crate) fn map_rows<T>(rows: &[Row], f: impl Fn(&Row) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(f).collect()
}

/// Lock the thread row (the first lock of every multi-row write: thread → run → suspension);
/// its `last_seq`, or `None` when the thread does not exist.
pub(crate) async fn lock_thread(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
) -> StoreResult<Option<i64>> {
    conn.opt(
        q("SELECT last_seq FROM threads WHERE tenant = $1 AND thread_id = $2 AND NOT copying {lock}")
            .bind(tenant)
            .bind(thread_id.as_str()),
    )
    .await?
    .map(|r| r.int("last_seq"))
    .transpose()
}

async fn thread_in(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
) -> StoreResult<Option<Thread>> {
    conn.opt(
        q(format!(
            "SELECT {THREAD_COLUMNS} FROM threads t WHERE t.tenant = $1 AND t.thread_id = $2 \
             AND NOT t.copying"
        ))
        .bind(tenant)
        .bind(thread_id.as_str()),
    )
    .await?
    .as_ref()
    .map(rows::thread_from_row)
    .transpose()
}

impl SqlStore {
    /// Whether the tenant has this thread (the list methods answer `None` when not).
    pub(crate) async fn thread_exists(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<bool> {
        Ok(self
            .read()
            .await?
            .opt(
                q("SELECT 1 AS one FROM threads WHERE tenant = $1 AND thread_id = $2 AND NOT copying")
                    .bind(tenant)
                    .bind(thread_id.as_str()),
            )
            .await?
            .is_some())
    }

    /// Create a thread with empty agent state and no assistant.
    ///
    /// # Errors
    /// [`StoreError::ThreadExists`] when the tenant already has a thread with this id.
    pub async fn create_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        metadata: Value,
        config: AgentConfig,
    ) -> StoreResult<Thread> {
        self.create_thread_using(tenant, thread_id, metadata, config, None)
            .await
    }

    /// Create a thread with empty agent state whose runs use `assistant` (checked by the
    /// caller).
    ///
    /// # Errors
    /// [`StoreError::ThreadExists`] when the tenant already has a thread with this id.
    pub async fn create_thread_using(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        metadata: Value,
        config: AgentConfig,
        assistant: Option<&AssistantPin>,
    ) -> StoreResult<Thread> {
        let mut tx = self.write().await?;
        thread_quota(&mut tx, tenant, self.max_threads).await?;
        let row = tx
            .one(
                q(
                    "INSERT INTO threads (tenant, thread_id, metadata, config, created_at, \
                     updated_at, assistant_id, assistant_version) \
                   VALUES ($1, $2, $3, $4, {now}, {now}, $5, $6) \
                   RETURNING tenant, thread_id, metadata, config, created_at, updated_at, \
                     assistant_id, assistant_version, 'idle' AS status",
                )
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(metadata)
                .bind(rows::to_json(&config)?)
                .bind(assistant.map(|a| a.assistant_id.as_str()))
                .bind(Arg::Int(assistant.and_then(|a| a.version))),
            )
            .await
            .map_err(|e| match e {
                StoreError::Database(e) if rows::is_unique_violation(&e, Some("threads_pkey")) => {
                    StoreError::ThreadExists
                }
                e => e,
            })?;
        tx.exec(
            q("INSERT INTO agent_state (tenant, thread_id) VALUES ($1, $2)")
                .bind(tenant)
                .bind(thread_id.as_str()),
        )
        .await?;
        tx.commit().await?;
        rows::thread_from_row(&row)
    }

    /// The thread, with its status derived from its runs.
    pub async fn get_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<Thread>> {
        thread_in(&mut self.read().await?, tenant, thread_id).await
    }

    /// Newest first (`created_at` desc, then id desc), each with its title and last query; at
    /// most `limit` rows after `cursor` (`limit` 0: no limit, in every list method).
    pub async fn list_threads(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<ThreadSummary>> {
        let after = if cursor.is_some() {
            "AND (t.created_at, t.thread_id) < ($3, $4)"
        } else {
            ""
        };
        // One query for the page: the title from the agent state (one row per thread, by its
        // key) and the newest run's query by `runs_thread_idx`, cut to what a list shows.
        let mut stmt = q(format!(
            "SELECT {THREAD_COLUMNS}, a.title, \
               (SELECT substr(r.query, 1, {LAST_QUERY_CHARS}) FROM runs r \
                WHERE r.tenant = t.tenant AND r.thread_id = t.thread_id \
                ORDER BY r.created_at DESC, r.run_id DESC LIMIT 1) AS last_query \
             FROM threads t LEFT JOIN agent_state a \
               ON a.tenant = t.tenant AND a.thread_id = t.thread_id \
             WHERE t.tenant = $1 AND NOT t.copying {after} \
             ORDER BY t.created_at DESC, t.thread_id DESC LIMIT $2"
        ))
        .bind(tenant)
        .bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            stmt = stmt.bind(c.created_at).bind(&c.id);
        }
        map_rows(&self.read().await?.all(stmt).await?, |r| {
            Ok(ThreadSummary {
                thread: rows::thread_from_row(r)?,
                title: r.opt_text("title")?,
                last_query: r.opt_text("last_query")?,
            })
        })
    }

    /// Change the fields `patch` sets; `None` when the thread does not exist.
    pub async fn update_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        patch: ThreadPatch,
    ) -> StoreResult<Option<Thread>> {
        let mut tx = self.write().await?;
        // `$5`: whether the assistant changes (to `$6`, `$7`, NULLs detaching it).
        let assistant = patch.assistant.as_ref();
        let pin = assistant.and_then(Option::as_ref);
        let changed = tx
            .exec(
                q("UPDATE threads SET metadata = COALESCE($3, metadata), \
                     config = COALESCE($4, config), updated_at = {now}, \
                     assistant_id = CASE WHEN $5 THEN $6 ELSE assistant_id END, \
                     assistant_version = CASE WHEN $5 THEN $7 ELSE assistant_version END \
                   WHERE tenant = $1 AND thread_id = $2")
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(patch.metadata)
                .bind(rows::opt_json(patch.config.as_ref())?)
                .bind(assistant.is_some())
                .bind(pin.map(|p| p.assistant_id.as_str()))
                .bind(Arg::Int(pin.and_then(|p| p.version))),
            )
            .await?;
        if changed == 0 {
            return Ok(None);
        }
        let thread = thread_in(&mut tx, tenant, thread_id).await?;
        tx.commit().await?;
        Ok(thread)
    }

    /// Delete the thread and everything it owns; false when it did not exist.
    pub async fn delete_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        let mut tx = self.write().await?;
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

    /// What the engine reads of a thread: its agent state, todo items (with their ReAct
    /// conversations, which a run continues from) and pending suspension, from one snapshot;
    /// `None` when the thread does not exist.
    pub async fn agent_snapshot(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>> {
        self.snapshot_with(tenant, thread_id, ItemDetail::Full)
            .await
    }

    /// What the state view shows of a thread now: [`Self::agent_snapshot`] without the items'
    /// conversations (the view leaves them out).
    pub async fn state_snapshot(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>> {
        self.snapshot_with(tenant, thread_id, ItemDetail::View)
            .await
    }

    async fn snapshot_with(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        detail: ItemDetail,
    ) -> StoreResult<Option<AgentSnapshot>> {
        // One snapshot for the three reads.
        let mut tx = self.snapshot().await?;
        let key = |sql: &'static str| q(sql).bind(tenant).bind(thread_id.as_str());
        let Some(state) = tx
            .opt(key(
                "SELECT * FROM agent_state WHERE tenant = $1 AND thread_id = $2",
            ))
            .await?
        else {
            return Ok(None);
        };
        let columns = match detail {
            ItemDetail::Full => "i.*".to_owned(),
            ItemDetail::View => item_view_columns(tx.dialect(), "i"),
        };
        let items = tx
            .all(
                q(format!(
                    "SELECT {columns} FROM todo_items i WHERE tenant = $1 AND thread_id = $2 \
                     ORDER BY position, item_id"
                ))
                .bind(tenant)
                .bind(thread_id.as_str()),
            )
            .await?;
        let pending = tx
            .opt(key(
                "SELECT * FROM suspensions WHERE tenant = $1 AND thread_id = $2 \
                   AND status = 'pending' ORDER BY created_at DESC, suspension_id DESC LIMIT 1",
            ))
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

    /// Conversation history, oldest first; `None` when the thread does not exist.
    pub async fn list_messages(
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
        let mut stmt = q(format!(
            "SELECT * FROM messages WHERE tenant = $1 AND thread_id = $2 {after} \
             ORDER BY created_at, id LIMIT $3"
        ))
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            stmt = stmt.bind(c.created_at).bind(rows::cursor_uuid(&c.id)?);
        }
        map_rows(&self.read().await?.all(stmt).await?, rows::message_from_row).map(Some)
    }

    /// The newest `limit` messages of the thread-level conversation (the user's queries and the
    /// final answers: no item's tool-call turns or tool results), oldest first: the planner's
    /// context.
    pub async fn recent_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
    ) -> StoreResult<Vec<Message>> {
        let rows = self
            .read()
            .await?
            .all(
                q(
                    "SELECT * FROM (SELECT * FROM messages WHERE tenant = $1 AND thread_id = $2 \
                     AND item_id IS NULL AND role IN ('user', 'assistant') \
                   ORDER BY created_at DESC, id DESC LIMIT $3) m \
                   ORDER BY created_at, id",
                )
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(i64::from(limit)),
            )
            .await?;
        map_rows(&rows, rows::message_from_row)
    }

    /// Observations in `seq` order; `None` when the thread does not exist.
    pub async fn list_observations(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        query: &ObservationQuery,
    ) -> StoreResult<Option<Vec<Observation>>> {
        if !self.thread_exists(tenant, thread_id).await? {
            return Ok(None);
        }
        // Only the filters given become SQL (`$N` numbered as they are bound).
        let mut sql = String::from(
            "SELECT * FROM observations WHERE tenant = $1 AND thread_id = $2 AND seq > $3",
        );
        let mut args: Vec<Arg> = vec![tenant.into(), thread_id.as_str().into(), query.after.into()];
        if let Some(types) = &query.types {
            args.push(Arg::Texts(
                types.iter().map(|t| t.as_str().to_owned()).collect(),
            ));
            sql.push_str(&format!(" AND {{in type {}}}", args.len()));
        }
        if let Some(parent) = &query.parent_id {
            args.push(parent.into());
            sql.push_str(&format!(" AND parent_id = ${}", args.len()));
        }
        if let Some(run) = query.run_id {
            args.push(run.into());
            sql.push_str(&format!(" AND run_id = ${}", args.len()));
        }
        args.push(rows::sql_limit(query.limit).into());
        sql.push_str(&format!(" ORDER BY seq LIMIT ${}", args.len()));
        let stmt = args.into_iter().fold(q(sql), Q::bind);
        map_rows(
            &self.read().await?.all(stmt).await?,
            rows::observation_from_row,
        )
        .map(Some)
    }
}
