//! Runs: enqueueing (the idempotency key and the multitask strategies, atomically), reading,
//! listing and cancelling. Written once for both dialects.

use std::collections::HashMap;

use uuid::Uuid;

use super::apply::append_observations;
use super::assistants::{lock_thread_for_run, version_for_run};
use super::fragments::{copy_items, outbox_insert};
use super::history::mark_commit_end;
use super::rows;
use super::sql::{Arg, Conn, q};
use super::sql_store::SqlStore;
use super::tables::{TODO_ITEMS, item_cols};
use super::threads::{lock_thread, map_rows};
use super::webhooks::resolve_for_run;
use super::{CancelledRun, CreatedRun, NewRun, PageCursor, Signal, StoreError, StoreResult};
use crate::model::payloads::ItemStatusChangeContent;
use crate::model::{
    AssistantPin, ErrorInfo, ItemStatus, MultitaskStrategy, NewObservation, Observation, Run,
    RunKind, RunStatus, Suspension, ThreadId, TodoItem, Usage, new_id,
};

/// Cancel the queued or suspended runs among `$1` (the store cancels those itself).
const CANCEL_QUEUED_OR_SUSPENDED: &str = "UPDATE runs SET status = 'cancelled', \
    ended_at = {now}, lease_owner = NULL, lease_expires_at = NULL \
    WHERE {in run_id 1} AND status IN ('queued', 'suspended') RETURNING *";

/// Cancel the pending suspensions of the runs in `$1`.
const CANCEL_PENDING_SUSPENSIONS: &str = "UPDATE suspensions SET status = 'cancelled', \
    resolved_at = {now} WHERE {in run_id 1} AND status = 'pending'";

/// Fill `suspension` of the suspended runs among `runs` with their pending suspension (camelCase
/// JSON, as `Suspension` serializes; the newest wins should there ever be two).
pub(super) async fn attach_suspensions(conn: &mut Conn, runs: &mut [Run]) -> StoreResult<()> {
    let ids: Vec<Uuid> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Suspended)
        .map(|r| r.run_id)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let found = conn
        .all(q("SELECT * FROM suspensions WHERE {in run_id 1} AND status = 'pending'").bind(ids))
        .await?;
    let mut by_run: HashMap<Uuid, Suspension> = HashMap::new();
    for s in map_rows(&found, rows::suspension_from_row)? {
        match by_run.get(&s.run_id) {
            Some(old) if old.created_at > s.created_at => {}
            _ => {
                by_run.insert(s.run_id, s);
            }
        }
    }
    for run in runs.iter_mut() {
        run.suspension = match (run.status, by_run.get(&run.run_id)) {
            (RunStatus::Suspended, Some(s)) => Some(rows::to_json(s)?),
            _ => None,
        };
    }
    Ok(())
}

/// Cancel queued or suspended runs of one thread in the caller's transaction, with all their
/// work: their pending suspensions are cancelled and their unfinished items (a suspended run's,
/// or a queued one's that a decision sent back to the queue) become `cancelled`, each with its
/// `ITEM_STATUS_CHANGE` and its history version, before the runs' `RUN_CANCELLED`
/// (`interrupted_by`: the run that displaced them). Returns the runs and the observations.
async fn cancel_waiting(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    ids: Vec<Uuid>,
    interrupted_by: Option<Uuid>,
) -> StoreResult<(Vec<Run>, Vec<Observation>)> {
    let cancelled = conn
        .all(q(CANCEL_QUEUED_OR_SUSPENDED).bind(ids.clone()))
        .await?;
    conn.exec(q(CANCEL_PENDING_SUSPENSIONS).bind(ids)).await?;
    let runs = map_rows(&cancelled, rows::run_from_row)?;
    if runs.is_empty() {
        return Ok((runs, Vec::new()));
    }
    let ids: Vec<Uuid> = runs.iter().map(|r| r.run_id).collect();
    // Their `run.cancelled` webhooks, in the cancel's transaction.
    let sql = outbox_insert(
        conn.dialect(),
        "runs",
        "{in w.run_id 1} AND w.status = 'cancelled'",
        "suspensions",
    );
    conn.exec(q(sql).bind(ids.clone())).await?;
    let ended = end_items(conn, tenant, thread_id, &ids).await?;
    let mut obs: Vec<NewObservation> = ended.iter().map(item_cancelled).collect();
    obs.extend(
        ids.iter()
            .map(|id| rows::run_cancelled(*id, interrupted_by)),
    );
    let observations = append_observations(conn, tenant, thread_id, obs).await?;
    if !ended.is_empty() {
        let last = observations.last().map_or(0, |o| o.seq);
        let item_ids: Vec<String> = ended.iter().map(|(it, _)| it.id.to_string()).collect();
        let copy = copy_items("$1", "$2", "{in item_id 4}", "$3", false, "");
        conn.exec(
            q(copy)
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(last)
                .bind(item_ids),
        )
        .await?;
        mark_commit_end(conn, tenant, thread_id, last, true, None).await?;
    }
    Ok((runs, observations))
}

