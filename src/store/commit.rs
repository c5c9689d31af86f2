//! What a commit of the engine's change set writes, described once for both dialects: the
//! batch taken apart ([`Commit::new`]) into the run's fenced update (`$1`–`$14`, see
//! [`bind_fence`]), the rows each table gets ([`Write`]: which table, which rows, which columns
//! take a value of the commit, which history versions the rows get), the items deleted (each
//! leaving a tombstone version), whether the run's pending suspensions are cancelled, the
//! observations with their gap-free seqs, and the webhook outbox row. A layer below
//! [`super::SqlStore`] that knows nothing of it or of either dialect: `postgres::commit_statement`
//! renders a [`Commit`] as one statement, `sqlite::commit_call` as one call of gated statements,
//! and `apply.rs` runs whichever the store's backend has.
//!
//! What every rendering keeps, whatever its SQL:
//! - **The fence gates everything.** The run's update matches `run_id`, `attempt` and a
//!   `running` status; when it matches nothing, nothing of the commit is written (the seq
//!   counter included) and the commit answers [`StoreError::LeaseLost`](super::StoreError).
//! - **Lock order thread → run → suspension**, as every multi-row transaction of the store.
//! - **Gap-free seqs.** The thread's `last_seq` grows by `n`; the observations take
//!   `last_seq - n + 1 ..= last_seq` in order, all stamped with the commit's time, and the last
//!   one marks the commit's end (whether it changed the state, the run's phase and usage after
//!   it: see `history.rs`).
//! - **History.** Every row of the state a commit writes gets a version at the commit's seq
//!   (its last observation's; a commit without observations shares the previous commit's seq
//!   and replaces its versions), a deleted item a tombstone, a message that seq, a new
//!   suspension the seq that made it, a cancelled one the seq that ended it.
//! - **The outbox.** A commit that moves the run to a status a webhook announces writes the
//!   delivery row in the same statement or transaction, after its other writes (a suspension it
//!   inserted is the one the event is about).
//!
//! The ops are merged into one write per row, so that no rendering touches a row twice (one
//! Postgres statement cannot): repeated sets of the state add up their version bumps; the last
//! write of an item wins, and an item deleted after its upsert is only deleted (its tombstone
//! copies the row as it was before the commit: what the upsert would have written is in no
//! version, and no reader reads a tombstone's columns); a suspension inserted before the run's
//! pending suspensions are cancelled is inserted cancelled.

use std::time::Duration;

use serde_json::Value;

use super::fragments::lease_secs;
use super::rows;
use super::sql::{Arg, Q};
use super::tables::{
    AGENT_STATE, MESSAGES, RowCols, SUSPENSIONS, TODO_ITEMS, Table, item_cols, message_cols_at,
    state_cols, suspension_cols,
};
use super::{Batch, Fence, Op, RunUpdate, StoreError, StoreResult};
use crate::model::{NewObservation, RunPhase, RunStatus, ThreadId, WebhookEvent};

/// A batch, taken apart for committing: everything a rendering needs, computed once.
pub(crate) struct Commit<'a> {
    pub fence: Fence,
    pub lease: Duration,
    pub tenant: &'a str,
    pub thread_id: &'a ThreadId,
    /// The run's own update (a batch holds at most one: `Batch::op` merges them), applied by the
    /// fence statement rather than by a statement of its own.
    pub update: RunUpdate,
    pub usage: Option<Value>,
    pub error: Option<Value>,
    /// The run stops holding a lease (it ended or waits for a person): a queued run may start.
    pub clear_lease: bool,
    /// The update moves the run to a status a webhook announces: the commit writes the outbox
    /// row (when the run has a webhook that wants it) with the run's change.
    pub announces: bool,
    /// The batch changes the thread's state (what `/history` lists): its commit is a point of
    /// the thread's history.
    pub changed: bool,
    /// How many observations, hence seqs.
    pub n: i64,
    pub observations: &'a [NewObservation],
    /// The rows written, table by table, one write per row.
    pub writes: Vec<Write>,
    /// Items deleted: each leaves a tombstone version, copied before the row goes.
    pub deleted: Vec<String>,
    /// The run's pending suspensions are resolved as cancelled, at the commit's seq.
    pub cancel_suspensions: bool,
}

/// Rows of one table a commit writes (an insert, or an upsert on the table's key).
pub(crate) struct Write {
    pub table: &'static Table,
    pub rows: Vec<RowCols>,
    /// Columns whose value is the commit's rather than the row's bound one.
    pub at_commit: &'static [(&'static str, AtCommit)],
    /// The history versions the written rows get.
    pub versions: Versions,
}

/// A value only the commit knows, which each rendering writes in its own SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtCommit {
    /// The commit's seq (its last observation's).
    Seq,
    /// The commit's time.
    Now,
}

/// Which versions a write's rows get at the commit's seq (see `history.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Versions {
    None,
    /// `agent_state_versions`.
    State,
    /// `todo_item_versions` (live versions; tombstones are [`Commit::deleted`]'s).
    Items,
}

const MESSAGE_AT_COMMIT: &[(&str, AtCommit)] = &[("seq", AtCommit::Seq)];
const SUSPENSION_AT_COMMIT: &[(&str, AtCommit)] = &[("created_seq", AtCommit::Seq)];
const CANCELLED_AT_COMMIT: &[(&str, AtCommit)] = &[
    ("created_seq", AtCommit::Seq),
    ("resolved_seq", AtCommit::Seq),
    ("resolved_at", AtCommit::Now),
];

