//! Forks: a new thread whose log, messages, state and history are a prefix of its
//! source's, cut at the end of a commit. A run that was under way at that point continues on the
//! fork as a new run, from its last commit there, which is what crash recovery does: the fork
//! gets the run's rows as they were, and the worker that claims it reads them like any run whose
//! lease expired. A suspension pending at that point is pending on the fork under a new id, so a
//! person can decide differently there; one decided by then whose call had no result yet is
//! asked again (a decision is for one execution). The source is only read.
//!
//! A fork is copied in short transactions (see [`SqlStore::fork_thread`]), so however long its
//! source, it never holds the writer (SQLite) or locks beyond its own rows (Postgres) for more
//! than a batch. Until its last transaction the fork's thread is `copying`: hidden from every
//! read and write, counted by the quotas, deleted if the copy stops.
//!
//! Ids: observations and messages keep theirs (unique per thread, so the fork's log is the
//! source's, ids and all); the continued run and its suspensions get new ones (runs and
//! suspensions are addressed without their thread), and every copied row and observation text
//! that names them names the new ones, so the engine finds its own rows on the fork.

use std::time::{Duration, Instant};

use serde_json::Value;
use uuid::Uuid;

use super::history::{PastError, commit_end, latest_items_from};
use super::rows;
use super::sql::{Conn, Dialect, q};
use super::sql_store::SqlStore;
use super::tables::{ITEM_COLUMNS, STATE_COLUMNS};
use super::threads::lock_thread;
use super::{Signal, StoreError};
use crate::model::{
    Decision, Run, RunStatus, Suspension, SuspensionStatus, Thread, ThreadId, new_id,
};

/// What to fork.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// Cut after this observation (the state is that of the commit that holds it); `None`: the
    /// last.
    pub at_seq: Option<i64>,
    /// The new thread's id.
    pub thread_id: ThreadId,
    /// The new thread's metadata (the source's when `None`); `forkedFrom` is added to it.
    pub metadata: Option<Value>,
}

/// What [`SqlStore::fork_thread`] made.
#[derive(Debug, Clone)]
pub struct Forked {
    pub thread: Thread,
    /// Where the fork was cut: the last observation it holds (its state is that of the commit
    /// that holds it).
    pub at_seq: i64,
    /// The runs that continue on the fork (queued, or suspended on a pending suspension).
    pub runs: Vec<Run>,
}

/// The runs under way after `$3`: started at or before it and not ended by then.
const RUNS_UNDER_WAY: &str = "SELECT r.run_id FROM runs r \
    WHERE r.tenant = $1 AND r.thread_id = $2 \
      AND EXISTS (SELECT 1 FROM observations o WHERE o.run_id = r.run_id AND o.seq <= $3 \
        AND o.tenant = $1 AND o.thread_id = $2 AND o.type = 'RUN_STARTED') \
      AND NOT EXISTS (SELECT 1 FROM observations o WHERE o.run_id = r.run_id AND o.seq <= $3 \
        AND o.tenant = $1 AND o.thread_id = $2 \
        AND o.type IN ('RUN_COMPLETED', 'RUN_FAILED', 'RUN_CANCELLED')) \
    ORDER BY r.created_at, r.run_id";

/// Old ids and the new ids the fork gives them.
struct Renames(Vec<(Uuid, Uuid)>);

impl Renames {
    /// An expression for an id column: the new id where it names an old one.
    fn column(&self, col: &str, first: usize) -> String {
        if self.0.is_empty() {
            return col.to_owned();
        }
        let arms: String = (0..self.0.len())
            .map(|k| {
                format!(
                    " WHEN {col} = ${} THEN ${}",
                    first + 2 * k,
                    first + 2 * k + 1
                )
            })
            .collect();
        format!("CASE{arms} ELSE {col} END")
    }

    /// An expression for a text or JSON column: every old id in it replaced (the pairs bound
    /// as text from `$first`, by [`Self::bind_texts`]).
    fn text(&self, d: Dialect, col: &str, json: bool, first: usize) -> String {
        let mut expr = match (d, json) {
            (Dialect::Postgres, true) => format!("{col}::text"),
            _ => col.to_owned(),
        };
        for k in 0..self.0.len() {
            expr = format!(
                "replace({expr}, ${}, ${})",
                first + 2 * k,
                first + 2 * k + 1
            );
        }
        match (d, json) {
            (Dialect::Postgres, true) if !self.0.is_empty() => format!("({expr})::jsonb"),
            (Dialect::Postgres, true) => col.to_owned(),
            _ => expr,
        }
    }

