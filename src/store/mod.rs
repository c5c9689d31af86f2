//! All persistence. The [`Store`] trait is the only door to the database. One implementation,
//! [`SqlStore`], runs on Postgres (the production backend and the coordination engine between
//! replicas; open it with [`postgres::PgStore`]) and on SQLite (the embedded default for one
//! process; [`sqlite::SqliteStore`]). Both pass one conformance suite (`tests/api/store.rs`).
//!
//! Layout: the business rules are written once, one file per concept (`threads`, `runs`,
//! `leases`, `apply`, `suspensions`, `flowcharts`), over the dialect layer `sql` (bind values, rows,
//! connections and a few SQL tokens each dialect renders); `postgres` and `sqlite` hold only what
//! truly differs (connecting, the claim, the list insert of observations, LISTEN/NOTIFY);
//! `rows` maps rows to the domain types.
//!
//! Invariants every backend keeps:
//! - an observation and the state change it reports commit in one transaction ([`Store::apply`]);
//! - observation `seq` is gap-free and strictly increasing per thread, assigned at commit;
//! - every write a worker makes for a run is fenced by the run's lease `attempt`: a write that
//!   matches no row means the lease was lost, and [`StoreError::LeaseLost`] tells the worker to stop;
//! - no transaction is held open across an LLM or tool call (the trait has no way to do so).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::flowchart::{FlowchartRecord, FlowchartSpec};
use crate::model::{
    AgentConfig, Message, MultitaskStrategy, Observation, ObservationType, ResumeDecision, Run,
    RunStatus, Suspension, SuspensionStatus, Thread, ThreadId,
};

mod apply;
mod db;
mod flowcharts;
mod fragments;
mod group;
mod leases;
pub mod postgres;
mod rows;
mod runs;
mod sql;
mod sql_store;
pub mod sqlite;
mod suspensions;
mod tables;
mod tenant_runs;
mod threads;

pub use sql_store::SqlStore;

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// What can go wrong in the store, already translated from database errors where it happens.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("a thread with this id already exists")]
    ThreadExists,
    #[error("thread not found")]
    ThreadNotFound,
    #[error("run not found")]
    RunNotFound,
    #[error("suspension not found")]
    SuspensionNotFound,
    /// `multitaskStrategy: reject` and the thread has a queued, running or suspended run.
    #[error("the thread already has an active run ({active_run})")]
    ThreadBusy { active_run: Uuid },
    /// The fenced run is no longer ours (its attempt moved on, it ended, or it was deleted).
    #[error("the run's lease was lost")]
    LeaseLost,
    /// The operation conflicts with the current state (e.g. cancelling a finished run).
    #[error("{0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data could not be decoded: {0}")]
    Decode(String),
}

/// Identifies the lease a worker holds on a run. Every write for the run checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub run_id: Uuid,
    pub attempt: i64,
}

/// Where a list page starts: the last item of the previous page. For runs and messages `id` must
/// be the UUID of that item, else the store answers [`StoreError::Decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    pub created_at: DateTime<Utc>,
    /// Thread id or run/message id (as text) of the last item seen; ties on `created_at` break on it.
    pub id: String,
}

/// What to change on a thread; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ThreadPatch {
    pub metadata: Option<Value>,
    pub config: Option<AgentConfig>,
}

/// A query to run.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub tenant: String,
    pub thread_id: ThreadId,
    pub query: String,
    pub config: AgentConfig,
    pub strategy: MultitaskStrategy,
    pub idempotency_key: Option<String>,
    /// Create the thread (empty metadata and config) when it does not exist.
    pub create_thread: bool,
    /// The trace context the run's spans continue (a stored [`crate::telemetry::TraceContext`]).
    pub trace_context: Option<String>,
}