/// The unfinished items of the runs `ids` (ended by the store, not by their engine), moved to
/// `cancelled` in the caller's transaction: each as it is now and the status it had.
async fn end_items(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    ids: &[Uuid],
) -> StoreResult<Vec<(TodoItem, ItemStatus)>> {
    let found = conn
        .all(
            q(
                "SELECT * FROM todo_items WHERE tenant = $1 AND thread_id = $2 \
               AND {in run_id 3} AND status IN ('pending', 'in_progress', 'waiting') \
               ORDER BY position",
            )
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(ids.to_vec()),
        )
        .await?;
    let now = chrono::Utc::now();
    let mut ended = Vec::with_capacity(found.len());
    for mut item in map_rows(&found, rows::item_from_row)? {
        let previous = item.status;
        item.status = ItemStatus::Cancelled;
        item.error = Some(ErrorInfo {
            code: "run_cancelled".into(),
            message: "cancelled: the run was cancelled".into(),
        });
        item.updated_at = now;
        item.completed_at = Some(now);
        TODO_ITEMS
            .write(conn, tenant, thread_id, item_cols(&item)?)
            .await?;
        ended.push((item, previous));
    }
    Ok(ended)
}

/// The `ITEM_STATUS_CHANGE` of an item the store cancelled with its run.
fn item_cancelled((item, previous): &(TodoItem, ItemStatus)) -> NewObservation {
    let run = item.run_id.unwrap_or_default();
    NewObservation::of(
        run,
        Some(item.id.to_string()),
        format!("{}: {} → {}", item.id, previous, item.status),
        &ItemStatusChangeContent {
            item_id: item.id.clone(),
            status: item.status,
            previous_status: *previous,
        },
    )
}

/// Ask the workers of running runs to stop at their next safe point.
async fn request_cancel(conn: &mut Conn, ids: Vec<Uuid>) -> StoreResult<Vec<Run>> {
    let flagged = conn
        .all(q("UPDATE runs SET cancel_requested = TRUE WHERE {in run_id 1} RETURNING *").bind(ids))
        .await?;
    let runs = map_rows(&flagged, rows::run_from_row)?;
    for run in &runs {
        conn.notify(&Signal::Cancel { run: run.run_id }).await?;
    }
    Ok(runs)
}