    /// Bind the pairs as ids (for [`Self::column`]).
    fn bind_ids(&self, mut stmt: super::sql::Q) -> super::sql::Q {
        for (old, new) in &self.0 {
            stmt = stmt.bind(*old).bind(*new);
        }
        stmt
    }

    /// Bind the pairs as text (for [`Self::text`]).
    fn bind_texts(&self, mut stmt: super::sql::Q) -> super::sql::Q {
        for (old, new) in &self.0 {
            stmt = stmt.bind(old.to_string()).bind(new.to_string());
        }
        stmt
    }
}

/// Copy the rows of `table` whose `at` is after `$6` and at or before `$3` from the source
/// thread (`$1` tenant, `$2` source, `$4` the fork), renaming ids in `run_id` and in the `texts`
/// columns; a `seq` past `$5`, the seq asked for, becomes `$5` (the commit that holds it ends
/// there on the fork, whose next commit takes the seqs after it).
async fn copy_rows(
    conn: &mut Conn,
    bulk: &Bulk,
    renames: &Renames,
    key: (&str, &ThreadId, i64, &ThreadId, i64),
    after: i64,
) -> Result<u64, StoreError> {
    let (table, columns, at, texts) = (bulk.table, &bulk.columns, bulk.at, bulk.texts);
    let d = conn.dialect();
    // Only the renames the statement refers to are bound: a statement's text must fix how many
    // parameters it takes, or a connection that prepared it once with another count (its
    // statement cache is keyed by the text) is sent a mismatched bind on the next fork.
    let ids = columns.contains(&"run_id");
    let first_text = if ids { 7 + 2 * renames.0.len() } else { 7 };
    let picked: Vec<String> = columns
        .iter()
        .map(|c| match *c {
            "thread_id" => "$4".to_owned(),
            "seq" | "created_seq" | "resolved_seq" => {
                format!("CASE WHEN {c} > $5 THEN $5 ELSE {c} END")
            }
            "run_id" => renames.column("run_id", 7),
            c => match texts.iter().find(|(t, _)| *t == c) {
                Some((_, json)) => renames.text(d, c, *json, first_text),
                None => c.to_owned(),
            },
        })
        .collect();
    let sql = format!(
        "INSERT INTO {table} ({cols}) SELECT {picked} FROM {table} \
         WHERE tenant = $1 AND thread_id = $2 AND {at} <= $3 AND {at} > $6",
        cols = columns.join(", "),
        picked = picked.join(", ")
    );
    let (tenant, source, upto, fork, asked) = key;
    let stmt = q(sql)
        .bind(tenant)
        .bind(source.as_str())
        .bind(upto)
        .bind(fork.as_str())
        .bind(asked)
        .bind(after);
    let stmt = if ids { renames.bind_ids(stmt) } else { stmt };
    let stmt = if texts.is_empty() {
        stmt
    } else {
        renames.bind_texts(stmt)
    };
    conn.exec(stmt).await
}

/// What a fork's first transaction settled, for its batches and its last transaction.
struct Plan {
    tenant: String,
    source: ThreadId,
    fork: ThreadId,
    thread: Thread,
    /// The last observation the fork holds.
    asked: i64,
    /// The end of the commit that holds `asked`: the state, messages and history go up to it.
    cut: i64,
    /// The runs under way at the cut, which go on on the fork.
    under_way: Vec<Uuid>,
    renames: Renames,
    /// Their suspensions made by the cut, each with whether its decision is asked again.
    suspensions: Vec<(Suspension, bool)>,
}

/// How long one batch of a fork's copy should hold the writer: well under the 100 ms a fork may
/// hold it at a time, so a batch of rows heavier than the last still stays under that, and short
/// enough that another writer queued behind the batches of ten forks at once (SQLite serves the
/// writer's waiters in turn) waits about a tenth of a second.
const BATCH_TARGET: Duration = Duration::from_millis(8);

