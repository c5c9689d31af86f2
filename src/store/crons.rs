//! Crons: their rows, and the scheduler's claim and advance. Written once for
//! both dialects.
//!
//! Exactly one run per tick, across replicas: a replica claims a due cron under a lease (a
//! conditional update: `SKIP LOCKED` on Postgres, the one writer on SQLite), enqueues the tick's
//! run under the idempotency key that names the tick, then advances `next_run_at` fenced by its
//! lease and the tick it claimed. A replica that dies in between leaves the lease to run out; the
//! next claimer enqueues the same key and gets the same run.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::fragments::lease_secs;
use super::rows;
use super::sql::{Arg, Dialect, Q, Row, q};
use super::sql_store::SqlStore;
use super::threads::map_rows;
use super::{PageCursor, StoreError, StoreResult};
use crate::model::{AgentConfig, AssistantId, Cron, MultitaskStrategy, OnMissed, ThreadId};

/// A cron as created or replaced: every field a client sets, and the next tick.
#[derive(Debug, Clone)]
pub struct CronDraft {
    pub thread_id: Option<ThreadId>,
    pub assistant_id: Option<AssistantId>,
    pub schedule: String,
    pub timezone: String,
    pub query: String,
    pub config: AgentConfig,
    pub multitask_strategy: Option<MultitaskStrategy>,
    pub enabled: bool,
    pub on_missed: OnMissed,
    /// `None` on an update: the next tick stays as it is.
    pub next_run_at: Option<DateTime<Utc>>,
}

/// What a claimed tick came to, recorded with the advance.
#[derive(Debug, Clone, Default)]
pub struct TickRecord {
    /// The tick a run was made (or found) for.
    pub tick: Option<DateTime<Utc>>,
    pub run_id: Option<Uuid>,
    pub thread_id: Option<ThreadId>,
    /// Why the tick made no run.
    pub error: Option<String>,
}