impl SqlStore {
    /// Enqueue a run, applying the idempotency key and the multitask strategy atomically.
    ///
    /// # Errors
    /// [`StoreError::ThreadNotFound`] (unless `create_thread`), [`StoreError::ThreadBusy`] for
    /// `reject` while a run is active.
    pub async fn create_run(&self, new: NewRun) -> StoreResult<CreatedRun> {
        let mut tx = self.write().await?;
        let (tenant, thread_id) = (new.tenant.as_str(), &new.thread_id);
        let mut locked = lock_thread_for_run(&mut tx, tenant, thread_id).await?;
        if locked.is_none() && new.create_thread {
            super::threads::thread_quota(&mut tx, tenant, self.max_threads).await?;
            // Concurrent creators wait on the primary key; the loser inserts nothing.
            tx.exec(
                q(
                    "INSERT INTO threads (tenant, thread_id, created_at, updated_at) \
                   VALUES ($1, $2, {now}, {now}) ON CONFLICT DO NOTHING",
                )
                .bind(tenant)
                .bind(thread_id.as_str()),
            )
            .await?;
            tx.exec(
                q(
                    "INSERT INTO agent_state (tenant, thread_id) VALUES ($1, $2) \
                   ON CONFLICT DO NOTHING",
                )
                .bind(tenant)
                .bind(thread_id.as_str()),
            )
            .await?;
            locked = lock_thread_for_run(&mut tx, tenant, thread_id).await?;
        }
        let locked = locked.ok_or(StoreError::ThreadNotFound)?;
        let (last_seq, thread_assistant) = (locked.last_seq, locked.assistant);

        if let Some(key) = &new.idempotency_key {
            let existing = tx
                .opt(
                    q("SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 \
                         AND idempotency_key = $3")
                    .bind(tenant)
                    .bind(thread_id.as_str())
                    .bind(key),
                )
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

        // Lock the active runs: a concurrent claim either finished (we see `running`) or skips
        // them.
        let active = tx
            .all(
                q(
                    "SELECT run_id, status FROM runs WHERE tenant = $1 AND thread_id = $2 \
                     AND status IN ('queued', 'running', 'suspended') \
                   ORDER BY created_at, run_id {lock}",
                )
                .bind(tenant)
                .bind(thread_id.as_str()),
            )
            .await?
            .iter()
            .map(|r| Ok((r.uuid("run_id")?, r.enumeration::<RunStatus>("status")?)))
            .collect::<StoreResult<Vec<_>>>()?;

        // The caller's choice as it is, else the thread's assistant (pinned, or current now).
        let assistant = match (&new.assistant, thread_assistant) {
            (Some(chosen), _) => Some(AssistantPin {
                assistant_id: chosen.assistant_id.clone(),
                version: Some(chosen.version),
            }),
            (None, pin) => pin,
        };
        let (assistant, version_hook) = match assistant {
            Some(pin) => {
                let (v, hook) = version_for_run(&mut tx, tenant, &pin).await?;
                (Some(v), Some(hook))
            }
            None => (None, None),
        };
        let webhook = resolve_for_run(&new.config, locked.webhook, version_hook)?;

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
            // The active run was steered before this (see `RunCommands::enqueue`); one that ended
            // since leaves the query to run on its own.
            MultitaskStrategy::Enqueue | MultitaskStrategy::Steer => {}
            MultitaskStrategy::Interrupt => {
                let (running, displaced): (Vec<_>, Vec<_>) = active
                    .into_iter()
                    .partition(|(_, s)| *s == RunStatus::Running);
                let running: Vec<Uuid> = running.into_iter().map(|(id, _)| id).collect();
                let displaced: Vec<Uuid> = displaced.into_iter().map(|(id, _)| id).collect();
                if !displaced.is_empty() {
                    let (_, obs) =
                        cancel_waiting(&mut tx, tenant, thread_id, displaced, Some(run_id)).await?;
                    observations = obs;
                }
                if !running.is_empty() {
                    request_cancel(&mut tx, running).await?;
                }
            }
        }
        let start_seq = observations.last().map_or(last_seq, |o| o.seq);
        let kind = if new.flowchart.is_some() {
            RunKind::Flowchart
        } else {
            RunKind::Agent
        };
        let flowchart = rows::opt_json(new.flowchart.as_ref())?;
        // {clock}: taken after the thread lock, so runs of a thread sort in the order they were
        // enqueued. The tenant's runs queued or running are counted in the same statement,
        // after an interrupt cancelled the queued runs it displaces (see `quotas`): a tenant
        // with more room than the database has transactions in flight is inserted at once;
        // nearer its quota, under the tenant's lock, in a statement that sees every creation
        // committed before it.
        let (config, usage) = (
            rows::to_json(&new.config)?,
            rows::to_json(&Usage::default())?,
        );
        let insert = |below: u64| {
            q(
                "INSERT INTO runs (run_id, tenant, thread_id, status, query, config, \
                 multitask_strategy, idempotency_key, created_at, usage, attempt, phase, \
                 cancel_requested, start_seq, trace_context, assistant_id, \
                 assistant_version, webhook, cron_id, kind, flowchart) \
               SELECT $1, $2, $3, 'queued', $4, $5, $6, $7, {clock}, $8, 0, 'new', FALSE, \
                 $9, $10, $11, $12, $13, $14, $15, $16 \
               WHERE (SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE tenant = $2 \
                 AND status IN ('queued', 'running') LIMIT $17) x) < $17 \
               RETURNING *",
            )
            .bind(run_id)
            .bind(tenant)
            .bind(thread_id.as_str())
            .bind(&new.query)
            .bind(config.clone())
            .bind(new.strategy.as_str())
            .bind(&new.idempotency_key)
            .bind(usage.clone())
            .bind(start_seq)
            .bind(&new.trace_context)
            .bind(assistant.as_ref().map(|a| a.assistant_id.as_str()))
            .bind(Arg::Int(assistant.as_ref().map(|a| a.version)))
            .bind(Arg::Json(webhook.clone()))
            .bind(Arg::Text(new.cron_id.map(|id| id.to_string())))
            .bind(kind.as_str())
            .bind(Arg::Json(flowchart.clone()))
            .bind(i64::try_from(below).unwrap_or(i64::MAX))
        };
        let max = self.max_active_runs;
        let mut row = None;
        if max > self.in_flight {
            row = tx.opt(insert(max - self.in_flight)).await?;
        }
        // With nothing else in flight (SQLite) that count was exact already.
        if row.is_none() && self.in_flight > 0 {
            tx.lock_key(&super::quotas::lock_name("runs", tenant))
                .await?;
            row = tx.opt(insert(max)).await?;
        }
        let row = row.ok_or(super::quotas::over_active_runs(max))?;
        tx.notify(&Signal::RunReady).await?;
        tx.commit().await?;
        if !observations.is_empty() {
            // Runs an `interrupt` displaced: their webhooks are in the outbox.
            self.webhook_written();
        }
        Ok(CreatedRun {
            run: rows::run_from_row(&row)?,
            created: true,
            observations,
        })
    }

