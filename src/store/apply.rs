//! Committing the engine's change sets: the fence, the run's update, the ops, and the
//! observations with their gap-free seqs, in one transaction. Written once for both dialects;
//! only the seq counter's round trip and the list insert of observations differ.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::leases::lease_secs;
use super::rows::{self, Cols};
use super::sql::{Conn, Dialect, Raw, q};
use super::sql_store::SqlStore;
use super::threads::lock_thread;
use super::{Applied, Batch, Fence, Op, Signal, StoreError, StoreResult};
use crate::model::{
    AgentStateRow, ItemId, Message, NewObservation, Observation, RunPhase, RunStatus, Suspension,
    ThreadId, TodoItem,
};

/// The run's part of a commit, under the fence (`$1` run, `$2` attempt, `$12`/`$13` its
/// thread): extend the lease (`$3` seconds) or clear it (`$10`), and apply the run's update. A
/// run that would suspend while one of the suspensions `$11` was already decided is queued
/// instead (see `RunUpdate::unless_decided`).
const RUN_UPDATE: &str = "UPDATE runs SET \
      lease_expires_at = CASE WHEN $10 THEN NULL ELSE {later 3} END, \
      lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END, \
      status = CASE WHEN $4 = 'suspended' AND EXISTS (SELECT 1 FROM suspensions s \
                 WHERE {in s.suspension_id 11} AND s.status <> 'pending') \
               THEN 'queued' ELSE COALESCE($4, status) END, \
      phase = COALESCE($5, phase), \
      usage = COALESCE($6, usage), error = COALESCE($7, error), \
      final_response = COALESCE($8, final_response), \
      ended_at = CASE WHEN $9 THEN {now} ELSE ended_at END \
    WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
      AND tenant = $12 AND thread_id = $13";

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
    insert_observations(conn, tenant, thread_id, last - n + 1, now, new).await
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
    new: Vec<NewObservation>,
) -> StoreResult<Vec<Observation>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    match conn.raw() {
        Raw::Pg(c) => {
            super::postgres::insert_observations(c, tenant, thread_id, first_seq, created_at, &new)
                .await?
        }
        Raw::Lite(c) => {
            super::sqlite::insert_observations(c, tenant, thread_id, first_seq, created_at, &new)
                .await?
        }
    }
    Ok(rows::committed(
        tenant,
        thread_id,
        first_seq,
        rows::micros(created_at),
        new,
    ))
}

async fn set_agent_state(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    s: &AgentStateRow,
) -> StoreResult<()> {
    conn.exec(
        q(
            "INSERT INTO agent_state (tenant, thread_id, intent, title, plan, current_step_id, \
             version) VALUES ($1, $2, $3, $4, $5, $6, 1) \
           ON CONFLICT (tenant, thread_id) DO UPDATE SET intent = EXCLUDED.intent, \
             title = EXCLUDED.title, plan = EXCLUDED.plan, \
             current_step_id = EXCLUDED.current_step_id, version = agent_state.version + 1",
        )
        .bind(tenant)
        .bind(thread_id.as_str())
        .bind(&s.intent)
        .bind(&s.title)
        .bind(&s.plan)
        .bind(&s.current_step_id),
    )
    .await?;
    Ok(())
}