/// The widest batch, in seqs (a sparse table's batches grow to it).
const MAX_BATCH_SEQS: i64 = 1 << 16;

/// A table a fork copies in batches.
struct Bulk {
    table: &'static str,
    columns: Vec<&'static str>,
    /// The seq a row is cut by.
    at: &'static str,
    /// Text columns that may name a renamed id (and whether they hold JSON).
    texts: &'static [(&'static str, bool)],
    /// Cut at the seq asked for (the log) rather than at the end of its commit.
    log: bool,
}

/// The log, messages, and history versions, in that order.
fn bulk_tables() -> [Bulk; 4] {
    let mut state = vec!["tenant", "thread_id", "seq"];
    state.extend_from_slice(STATE_COLUMNS);
    let mut items = vec!["tenant", "thread_id"];
    items.extend_from_slice(ITEM_COLUMNS);
    items.extend_from_slice(&["seq", "deleted"]);
    [
        Bulk {
            table: "observations",
            columns: vec![
                "tenant",
                "thread_id",
                "seq",
                "id",
                "run_id",
                "parent_id",
                "type",
                "title",
                "content",
                "created_at",
                "commit_changed",
                "commit_phase",
                "commit_usage",
            ],
            at: "seq",
            texts: &[("parent_id", false), ("content", true)],
            log: true,
        },
        Bulk {
            table: "messages",
            columns: vec![
                "id",
                "tenant",
                "thread_id",
                "run_id",
                "role",
                "content",
                "item_id",
                "tool_call_id",
                "created_at",
                "name",
                "tool_calls",
                "seq",
            ],
            at: "COALESCE(seq, 0)",
            texts: &[],
            log: false,
        },
        Bulk {
            table: "agent_state_versions",
            columns: state,
            at: "seq",
            texts: &[],
            log: false,
        },
        Bulk {
            table: "todo_item_versions",
            columns: items,
            at: "seq",
            texts: &[],
            log: false,
        },
    ]
}

impl SqlStore {
    /// Fork `source` (see the module), in short transactions: the first settles the cut and
    /// makes the fork's thread, hidden while `copying`; batches copy the log, messages and
    /// history, each sized to hold the writer a few tens of milliseconds; the last copies the
    /// live state, runs and suspensions and shows the fork. Another tenant's writes wait for
    /// one batch at most, never for the whole copy. A copy that fails is deleted (one whose
    /// process died, by the retention sweeper). `None` when the source does not exist, or was
    /// deleted while it was copied.
    ///
    /// # Errors
    /// [`PastError::OutOfRange`] when `at_seq` is past the source's last observation;
    /// [`StoreError::ThreadExists`] when the tenant has a thread with the new id.
    pub async fn fork_thread(
        &self,
        tenant: &str,
        source: &ThreadId,
        req: ForkRequest,
    ) -> Result<Option<Forked>, PastError> {
        let Some(plan) = self.begin_fork(tenant, source, req).await? else {
            return Ok(None);
        };
        let done = match self.copy_in_batches(&plan).await {
            Ok(()) => self.finish_fork(&plan).await,
            Err(e) => Err(e.into()),
        };
        if !matches!(done, Ok(Some(_))) {
            // Nothing of a fork that did not finish stays behind.
            let dropped = self
                .write_one()
                .await
                .map(|c| (c, plan.tenant.as_str(), plan.fork.as_str()));
            if let Ok((mut c, tenant, fork)) = dropped {
                let gone = c
                    .exec(
                        q("DELETE FROM threads WHERE tenant = $1 AND thread_id = $2 AND copying")
                            .bind(tenant)
                            .bind(fork),
                    )
                    .await;
                if let Err(e) = gone {
                    tracing::warn!(error = %e, fork, "a fork that did not finish was not deleted: \
                        the retention sweeper will");
                }
            }
        }
        done
    }