    /// The run, with its pending suspension when it is suspended.
    pub async fn get_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<Option<Run>> {
        self.one_run(
            q("SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3")
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(run_id),
        )
        .await
    }

    /// The run `select` finds (one row of `runs`), with its pending suspensions. Two plain reads:
    /// a run read just as its suspension resolves may show no suspension for that instant;
    /// `/wait` and the SSE stream read it again on the next event.
    pub(super) async fn one_run(&self, select: super::sql::Q) -> StoreResult<Option<Run>> {
        let mut conn = self.read().await?;
        let Some(row) = conn.opt(select).await? else {
            return Ok(None);
        };
        let mut run = rows::run_from_row(&row)?;
        attach_suspensions(&mut conn, std::slice::from_mut(&mut run)).await?;
        conn.commit().await?;
        Ok(Some(run))
    }

    /// Newest first; `None` when the thread does not exist.
    pub async fn list_runs(
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
        let mut stmt = q(format!(
            "SELECT * FROM runs WHERE tenant = $1 AND thread_id = $2 {after} \
             ORDER BY created_at DESC, run_id DESC LIMIT $3"
        ))
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            stmt = stmt.bind(c.created_at).bind(rows::cursor_uuid(&c.id)?);
        }
        let mut conn = self.snapshot().await?;
        let mut runs = map_rows(&conn.all(stmt).await?, rows::run_from_row)?;
        attach_suspensions(&mut conn, &mut runs).await?;
        conn.commit().await?;
        Ok(Some(runs))
    }

    /// Cancel a queued, running or suspended run.
    ///
    /// # Errors
    /// [`StoreError::RunNotFound`]; [`StoreError::Conflict`] when the run already ended.
    pub async fn cancel_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<CancelledRun> {
        let mut tx = self.write().await?;
        // Lock order: thread, then run (as create_run and apply).
        if lock_thread(&mut tx, tenant, thread_id).await?.is_none() {
            return Err(StoreError::RunNotFound);
        }
        let status: RunStatus = tx
            .opt(
                q(
                    "SELECT status FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3 \
                   {lock}",
                )
                .bind(tenant)
                .bind(thread_id.as_str())
                .bind(run_id),
            )
            .await?
            .ok_or(StoreError::RunNotFound)?
            .enumeration("status")?;
        let (run, observations) = match status {
            RunStatus::Queued | RunStatus::Suspended => {
                let (mut runs, obs) =
                    cancel_waiting(&mut tx, tenant, thread_id, vec![run_id], None).await?;
                (runs.pop(), obs)
            }
            RunStatus::Running => (
                request_cancel(&mut tx, vec![run_id]).await?.pop(),
                Vec::new(),
            ),
            done => return Err(StoreError::Conflict(format!("run already {done}"))),
        };
        let run = run.ok_or(StoreError::RunNotFound)?;
        tx.commit().await?;
        if run.status == RunStatus::Cancelled {
            self.webhook_written();
        }
        Ok(CancelledRun { run, observations })
    }
}