/// What [`Store::create_run`] did.
#[derive(Debug, Clone)]
pub struct CreatedRun {
    pub run: Run,
    /// False when an earlier run with the same idempotency key was returned instead.
    pub created: bool,
    /// Observations committed on the way (e.g. `RUN_CANCELLED` of runs an `interrupt` displaced).
    pub observations: Vec<Observation>,
}

/// What [`Store::cancel_run`] did.
#[derive(Debug, Clone)]
pub struct CancelledRun {
    /// The run after the change: `cancelled` when it was queued or suspended; still `running` with
    /// its cancel flag set when a worker holds it (the worker cancels at its next safe point).
    pub run: Run,
    pub observations: Vec<Observation>,
}

/// Which of a tenant's runs [`Store::list_tenant_runs`] lists.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only the runs of this thread.
    pub thread_id: Option<ThreadId>,
    /// Only runs in one of these statuses.
    pub statuses: Option<Vec<RunStatus>>,
    /// With `statuses`: keep only the queued runs that have (`true`) or have not (`false`)
    /// started before (a resumed run waits in the queue again); other statuses are unaffected.
    pub queued_started: Option<bool>,
    /// Only runs whose last change (end, start or creation) is after this instant.
    pub updated_after: Option<DateTime<Utc>>,
}

/// Filters of the observation log.
#[derive(Debug, Clone, Default)]
pub struct ObservationQuery {
    /// Only `seq > after`.
    pub after: i64,
    /// At most this many; `0` means no limit.
    pub limit: u32,
    pub types: Option<Vec<ObservationType>>,
    pub parent_id: Option<String>,
    pub run_id: Option<Uuid>,
}

// The change set the engine commits is the engine's vocabulary: the store applies it.
pub use crate::agent::changes::{AgentSnapshot, Batch, Op, RunUpdate};

/// What [`Store::apply`] committed.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The batch's observations with their `seq`, in order.
    pub observations: Vec<Observation>,
    /// Someone asked to cancel the run; the worker should stop at its next safe point.
    pub cancel_requested: bool,
}

/// What one [`Store::claim_runs`] took, and when to look again.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    /// The runs claimed (now `running` under this worker's lease), at most as many as asked for.
    pub runs: Vec<Run>,
    /// How long until the earliest lease that has not expired yet runs out (the leases this
    /// claim took do not count): an idle worker sleeps no longer than that, so an abandoned run
    /// is taken back the moment its lease expires rather than at the next poll. `None` when no
    /// such lease exists; zero when the claim lost a race with another claimer and should be
    /// tried again at once.
    pub next_expiry: Option<Duration>,
    /// How many of `runs` were taken over: running runs whose previous worker's lease expired.
    pub taken_over: usize,
}

/// What waits: see [`Store::backlog`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Runs in the queue (new, released, or resumed after a decision).
    pub queued_runs: u64,
    /// Suspensions waiting for a person's decision.
    pub pending_suspensions: u64,
}

/// How a pending suspension is being resolved.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// `Resolved` (a person decided) or `Expired` (the sweeper, as a rejection).
    pub status: SuspensionStatus,
    /// The decision as given (an expiry is stored as a rejection with reason `expired`).
    pub decision: ResumeDecision,
    /// The trace context the rest of the run continues, when the decision came with one
    /// (otherwise the run keeps the one it was created with).
    pub trace_context: Option<String>,
}

/// What [`Store::resolve_suspension`] did.
#[derive(Debug, Clone)]
pub struct ResolvedSuspension {
    pub suspension: Suspension,
    /// The run, back in the queue.
    pub run: Run,
    /// The `AGENT_RESUMED` observation.
    pub observations: Vec<Observation>,
}

/// What [`Store::put_flowchart`] stored.
#[derive(Debug, Clone)]
pub struct PutFlowchart {
    /// The new version.
    pub record: FlowchartRecord,
    /// True when the name had no live version before (new, or deleted): the API answers 201,
    /// else 200.
    pub created: bool,
}