    /// The fork's first transaction: the cut, the new thread (`copying`), the runs that go on
    /// and the suspensions they hold, and the ids they get on the fork.
    async fn begin_fork(
        &self,
        tenant: &str,
        source: &ThreadId,
        req: ForkRequest,
    ) -> Result<Option<Plan>, PastError> {
        let mut tx = self.write().await?;
        // Lock the source while the cut is settled (it is read, never written; the rows up to
        // the cut never change, so the batches read them without a lock).
        let Some(last) = lock_thread(&mut tx, tenant, source).await? else {
            return Ok(None);
        };
        let asked = req.at_seq.unwrap_or(last);
        if asked > last {
            return Err(PastError::OutOfRange { asked, last });
        }
        // The state is that of the commit that holds `asked` (it committed with it); the log
        // stops at `asked` itself.
        let cut = commit_end(&mut tx, tenant, source, asked).await?;
        let src = tx
            .one(
                q("SELECT * FROM threads WHERE tenant = $1 AND thread_id = $2")
                    .bind(tenant)
                    .bind(source.as_str()),
            )
            .await?;
        let mut metadata = match req.metadata {
            Some(m) => m,
            None => src.json("metadata")?,
        };
        if let Value::Object(m) = &mut metadata {
            m.insert(
                "forkedFrom".into(),
                serde_json::json!({"threadId": source.as_str(), "atSeq": asked}),
            );
        }
        let fork = &req.thread_id;
        super::threads::thread_quota(&mut tx, tenant, self.max_threads).await?;
        let thread = tx
            .one(
                q(
                    "INSERT INTO threads (tenant, thread_id, metadata, config, created_at, \
                     updated_at, assistant_id, assistant_version, last_seq, copying) \
                   SELECT tenant, $3, $4, config, {now}, {now}, assistant_id, \
                     assistant_version, $5, TRUE FROM threads \
                   WHERE tenant = $1 AND thread_id = $2 \
                   RETURNING tenant, thread_id, metadata, config, created_at, updated_at, \
                     assistant_id, assistant_version, 'idle' AS status",
                )
                .bind(tenant)
                .bind(source.as_str())
                .bind(fork.as_str())
                .bind(metadata)
                .bind(asked),
            )
            .await
            .map_err(|e| match e {
                StoreError::Database(e) if rows::is_unique_violation(&e, Some("threads_pkey")) => {
                    StoreError::ThreadExists
                }
                e => e,
            })?;

        // The runs that go on, and their suspensions made by the cut.
        let under_way: Vec<Uuid> = tx
            .all(
                q(RUNS_UNDER_WAY)
                    .bind(tenant)
                    .bind(source.as_str())
                    .bind(cut),
            )
            .await?
            .iter()
            .map(|r| r.uuid("run_id"))
            .collect::<Result<_, _>>()?;
        let mut renames = Vec::new();
        let mut suspensions = Vec::new();
        for run in &under_way {
            renames.push((*run, new_id()));
            for row in tx
                .all(
                    q("SELECT * FROM suspensions WHERE run_id = $1 \
                       AND created_seq <= $2 ORDER BY created_at")
                    .bind(*run)
                    .bind(cut),
                )
                .await?
            {
                let s = rows::suspension_from_row(&row)?;
                let resolved_seq = row.opt_int("resolved_seq")?;
                let reask =
                    decision_unspent(&mut tx, tenant, source, &s, resolved_seq, cut).await?;
                renames.push((s.suspension_id, new_id()));
                suspensions.push((s, reask));
            }
        }
        let renames = Renames(renames);
        tx.commit().await?;
        Ok(Some(Plan {
            tenant: tenant.to_owned(),
            source: source.clone(),
            fork: fork.clone(),
            thread: rows::thread_from_row(&thread)?,
            asked,
            cut,
            under_way,
            renames,
            suspensions,
        }))
    }