fn cron_from_row(r: &Row) -> StoreResult<Cron> {
    let id = r.text("cron_id")?;
    Ok(Cron {
        cron_id: rows::cursor_uuid(&id)?,
        tenant: r.text("tenant")?,
        thread_id: r.opt_text("thread_id")?.map(ThreadId::from_stored),
        assistant_id: r.opt_text("assistant_id")?.map(AssistantId::from_stored),
        schedule: r.text("schedule")?,
        timezone: r.text("timezone")?,
        query: r.text("query")?,
        config: r.typed("config")?,
        multitask_strategy: r
            .opt_text("multitask_strategy")?
            .map(|s| s.parse().map_err(StoreError::Decode))
            .transpose()?,
        enabled: r.boolean("enabled")?,
        on_missed: r.enumeration("on_missed")?,
        next_run_at: r.ts("next_run_at")?,
        last_tick_at: r.opt_ts("last_tick_at")?,
        last_run_id: r.opt_uuid("last_run_id")?,
        last_thread_id: r.opt_text("last_thread_id")?.map(ThreadId::from_stored),
        last_error: r.opt_text("last_error")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// A UUID as the `cron_id` column keeps it (text on both stores).
fn id_text(id: Uuid) -> String {
    id.hyphenated().to_string()
}

impl SqlStore {
    /// Create a cron for `tenant`; `None` when the tenant already has `max`.
    ///
    /// # Errors
    /// [`StoreError::ThreadNotFound`] when the cron names a thread the tenant does not have.
    pub async fn create_cron(
        &self,
        tenant: &str,
        draft: &CronDraft,
        max: u64,
    ) -> StoreResult<Option<Cron>> {
        let mut tx = self.write().await?;
        // Creations of one tenant one at a time: the count below stays exact across replicas.
        tx.lock_key(&format!("crons\u{1f}{tenant}")).await?;
        let n = tx
            .one(
                q("SELECT COUNT(*) AS n FROM (SELECT 1 FROM crons WHERE tenant = $1 LIMIT $2) c")
                    .bind(tenant)
                    .bind(i64::try_from(max).unwrap_or(i64::MAX)),
            )
            .await?
            .int("n")?;
        if u64::try_from(n).unwrap_or(0) >= max {
            return Ok(None);
        }
        if let Some(t) = &draft.thread_id {
            let found = tx
                .opt(
                    q(
                        "SELECT 1 AS one FROM threads WHERE tenant = $1 AND thread_id = $2 AND NOT copying \
                       {share of threads}",
                    )
                    .bind(tenant)
                    .bind(t.as_str()),
                )
                .await?;
            if found.is_none() {
                return Err(StoreError::ThreadNotFound);
            }
        }
        let id = crate::model::new_id();
        let next = draft
            .next_run_at
            .ok_or_else(|| StoreError::Conflict("a new cron needs its first tick".into()))?;
        let row = tx
            .one(
                q(
                    "INSERT INTO crons (cron_id, tenant, thread_id, assistant_id, schedule, \
                     timezone, query, config, multitask_strategy, enabled, on_missed, \
                     next_run_at, created_at, updated_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, {now}, {now}) \
                   RETURNING *",
                )
                .bind(id_text(id))
                .bind(tenant)
                .bind(draft.thread_id.as_ref().map(ThreadId::as_str))
                .bind(draft.assistant_id.as_ref().map(AssistantId::as_str))
                .bind(draft.schedule.as_str())
                .bind(draft.timezone.as_str())
                .bind(draft.query.as_str())
                .bind(rows::to_json(&draft.config)?)
                .bind(draft.multitask_strategy.map(MultitaskStrategy::as_str))
                .bind(draft.enabled)
                .bind(draft.on_missed.as_str())
                .bind(next),
            )
            .await?;
        let cron = cron_from_row(&row)?;
        tx.commit().await?;
        Ok(Some(cron))
    }

    /// The tenant's cron `id`.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn get_cron(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Cron>> {
        self.read()
            .await?
            .opt(
                q("SELECT * FROM crons WHERE tenant = $1 AND cron_id = $2")
                    .bind(tenant)
                    .bind(id_text(id)),
            )
            .await?
            .as_ref()
            .map(cron_from_row)
            .transpose()
    }

    /// The tenant's crons (of one thread, when given), newest first.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn list_crons(
        &self,
        tenant: &str,
        thread_id: Option<&ThreadId>,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<Cron>> {
        let mut sql = String::from("SELECT * FROM crons WHERE tenant = $1");
        let mut args: Vec<Arg> = vec![tenant.into()];
        let next = |args: &mut Vec<Arg>, a: Arg| {
            args.push(a);
            format!("${}", args.len())
        };
        if let Some(t) = thread_id {
            let p = next(&mut args, t.as_str().into());
            sql.push_str(&format!(" AND thread_id = {p}"));
        }
        if let Some(c) = cursor {
            let at = next(&mut args, c.created_at.into());
            let id = next(&mut args, c.id.as_str().into());
            sql.push_str(&format!(" AND (created_at, cron_id) < ({at}, {id})"));
        }
        let lim = next(&mut args, rows::sql_limit(limit).into());
        sql.push_str(&format!(
            " ORDER BY created_at DESC, cron_id DESC LIMIT {lim}"
        ));
        let stmt = args.into_iter().fold(q(sql), Q::bind);
        map_rows(&self.read().await?.all(stmt).await?, cron_from_row)
    }

    /// Replace what a client sets of the tenant's cron `id` (its thread and assistant stay);
    /// `draft.next_run_at`, when given, moves its next tick. `None` when there is no such cron.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn update_cron(
        &self,
        tenant: &str,
        id: Uuid,
        draft: &CronDraft,
    ) -> StoreResult<Option<Cron>> {
        let mut conn = self.write_one().await?;
        conn.opt(
            q(
                "UPDATE crons SET schedule = $3, timezone = $4, query = $5, config = $6, \
                 multitask_strategy = $7, enabled = $8, on_missed = $9, \
                 next_run_at = COALESCE($10, next_run_at), updated_at = {now} \
               WHERE tenant = $1 AND cron_id = $2 RETURNING *",
            )
            .bind(tenant)
            .bind(id_text(id))
            .bind(draft.schedule.as_str())
            .bind(draft.timezone.as_str())
            .bind(draft.query.as_str())
            .bind(rows::to_json(&draft.config)?)
            .bind(draft.multitask_strategy.map(MultitaskStrategy::as_str))
            .bind(draft.enabled)
            .bind(draft.on_missed.as_str())
            .bind(draft.next_run_at),
        )
        .await?
        .as_ref()
        .map(cron_from_row)
        .transpose()
    }

    /// Delete the tenant's cron `id`; false when there was none.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn delete_cron(&self, tenant: &str, id: Uuid) -> StoreResult<bool> {
        let n = self
            .write_one()
            .await?
            .exec(
                q("DELETE FROM crons WHERE tenant = $1 AND cron_id = $2")
                    .bind(tenant)
                    .bind(id_text(id)),
            )
            .await?;
        Ok(n > 0)
    }

    /// Claim up to `max` enabled crons whose next tick is due and that no live lease holds, for
    /// `owner`, for `lease`; with the database's time of the claim.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn claim_due_crons(
        &self,
        owner: &str,
        lease: Duration,
        max: usize,
    ) -> StoreResult<(Vec<Cron>, DateTime<Utc>)> {
        let skip = match self.dialect() {
            Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let mut conn = self.write_one().await?;
        let found = conn
            .all(
                q(format!(
                    "UPDATE crons SET lease_owner = $1, lease_expires_at = {{later 2}} \
                     WHERE cron_id IN (SELECT cron_id FROM crons WHERE enabled = TRUE \
                       AND next_run_at <= {{now}} \
                       AND (lease_expires_at IS NULL OR lease_expires_at < {{now}}) \
                       ORDER BY next_run_at LIMIT $3 {skip}) \
                     RETURNING *"
                ))
                .bind(owner)
                .bind(lease_secs(lease))
                .bind(i64::try_from(max).unwrap_or(i64::MAX)),
            )
            .await?;
        let now = conn.one(q("SELECT {now} AS now")).await?.ts("now")?;
        Ok((map_rows(&found, cron_from_row)?, now))
    }

    /// After a claimed tick: release the lease and, unless the cron's next tick was changed
    /// meanwhile (a client's update), move it from `due` to `next`, recording what the tick did.
    /// False when the lease was no longer `owner`'s.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn finish_tick(
        &self,
        cron: &Cron,
        owner: &str,
        next: DateTime<Utc>,
        record: &TickRecord,
    ) -> StoreResult<bool> {
        let n = self
            .write_one()
            .await?
            .exec(
                q(
                    "UPDATE crons SET lease_owner = NULL, lease_expires_at = NULL, \
                     next_run_at = CASE WHEN next_run_at = $3 THEN $4 ELSE next_run_at END, \
                     last_tick_at = COALESCE($5, last_tick_at), \
                     last_run_id = COALESCE($6, last_run_id), \
                     last_thread_id = COALESCE($7, last_thread_id), last_error = $8 \
                   WHERE cron_id = $1 AND lease_owner = $2",
                )
                .bind(id_text(cron.cron_id))
                .bind(owner)
                .bind(cron.next_run_at)
                .bind(next)
                .bind(record.tick)
                .bind(Arg::Uuid(record.run_id))
                .bind(record.thread_id.as_ref().map(ThreadId::as_str))
                .bind(Arg::Text(record.error.clone())),
            )
            .await?;
        Ok(n == 1)
    }
}