/// A wake-up from another process sharing the store (Postgres LISTEN/NOTIFY). Signals carry no
/// data (whoever receives one re-reads the tables), except the two about token deltas, which are
/// never stored: [`Signal::TokensWanted`] and [`Signal::Tokens`]. A payload that parses as no
/// signal (malformed, or a kind a newer replica sends) is ignored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "k")]
pub enum Signal {
    /// A thread's observations up to `seq` were committed.
    #[serde(rename = "o")]
    Observations {
        tenant: String,
        thread: String,
        seq: i64,
    },
    /// A run may have become claimable (enqueued, resumed, released, or its thread freed).
    #[serde(rename = "r")]
    RunReady,
    /// A cancel was requested for a running run.
    #[serde(rename = "c")]
    Cancel { run: Uuid },
    /// A suspension of a running run was decided: the replica that drives the run hands it the
    /// decision at once, instead of at the run's next look at its suspensions.
    #[serde(rename = "s")]
    Decided { run: Uuid },
    /// A thread was deleted: its streams end (before any thread created again under its id can
    /// be announced, since notifications arrive in commit order).
    #[serde(rename = "d")]
    ThreadDeleted { tenant: String, thread: String },
    /// The sender streams these (tenant, thread) token deltas to a client: whoever drives a run
    /// of one of them sends its deltas ([`Signal::Tokens`]) for a while (repeated while it lasts).
    #[serde(rename = "w")]
    TokensWanted { threads: Vec<(String, String)> },
    /// Token deltas of a thread's run, in the order they were written. `n` counts the sender's
    /// token payloads (Postgres folds identical payloads of one transaction into one: `n` keeps
    /// them apart).
    #[serde(rename = "t")]
    Tokens {
        tenant: String,
        thread: String,
        n: u64,
        deltas: Vec<TokenPiece>,
    },
}

/// One token delta on its way to another replica (short field names: a NOTIFY payload holds at
/// most 8,000 bytes).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenPiece {
    /// The run whose model wrote it.
    #[serde(rename = "r")]
    pub run_id: Uuid,
    /// The todo item (none for the run's plan and synthesis).
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    #[serde(rename = "p")]
    pub phase: crate::llm::Phase,
    /// The text.
    #[serde(rename = "t")]
    pub text: String,
    /// The thread's `seq` the run had committed when it was written.
    #[serde(rename = "a")]
    pub after_seq: i64,
}