    /// Copy the log, messages and history up to the cut, table by table, in batches of seqs:
    /// each batch its own transaction, its width grown or shrunk so a batch takes about
    /// [`BATCH_TARGET`] whatever the rows weigh. Each batch first checks the fork is still being
    /// copied (a sweeper that took it for abandoned, or a delete, stops the copy).
    async fn copy_in_batches(&self, plan: &Plan) -> Result<(), StoreError> {
        let (tenant, source, fork) = (plan.tenant.as_str(), &plan.source, &plan.fork);
        for bulk in bulk_tables() {
            let upto = if bulk.log { plan.asked } else { plan.cut };
            // Messages before any commit have no seq (`COALESCE(seq, 0)`): start below 0.
            let mut after = -1;
            let mut width: i64 = 256;
            while after < upto {
                let to = after.saturating_add(width).min(upto);
                let mut tx = self.write().await?;
                let started = Instant::now();
                let kept = tx
                    .exec(
                        q("UPDATE threads SET updated_at = {now} \
                           WHERE tenant = $1 AND thread_id = $2 AND copying")
                        .bind(tenant)
                        .bind(fork.as_str()),
                    )
                    .await?;
                if kept == 0 {
                    return Err(StoreError::ThreadNotFound);
                }
                let key = (tenant, source, to, fork, plan.asked);
                copy_rows(&mut tx, &bulk, &plan.renames, key, after).await?;
                tx.commit().await?;
                let took = started.elapsed();
                if took < BATCH_TARGET / 4 {
                    width = width.saturating_mul(2).min(MAX_BATCH_SEQS);
                } else if took > BATCH_TARGET {
                    width = (width / 2).max(1);
                }
                after = to;
            }
        }
        Ok(())
    }