impl<'a> Commit<'a> {
    /// Take `batch` apart for committing under `fence`, extending the lease by `lease`.
    pub(crate) fn new(fence: Fence, lease: Duration, batch: &'a Batch) -> StoreResult<Self> {
        let update = batch
            .ops
            .iter()
            .find_map(|op| match op {
                Op::UpdateRun(u) => Some(u.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let mut state: Option<(&crate::model::AgentStateRow, i64)> = None;
        let mut items: Vec<&crate::model::TodoItem> = Vec::new();
        let mut deleted: Vec<String> = Vec::new();
        let mut messages = Vec::new();
        let mut suspensions = Vec::new();
        let mut cancelled = Vec::new();
        let mut cancel_suspensions = false;
        for op in &batch.ops {
            match op {
                Op::SetAgentState(s) => state = Some((s, state.map_or(1, |(_, k)| k + 1))),
                Op::UpsertItem(item) => {
                    // Later upserts of an item replace earlier ones (each writes the whole row),
                    // and the row is live after the commit whatever came before.
                    items.retain(|i| i.id != item.id);
                    deleted.retain(|d| d != item.id.as_str());
                    items.push(item);
                }
                Op::DeleteItem(id) => {
                    items.retain(|i| i.id != *id);
                    if !deleted.iter().any(|d| d == id.as_str()) {
                        deleted.push(id.as_str().to_owned());
                    }
                }
                Op::AppendMessage(m) => messages.push(message_cols_at(m, None)?),
                Op::InsertSuspension(s) => suspensions.push(s),
                Op::CancelSuspensions => {
                    cancel_suspensions = true;
                    // The ones this batch made so far are the run's pending ones too.
                    for s in suspensions.drain(..) {
                        let mut cols = suspension_cols(s)?;
                        for (c, v) in &mut cols {
                            if *c == "status" {
                                *v = "cancelled".into();
                            }
                        }
                        cols.push(("created_seq", Arg::Int(None)));
                        cols.push(("resolved_seq", Arg::Int(None)));
                        cancelled.push(cols);
                    }
                }
                Op::UpdateRun(_) => {}
            }
        }
        let mut writes = Vec::new();
        if let Some((s, sets)) = state {
            // Every set bumps the version: the sets of one batch add up.
            let mut cols = state_cols(s);
            cols.retain(|(c, _)| *c != "version");
            cols.push(("version", sets.into()));
            writes.push(Write {
                table: &AGENT_STATE,
                rows: vec![cols],
                at_commit: &[],
                versions: Versions::State,
            });
        }
        let items = items
            .into_iter()
            .map(item_cols)
            .collect::<StoreResult<Vec<_>>>()?;
        writes.push(Write {
            table: &TODO_ITEMS,
            rows: items,
            at_commit: &[],
            versions: Versions::Items,
        });
        writes.push(Write {
            table: &MESSAGES,
            rows: messages,
            at_commit: MESSAGE_AT_COMMIT,
            versions: Versions::None,
        });
        let pending = suspensions
            .into_iter()
            .map(|s| {
                let mut cols = suspension_cols(s)?;
                cols.push(("created_seq", Arg::Int(None)));
                Ok(cols)
            })
            .collect::<StoreResult<Vec<_>>>()?;
        writes.push(Write {
            table: &SUSPENSIONS,
            rows: pending,
            at_commit: SUSPENSION_AT_COMMIT,
            versions: Versions::None,
        });
        writes.push(Write {
            table: &SUSPENSIONS,
            rows: cancelled,
            at_commit: CANCELLED_AT_COMMIT,
            versions: Versions::None,
        });
        writes.retain(|w| !w.rows.is_empty());
        Ok(Commit {
            fence,
            lease,
            tenant: &batch.tenant,
            thread_id: &batch.thread_id,
            usage: rows::opt_json(update.usage.as_ref())?,
            error: rows::opt_json(update.error.as_ref())?,
            clear_lease: update.status.is_some_and(rows::clears_lease),
            announces: update.status.and_then(WebhookEvent::for_status).is_some(),
            changed: changes_state(&batch.ops),
            n: i64::try_from(batch.observations.len())
                .map_err(|e| StoreError::Decode(e.to_string()))?,
            observations: &batch.observations,
            update,
            writes,
            deleted,
            cancel_suspensions,
        })
    }

    /// A suspend that must see every decision committed before it (`RunUpdate::unless_decided`):
    /// the thread's lock is taken before the commit's statement starts, so that its snapshot
    /// follows any decision a resolver (who holds that lock while it decides) committed.
    pub(crate) fn waits_for_decisions(&self) -> bool {
        !self.update.unless_decided.is_empty()
    }
}

/// Whether a batch changes the thread's state (what `/history` lists): the agent state, an
/// item, or a suspension. Messages and the run's own row are not part of it.
pub(crate) fn changes_state(ops: &[Op]) -> bool {
    ops.iter().any(|op| {
        matches!(
            op,
            Op::SetAgentState(_)
                | Op::UpsertItem(_)
                | Op::DeleteItem(_)
                | Op::InsertSuspension(_)
                | Op::CancelSuspensions
        )
    })
}

/// Bind `$1`–`$14` of a commit: the fence, the lease, the run's update
/// ([`super::fragments::RUN_UPDATE`]), the thread and `n`, how many seqs to reserve.
pub(crate) fn bind_fence(stmt: Q, c: &Commit<'_>) -> Q {
    let u = &c.update;
    stmt.bind(c.fence.run_id)
        .bind(c.fence.attempt)
        .bind(lease_secs(c.lease))
        .bind(u.status.map(RunStatus::as_str))
        .bind(u.phase.map(RunPhase::as_str))
        .bind(c.usage.clone())
        .bind(c.error.clone())
        .bind(u.final_response.clone())
        .bind(u.ended)
        .bind(c.clear_lease)
        .bind(u.unless_decided.clone())
        .bind(c.tenant)
        .bind(c.thread_id.as_str())
        .bind(c.n)
}