/// The persistence contract. Implementations are cheap to clone behind an `Arc`.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Backend name for logs and metrics (`postgres`, `sqlite`).
    fn backend(&self) -> &'static str;

    /// Apply pending migrations (idempotent; safe with several replicas starting at once).
    async fn migrate(&self) -> StoreResult<()>;

    /// Store reachable and migrations applied.
    async fn ready(&self) -> StoreResult<()>;

    /// What waits, across every tenant and replica: queued runs and pending suspensions (read at
    /// each `/metrics` scrape; both counts use a partial index).
    async fn backlog(&self) -> StoreResult<Backlog>;

    // ----- threads -------------------------------------------------------------------------

    /// # Errors
    /// [`StoreError::ThreadExists`] when the tenant already has a thread with this id.
    async fn create_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        metadata: Value,
        config: AgentConfig,
    ) -> StoreResult<Thread>;

    async fn get_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<Option<Thread>>;

    /// Newest first (`created_at` desc, then id desc); at most `limit` rows after `cursor`
    /// (`limit` 0: no limit, in every list method).
    async fn list_threads(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<Thread>>;

    /// `None` when the thread does not exist.
    async fn update_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        patch: ThreadPatch,
    ) -> StoreResult<Option<Thread>>;

    /// Delete the thread and everything it owns; false when it did not exist.
    async fn delete_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool>;

    /// `None` when the thread does not exist.
    async fn agent_snapshot(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>>;

    /// Conversation history, oldest first; `None` when the thread does not exist.
    async fn list_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Message>>>;

    /// The newest `limit` messages of the thread-level conversation (the user's queries and the
    /// final answers: no item's tool-call turns or tool results), oldest first: the planner's
    /// context.
    async fn recent_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
    ) -> StoreResult<Vec<Message>>;

    // ----- runs ----------------------------------------------------------------------------

    /// Enqueue a run, applying the idempotency key and the multitask strategy atomically.
    ///
    /// # Errors
    /// [`StoreError::ThreadNotFound`] (unless `create_thread`), [`StoreError::ThreadBusy`] for
    /// `reject` while a run is active.
    async fn create_run(&self, new: NewRun) -> StoreResult<CreatedRun>;

    async fn get_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<Option<Run>>;

    /// Newest first; `None` when the thread does not exist.
    async fn list_runs(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Run>>>;

    /// A run by its id alone, within `tenant` (an A2A task id names a run, not its thread): the
    /// primary key, so one row; another tenant's run is `None`.
    async fn find_run(&self, tenant: &str, run_id: Uuid) -> StoreResult<Option<Run>>;

    /// How many of the tenant's runs are queued or running, counted up to `cap` (a count past
    /// it answers `cap`): what the per-tenant quota compares with its limit.
    async fn count_active_runs(&self, tenant: &str, cap: u64) -> StoreResult<u64>;

    /// The tenant's runs that `filter` selects, across threads, newest first (`created_at` desc,
    /// then id desc), at most `limit` after `cursor`; with the number of runs the filter selects
    /// in all.
    async fn list_tenant_runs(
        &self,
        tenant: &str,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<(Vec<Run>, u64)>;

    /// Cancel a queued, running or suspended run.
    ///
    /// # Errors
    /// [`StoreError::RunNotFound`]; [`StoreError::Conflict`] when the run already ended.
    async fn cancel_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<CancelledRun>;

    // ----- worker --------------------------------------------------------------------------

    /// Claim up to `max` runnable runs at once: running runs whose lease expired (earliest
    /// expiry first), then the oldest queued run of each thread that has no running or suspended
    /// run (oldest first). Each claim bumps `attempt`, sets the lease owner and expiry and moves
    /// the run to `running`; never two running runs on one thread. Fewer than `max` runs means
    /// nothing else was claimable; [`Claim::next_expiry`] then says when to look again.
    async fn claim_runs(&self, owner: &str, lease: Duration, max: usize) -> StoreResult<Claim>;

    /// Claim the next runnable run (see [`Store::claim_runs`]).
    async fn claim_run(&self, owner: &str, lease: Duration) -> StoreResult<Option<Run>> {
        Ok(self.claim_runs(owner, lease, 1).await?.runs.pop())
    }

    /// Extend the lease; returns whether a cancel was requested.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the fence no longer matches a running run.
    async fn heartbeat(&self, fence: Fence, lease: Duration) -> StoreResult<bool>;

    /// Extend the leases of many runs in one statement (a worker's heartbeat for every run it
    /// drives, so ten thousand runs waiting on a model cost one statement per period, not ten
    /// thousand): the runs whose fence still holds, each with whether a cancel was requested. A
    /// run missing from the answer lost its lease.
    async fn heartbeat_many(
        &self,
        fences: &[Fence],
        lease: Duration,
    ) -> StoreResult<Vec<(Uuid, bool)>>;

    /// Give a run back to the queue (graceful shutdown): `queued`, lease cleared.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the fence no longer matches.
    async fn release_run(&self, fence: Fence) -> StoreResult<()>;

    /// Give a run that waited on remote agents (parked, still `running`) back to the queue
    /// without changing its status: its lease runs out at once, so the next claim, on any
    /// replica, takes it and the run goes on.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the fence no longer holds.
    async fn requeue_run(&self, fence: Fence) -> StoreResult<()>;

    /// Commit a batch under the run's fence, extending its lease.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] (nothing is written) when the fence does not match a running run.
    async fn apply(&self, fence: Fence, lease: Duration, batch: Batch) -> StoreResult<Applied>;

    // ----- observations --------------------------------------------------------------------

    /// Observations in `seq` order; `None` when the thread does not exist.
    async fn list_observations(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        query: &ObservationQuery,
    ) -> StoreResult<Option<Vec<Observation>>>;

    // ----- suspensions ---------------------------------------------------------------------

    /// Pending suspensions of a thread (all of them with `include_resolved`), oldest first;
    /// `None` when the thread does not exist.
    async fn list_suspensions(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        include_resolved: bool,
    ) -> StoreResult<Option<Vec<Suspension>>>;

    async fn get_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
    ) -> StoreResult<Option<Suspension>>;

    /// Resolve a pending suspension exactly once, atomically: the suspension moves from
    /// `pending` to `resolution.status` (compare-and-set; concurrent callers get one success),
    /// its run from `suspended` back to `queued`, and an `AGENT_RESUMED` observation (parentId =
    /// the item id; content `{suspensionId, decision, reason?, expired?}`) is committed with them.
    ///
    /// # Errors
    /// [`StoreError::SuspensionNotFound`] for an unknown id or another tenant's;
    /// [`StoreError::Conflict`] when it is no longer pending.
    async fn resolve_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
    ) -> StoreResult<ResolvedSuspension>;

    // ----- flowcharts -----------------------------------------------------------------------

    /// Store `spec` as the next version of the tenant's flowchart `name`: one more than its
    /// highest version, deleted ones included (after a delete the numbering goes on).
    /// Concurrent calls for one name get distinct versions.
    async fn put_flowchart(
        &self,
        tenant: &str,
        name: &str,
        spec: &FlowchartSpec,
    ) -> StoreResult<PutFlowchart>;

    /// One version of a flowchart: `version`, or the latest when `None`. A deleted flowchart's
    /// versions are found only with `include_deleted` (the engine resuming a call pinned to a
    /// version; the API shows only live ones).
    async fn get_flowchart(
        &self,
        tenant: &str,
        name: &str,
        version: Option<i64>,
        include_deleted: bool,
    ) -> StoreResult<Option<FlowchartRecord>>;

    /// The latest version of each of the tenant's flowcharts that is not deleted, sorted by name
    /// (byte order).
    async fn list_flowcharts(&self, tenant: &str) -> StoreResult<Vec<FlowchartRecord>>;

    /// Mark every version of the flowchart deleted; false when it had no live version.
    async fn delete_flowchart(&self, tenant: &str, name: &str) -> StoreResult<bool>;

    /// Pending suspensions whose `expires_at` has passed, as `(tenant, suspension_id)`, oldest
    /// first, at most `limit`.
    async fn due_suspensions(&self, limit: u32) -> StoreResult<Vec<(String, Uuid)>>;

    // ----- replicas ------------------------------------------------------------------------

    /// Wake-ups from other processes sharing the store; `None` when the store is not shared
    /// (SQLite: one process). Delivery is best effort: callers also poll.
    async fn signals(&self) -> StoreResult<Option<futures::stream::BoxStream<'static, Signal>>> {
        Ok(None)
    }

    /// Send these signals to the other processes sharing the store, in order, in one round
    /// trip, outside any transaction (token deltas and interest in them: best effort). Each
    /// signal's payload must fit in a NOTIFY (under 8,000 bytes). Nothing when not shared.
    ///
    /// # Errors
    /// The database refused (then none was sent).
    async fn send_signals(&self, _signals: &[Signal]) -> StoreResult<()> {
        Ok(())
    }

    /// The current `last_seq` of each of these threads (the poll that covers a lost signal).
    async fn thread_seqs(
        &self,
        _threads: &[(String, ThreadId)],
    ) -> StoreResult<Vec<(String, ThreadId, i64)>> {
        Ok(Vec::new())
    }
}