    /// The fork's last transaction: the live state and items at the cut, the runs that go on
    /// and their suspensions (a decision not spent by the cut asked again), and the thread
    /// shown. `None` when the source was deleted meanwhile.
    async fn finish_fork(&self, plan: &Plan) -> Result<Option<Forked>, PastError> {
        let (tenant, source, fork) = (plan.tenant.as_str(), &plan.source, &plan.fork);
        let (asked, cut) = (plan.asked, plan.cut);
        let (renames, under_way, suspensions) = (&plan.renames, &plan.under_way, &plan.suspensions);
        let mut tx = self.write().await?;
        if lock_thread(&mut tx, tenant, source).await?.is_none() {
            return Ok(None);
        }
        if cut > asked {
            // Cut inside a commit: on the fork, the commit ends at its last observation there.
            tx.exec(
                q(
                    "UPDATE observations SET (commit_changed, commit_phase, commit_usage) = \
                     (SELECT s.commit_changed, s.commit_phase, s.commit_usage \
                      FROM observations s WHERE s.tenant = $1 AND s.thread_id = $2 AND s.seq = $3) \
                   WHERE tenant = $1 AND thread_id = $4 AND seq = $5",
                )
                .bind(tenant)
                .bind(source.as_str())
                .bind(cut)
                .bind(fork.as_str())
                .bind(asked),
            )
            .await?;
        }
        // The live rows: the state as it was at the cut.
        let cols = STATE_COLUMNS.join(", ");
        let copied = tx
            .exec(
                q(format!(
                    "INSERT INTO agent_state (tenant, thread_id, {cols}) \
                     SELECT tenant, thread_id, {cols} FROM agent_state_versions \
                     WHERE tenant = $1 AND thread_id = $2 AND seq <= $3 \
                     ORDER BY seq DESC LIMIT 1"
                ))
                .bind(tenant)
                .bind(fork.as_str())
                .bind(asked),
            )
            .await?;
        if copied == 0 {
            tx.exec(
                q("INSERT INTO agent_state (tenant, thread_id) VALUES ($1, $2)")
                    .bind(tenant)
                    .bind(fork.as_str()),
            )
            .await?;
        }
        let cols = ITEM_COLUMNS.join(", ");
        let picked: Vec<String> = ITEM_COLUMNS.iter().map(|c| format!("v.{c}")).collect();
        let (latest, args) = latest_items_from(&mut tx, tenant, fork, asked, 4).await?;
        let copy = q(format!(
            "INSERT INTO todo_items (tenant, thread_id, {cols}) \
             SELECT v.tenant, v.thread_id, {picked} FROM {latest} v",
            picked = picked.join(", "),
        ))
        .bind(tenant)
        .bind(fork.as_str())
        .bind(asked);
        tx.exec(args.into_iter().fold(copy, super::sql::Q::bind))
            .await?;

        // The runs, as they were after their last commit by the cut, and their suspensions: a
        // decision taken after the cut is not taken on the fork.
        let mut runs = Vec::new();
        for (run, new) in renames.0.iter().filter(|(old, _)| under_way.contains(old)) {
            let left = tx
                .opt(
                    q(
                        "SELECT commit_phase AS phase, commit_usage AS usage FROM observations \
                         WHERE tenant = $1 AND thread_id = $2 AND run_id = $3 AND seq <= $4 \
                           AND commit_phase IS NOT NULL \
                         ORDER BY seq DESC LIMIT 1",
                    )
                    .bind(tenant)
                    .bind(source.as_str())
                    .bind(*run)
                    .bind(cut),
                )
                .await?;
            // No commit of the run recorded its phase: the run predates history (its thread's
            // one point is the upgrade, the present), so its row as it is now is as it was.
            let left = match left {
                Some(r) => r,
                None => {
                    tx.one(q("SELECT phase, usage FROM runs WHERE run_id = $1").bind(*run))
                        .await?
                }
            };
            let (phase, usage) = (left.text("phase")?, left.json("usage")?);
            let pending = suspensions.iter().any(|(s, reask)| {
                s.run_id == *run && (*reask || s.status == SuspensionStatus::Pending)
            }) || tx
                .opt(
                    q(
                        "SELECT 1 AS one FROM suspensions WHERE run_id = $1 AND created_seq <= $2 \
                       AND (resolved_seq IS NULL OR resolved_seq > $2)",
                    )
                    .bind(*run)
                    .bind(cut),
                )
                .await?
                .is_some();
            let status = if pending { "suspended" } else { "queued" };
            let row = tx
                .one(
                    q(
                        "INSERT INTO runs (run_id, tenant, thread_id, status, query, config, \
                         multitask_strategy, created_at, started_at, usage, attempt, phase, \
                         cancel_requested, start_seq, trace_context, assistant_id, \
                         assistant_version) \
                       SELECT $2, tenant, $3, $4, query, config, multitask_strategy, {clock}, \
                         started_at, $5, 0, $6, FALSE, start_seq, trace_context, assistant_id, \
                         assistant_version FROM runs WHERE run_id = $1 RETURNING *",
                    )
                    .bind(*run)
                    .bind(*new)
                    .bind(fork.as_str())
                    .bind(status)
                    .bind(usage)
                    .bind(phase),
                )
                .await?;
            runs.push(rows::run_from_row(&row)?);
        }
        if runs.iter().any(|r| r.status == RunStatus::Queued) {
            // A fork that continues runs posts them: they count, with the rest of the tenant's.
            super::quotas::active_runs(&mut tx, tenant, self.max_active_runs, 0).await?;
        }
        let renamed = |old: &Uuid| {
            renames
                .0
                .iter()
                .find(|(o, _)| o == old)
                .map(|(_, n)| *n)
                .ok_or_else(|| StoreError::Decode("a copied row without its new id".into()))
        };
        let mut asked_again = Vec::new();
        for (s, reask) in suspensions {
            let new = renamed(&s.suspension_id)?;
            tx.exec(
                q(
                    "INSERT INTO suspensions (suspension_id, tenant, thread_id, run_id, item_id, \
                     kind, tool_call, allowed_decisions, question, input_schema, \
                     iteration_state, partial_tool_results, status, decision, created_at, \
                     resolved_at, expires_at, created_seq, resolved_seq) \
                   SELECT $2, s.tenant, $3, r.run_id, s.item_id, s.kind, s.tool_call, \
                     s.allowed_decisions, s.question, s.input_schema, s.iteration_state, \
                     s.partial_tool_results, \
                     CASE WHEN s.resolved_seq <= $4 THEN s.status ELSE 'pending' END, \
                     CASE WHEN s.resolved_seq <= $4 THEN s.decision END, s.created_at, \
                     CASE WHEN s.resolved_seq <= $4 THEN s.resolved_at END, s.expires_at, \
                     CASE WHEN s.created_seq > $6 THEN $6 ELSE s.created_seq END, \
                     CASE WHEN s.resolved_seq <= $4 THEN \
                       CASE WHEN s.resolved_seq > $6 THEN $6 ELSE s.resolved_seq END END \
                   FROM suspensions s JOIN runs r ON r.thread_id = $3 AND r.tenant = s.tenant \
                     AND r.run_id = $5 \
                   WHERE s.suspension_id = $1",
                )
                .bind(s.suspension_id)
                .bind(new)
                .bind(fork.as_str())
                // A decision the fork must ask again is one taken after the cut there.
                .bind(if *reask { i64::MIN } else { cut })
                .bind(renamed(&s.run_id)?)
                .bind(asked),
            )
            .await?;
            if *reask {
                let mut again = s.clone();
                again.suspension_id = new;
                again.thread_id = fork.clone();
                again.run_id = renamed(&s.run_id)?;
                again.status = SuspensionStatus::Pending;
                again.decision = None;
                again.resolved_at = None;
                asked_again.push(again);
            }
        }
        // The log shows the question asked again, after the prefix: the decision in the prefix
        // was for the source's execution of the call, not for one on the fork.
        let mut again_obs: Vec<_> = asked_again.iter().map(rows::agent_suspended).collect();
        let mut waiting: Vec<(Uuid, Vec<Uuid>)> = Vec::new();
        for s in &asked_again {
            match waiting.iter_mut().find(|(r, _)| *r == s.run_id) {
                Some((_, ids)) => ids.push(s.suspension_id),
                None => waiting.push((s.run_id, vec![s.suspension_id])),
            }
        }
        for (run, ids) in waiting {
            let usage = runs
                .iter()
                .find(|r| r.run_id == run)
                .map(|r| r.usage)
                .unwrap_or_default();
            again_obs.push(rows::run_suspended(run, ids, usage));
        }
        super::apply::append_observations(&mut tx, tenant, fork, again_obs).await?;
        tx.exec(
            q("UPDATE threads SET copying = FALSE WHERE tenant = $1 AND thread_id = $2")
                .bind(tenant)
                .bind(fork.as_str()),
        )
        .await?;
        if !runs.is_empty() {
            tx.notify(&Signal::RunReady).await?;
        }
        tx.commit().await?;
        Ok(Some(Forked {
            thread: plan.thread.clone(),
            at_seq: asked,
            runs,
        }))
    }
}