async fn upsert_item(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    item: &TodoItem,
) -> StoreResult<()> {
    conn.exec(
        q(
            "INSERT INTO todo_items (tenant, thread_id, item_id, position, description, status, \
             dependencies, step_type, required_tools, tool_validation_mode, validation_status, \
             expected_outcome, tool_calls, actual_tool_calls, tool_results, thoughts, result, \
             error, attempts, usage, conversation, run_id, created_at, updated_at, started_at, \
             completed_at, kind, parent_item_id, role, tool_allowlist, compacted_output) \
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31) \
           ON CONFLICT (tenant, thread_id, item_id) DO UPDATE SET position = EXCLUDED.position, \
             description = EXCLUDED.description, status = EXCLUDED.status, \
             dependencies = EXCLUDED.dependencies, step_type = EXCLUDED.step_type, \
             required_tools = EXCLUDED.required_tools, \
             tool_validation_mode = EXCLUDED.tool_validation_mode, \
             validation_status = EXCLUDED.validation_status, \
             expected_outcome = EXCLUDED.expected_outcome, tool_calls = EXCLUDED.tool_calls, \
             actual_tool_calls = EXCLUDED.actual_tool_calls, \
             tool_results = EXCLUDED.tool_results, thoughts = EXCLUDED.thoughts, \
             result = EXCLUDED.result, error = EXCLUDED.error, attempts = EXCLUDED.attempts, \
             usage = EXCLUDED.usage, conversation = EXCLUDED.conversation, \
             run_id = EXCLUDED.run_id, created_at = EXCLUDED.created_at, \
             updated_at = EXCLUDED.updated_at, started_at = EXCLUDED.started_at, \
             completed_at = EXCLUDED.completed_at, kind = EXCLUDED.kind, \
             parent_item_id = EXCLUDED.parent_item_id, role = EXCLUDED.role, \
             tool_allowlist = EXCLUDED.tool_allowlist, \
             compacted_output = EXCLUDED.compacted_output",
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
        .bind(item.parent_item_id.as_ref().map(ItemId::as_str))
        .bind(&item.role)
        .bind(rows::opt_json(item.tool_allowlist.as_ref())?)
        .bind(&item.compacted_output),
    )
    .await?;
    Ok(())
}

async fn append_message(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    m: &Message,
) -> StoreResult<()> {
    let tool_calls = if m.tool_calls.is_empty() {
        None
    } else {
        Some(rows::to_json(&m.tool_calls)?)
    };
    conn.exec(
        q(
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
        .bind(tool_calls),
    )
    .await?;
    Ok(())
}

async fn insert_suspension(
    conn: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
    s: &Suspension,
) -> StoreResult<()> {
    conn.exec(
        q(
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
        .bind(s.input_schema.clone())
        .bind(s.iteration_state.clone())
        .bind(rows::to_json(&s.partial_tool_results)?)
        .bind(s.status.as_str())
        .bind(s.decision.as_ref().map(rows::to_json).transpose()?)
        .bind(s.created_at)
        .bind(s.resolved_at)
        .bind(s.expires_at),
    )
    .await?;
    Ok(())
}

/// Run one op of a batch inside the apply transaction.
async fn apply_op(conn: &mut Conn, tenant: &str, thread_id: &ThreadId, op: &Op) -> StoreResult<()> {
    match op {
        Op::SetAgentState(s) => set_agent_state(conn, tenant, thread_id, s).await,
        Op::UpsertItem(item) => upsert_item(conn, tenant, thread_id, item).await,
        Op::DeleteItem(id) => {
            conn.exec(
                q("DELETE FROM todo_items WHERE tenant = $1 AND thread_id = $2 AND item_id = $3")
                    .bind(tenant)
                    .bind(thread_id.as_str())
                    .bind(id.as_str()),
            )
            .await?;
            Ok(())
        }
        Op::AppendMessage(m) => append_message(conn, tenant, thread_id, m).await,
        // Applied by the fence statement, with the lease check.
        Op::UpdateRun(_) => Ok(()),
        Op::InsertSuspension(s) => insert_suspension(conn, tenant, thread_id, s).await,
    }
}

impl SqlStore {
    pub(crate) async fn commit_batch(
        &self,
        fence: Fence,
        lease: Duration,
        batch: Batch,
    ) -> StoreResult<Applied> {
        let Batch {
            tenant,
            thread_id,
            ops,
            observations,
        } = batch;
        let n = count(&observations)?;
        // The run's own update (a batch holds at most one: `Batch::op` merges them) rides on the
        // fence statement instead of costing a statement of its own.
        let u = ops
            .iter()
            .find_map(|op| match op {
                Op::UpdateRun(u) => Some(u.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let clear_lease = u.status.is_some_and(rows::clears_lease);
        let mut tx = self.write().await?;
        if !u.unless_decided.is_empty() {
            // A suspend that must see every decision committed before it: take the thread lock
            // first (a resolver holds it while it decides), so the statement below starts with a
            // snapshot taken after any such decision. (Inside one statement that waited for the
            // lock, the EXISTS would still read the snapshot from before the wait.)
            lock_thread(&mut tx, &tenant, &thread_id).await?;
        }
        let fenced = q(match tx.dialect() {
            // One round trip: reserve the seqs on the thread row (thread first: lock order), then
            // check the fence and update the run.
            Dialect::Postgres => format!(
                "WITH t AS (UPDATE threads SET last_seq = last_seq + $14, \
                   updated_at = CASE WHEN $14 > 0 THEN now() ELSE updated_at END \
                 WHERE tenant = $12 AND thread_id = $13 RETURNING last_seq) \
                 {RUN_UPDATE} AND EXISTS (SELECT 1 FROM t) \
                 RETURNING cancel_requested, (SELECT last_seq FROM t) AS last_seq, now() AS now"
            ),
            // Writers are serialized: the seqs are reserved by a statement of their own.
            Dialect::Sqlite => {
                format!("{RUN_UPDATE} RETURNING cancel_requested, $14 AS last_seq, {{now}} AS now")
            }
        })
        .bind(fence.run_id)
        .bind(fence.attempt)
        .bind(lease_secs(lease))
        .bind(u.status.map(RunStatus::as_str))
        .bind(u.phase.map(RunPhase::as_str))
        .bind(rows::opt_json(u.usage.as_ref())?)
        .bind(rows::opt_json(u.error.as_ref())?)
        .bind(u.final_response.clone())
        .bind(u.ended)
        .bind(clear_lease)
        .bind(u.unless_decided.clone())
        .bind(tenant.as_str())
        .bind(thread_id.as_str())
        .bind(n);
        // No row: the lease is gone; dropping `tx` rolls back (the counter too).
        let row = tx.opt(fenced).await?.ok_or(StoreError::LeaseLost)?;
        let cancel_requested = row.boolean("cancel_requested")?;
        let mut now = row.ts("now")?;
        let mut last_seq = row.int("last_seq")?;
        if tx.dialect() == Dialect::Sqlite && n > 0 {
            let reserved = tx
                .one(
                    q(RESERVE_SEQS)
                        .bind(tenant.as_str())
                        .bind(thread_id.as_str())
                        .bind(n),
                )
                .await?;
            (last_seq, now) = (reserved.int("last_seq")?, reserved.ts("now")?);
        }
        for op in &ops {
            apply_op(&mut tx, &tenant, &thread_id, op).await?;
        }
        if clear_lease {
            // The thread is free (or the run waits for a person): a queued run may start.
            tx.notify(&Signal::RunReady).await?;
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
}