/// Whether `s` holds a person's decision to run (or answer) its call, taken by the cut, whose
/// call had no committed result by then: a decision is for one execution, so a fork holds such a
/// suspension pending again rather than execute the call on a decision it did not get. A
/// rejection (or an expiry, a cancellation) executes nothing and is kept as it was.
///
/// The call's result is its `TOOL_EXECUTION` after the decision, or for a stage inside a
/// flowchart (whose suspension's call id is `<flowchart call id>:<stage>`), the first
/// `FLOWCHART_STEP` of that call after the decision: stages run one after another, so the first
/// to finish after the decision is the stage it was for.
async fn decision_unspent(
    conn: &mut Conn,
    tenant: &str,
    source: &ThreadId,
    s: &Suspension,
    resolved_seq: Option<i64>,
    cut: i64,
) -> Result<bool, StoreError> {
    let Some(resolved) = resolved_seq.filter(|r| *r <= cut) else {
        return Ok(false);
    };
    let runs_the_call = s.status == SuspensionStatus::Resolved
        && s.decision.as_ref().is_some_and(|d| {
            matches!(
                d.kind(),
                Decision::Approve | Decision::Edit | Decision::Respond
            )
        });
    if !runs_the_call {
        return Ok(false);
    }
    let call = s.tool_call.id.as_str();
    let mut results = vec![("TOOL_EXECUTION", call)];
    if let Some((flowchart_call, _)) = call.split_once(':') {
        results.push(("FLOWCHART_STEP", flowchart_call));
    }
    let field = match conn.dialect() {
        Dialect::Postgres => "content->>'toolCallId'",
        Dialect::Sqlite => "json_extract(content, '$.toolCallId')",
    };
    for (kind, id) in results {
        let done = conn
            .opt(
                q(format!(
                    "SELECT 1 AS one FROM observations WHERE tenant = $1 AND thread_id = $2 \
                     AND run_id = $3 AND seq > $4 AND seq <= $5 AND type = $6 AND {field} = $7 \
                     LIMIT 1"
                ))
                .bind(tenant)
                .bind(source.as_str())
                .bind(s.run_id)
                .bind(resolved)
                .bind(cut)
                .bind(kind)
                .bind(id),
            )
            .await?;
        if done.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}
