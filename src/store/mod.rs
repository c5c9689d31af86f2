//! All persistence. [`SqlStore`] is the only door to the database: one concrete type, used
//! directly (`Arc<SqlStore>`), whose every operation is one inherent method. It runs on Postgres
//! (the production backend and the coordination engine between replicas; open it with
//! [`postgres::PgStore`]) and on SQLite (the embedded default for one process;
//! [`sqlite::SqliteStore`]); the backend is a closed enum inside it, not a trait. Both pass one
//! conformance suite (`tests/api/store.rs`). The engine does not see it: its seam is
//! [`crate::agent::Journal`], which the worker implements over the store and the engine's tests
//! replace with a double.
//!
//! Layout, in layers (a file imports only files of the layers below its own, never one that
//! imports it back):
//! - the concepts, each an `impl SqlStore` block next to its SQL, defined once for both
//!   dialects: `threads` (threads, their messages and observations), `runs` (enqueue, read,
//!   cancel), `tenant_runs` (runs found without their thread), `leases` (claim, heartbeat,
//!   release), `apply` (committing the engine's batches), `suspensions`, `steering`, `forks`,
//!   `history` (past states), `flowcharts`, `assistants`, `retention` (idle threads and what a
//!   thread stores), `webhooks` (the outbox's delivery), `crons`, `tenant_spend`, `memory` (the
//!   memory store's items) and `memory_scan` (its namespace listing, sweeper and embedding pass);
//! - `sql_store`: the type itself, opening it, its connections and what concerns the whole
//!   store (migrations, readiness, the backlog, signals between processes);
//! - the dialects, which know nothing of [`SqlStore`]: `postgres` and `sqlite` hold only what
//!   truly differs (their pools, the claim, how a commit is rendered in one round trip, the list
//!   insert of observations, LISTEN/NOTIFY), and `group` is SQLite's group commit;
//! - `commit`: what a commit of the engine's batch writes, described once for both dialects;
//! - below them: `fragments` (SQL text shared by the commit and claim paths: the fenced run
//!   update, history copies, the outbox row, the claim's candidates), `tables` (the rows the
//!   engine's ops write), `rows` (rows to domain types, one decoder per type), `quotas`, the
//!   dialect layer `sql` (bind values, rows, connections and a few SQL tokens each dialect
//!   renders) and `signals` (what a wake-up between processes says).
//!
//! Invariants every backend keeps:
//! - an observation and the state change it reports commit in one transaction
//!   ([`SqlStore::apply`]);
//! - observation `seq` is gap-free and strictly increasing per thread, assigned at commit;
//! - every write a worker makes for a run is fenced by the run's lease `attempt`: a write that
//!   matches no row means the lease was lost, and [`StoreError::LeaseLost`] tells the worker to stop;
//! - no transaction is held open across an LLM or tool call (no method returns one).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::flowchart::FlowchartRecord;
use crate::model::{
    AgentConfig, AssistantPin, AssistantRef, MultitaskStrategy, Observation, ObservationType,
    ResumeDecision, Run, RunStatus, Suspension, SuspensionStatus, ThreadId,
};

mod apply;
mod assistants;
mod commit;
mod crons;
mod flowcharts;
mod forks;
mod fragments;
mod group;
mod history;
mod leases;
mod memory;
mod memory_scan;
pub mod postgres;
mod quotas;
mod retention;
mod rows;
mod runs;
mod signals;
mod sql;
mod sql_store;
pub mod sqlite;
mod steering;
mod suspensions;
mod tables;
mod tenant_runs;
mod tenant_spend;
mod threads;
mod webhooks;

pub use crons::{CronDraft, TickRecord};
pub use forks::{ForkRequest, Forked};
pub use history::{HistoryPoint, PastError, PastState};
pub use memory::{MemoryPut, MemoryScope, PendingEmbedding, PutMemory};
pub use retention::{Footprint, Idle, ThreadStorage};
pub use signals::{Signal, TokenPiece};
pub use sql_store::SqlStore;
pub use steering::SteeredRun;
pub use webhooks::{ClaimedDelivery, DeliveryFilter, DeliveryOutcome};

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
    #[error("an assistant with this id already exists")]
    AssistantExists,
    /// The tenant has no live assistant with this id (never created, or deleted).
    #[error("assistant `{0}` not found")]
    AssistantNotFound(String),
    /// The assistant exists but not this version (never made, or pruned).
    #[error("assistant `{assistant_id}` has no version {version}")]
    AssistantVersionNotFound { assistant_id: String, version: i64 },
    /// `multitaskStrategy: reject` and the thread has a queued, running or suspended run.
    #[error("the thread already has an active run ({active_run})")]
    ThreadBusy { active_run: Uuid },
    /// The tenant holds as many of something as its quota allows (`setting` names it); nothing
    /// was made. Counted in the creating transaction under a per-tenant lock, so creations on
    /// several replicas at once never pass it.
    #[error("the tenant has {max} {what}, its quota ({setting})")]
    OverQuota {
        /// What is counted, as a person reads it ("runs queued or running").
        what: &'static str,
        /// The setting that sets the quota (`PES_TENANT_MAX_ACTIVE_RUNS`).
        setting: &'static str,
        max: u64,
        /// What the client can do about it.
        hint: &'static str,
        /// When trying again may succeed, in seconds.
        retry_after_seconds: u64,
    },
    /// The run holds as many steering messages as `PES_MAX_STEERS_PER_RUN` allows.
    #[error("the run has {max} steering messages, its limit")]
    SteeringQuota { max: u64 },
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
    /// `Some(None)` detaches the thread from its assistant; `Some(Some(pin))` sets it.
    pub assistant: Option<Option<AssistantPin>>,
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
    /// The assistant version the run uses, chosen by the caller; `None` uses the thread's
    /// assistant (its pinned version, or the current one, read in the enqueue's transaction).
    pub assistant: Option<AssistantRef>,
    /// The trace context the run's spans continue (a stored [`crate::telemetry::TraceContext`]).
    pub trace_context: Option<String>,
    /// The cron whose tick makes this run.
    pub cron_id: Option<Uuid>,
    /// A `flowchart` run's flowchart and input; `None` makes an `agent` run.
    pub flowchart: Option<crate::model::FlowchartCall>,
}

/// What [`SqlStore::create_run`] did.
#[derive(Debug, Clone)]
pub struct CreatedRun {
    pub run: Run,
    /// False when an earlier run with the same idempotency key was returned instead.
    pub created: bool,
    /// Observations committed on the way (e.g. `RUN_CANCELLED` of runs an `interrupt` displaced).
    pub observations: Vec<Observation>,
}

/// What [`SqlStore::cancel_run`] did.
#[derive(Debug, Clone)]
pub struct CancelledRun {
    /// The run after the change: `cancelled` when it was queued or suspended; still `running` with
    /// its cancel flag set when a worker holds it (the worker cancels at its next safe point).
    pub run: Run,
    pub observations: Vec<Observation>,
}

/// Which of a tenant's runs [`SqlStore::list_tenant_runs`] lists.
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

/// How much of each todo item a snapshot reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ItemDetail {
    /// Every column: what the engine continues a run from.
    Full,
    /// What the state view shows: the items' ReAct conversations are left out (read as empty).
    View,
}

// The change set the engine commits is the engine's vocabulary: the store applies it.
pub use crate::agent::changes::{AgentSnapshot, Batch, Op, RunUpdate};

/// What [`SqlStore::apply`] committed.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The batch's observations with their `seq`, in order.
    pub observations: Vec<Observation>,
    /// Someone asked to cancel the run; the worker should stop at its next safe point.
    pub cancel_requested: bool,
}

/// What one [`SqlStore::claim_runs`] took, and when to look again.
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

/// What waits: see [`SqlStore::backlog`].
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

/// What [`SqlStore::resolve_suspension`] did.
#[derive(Debug, Clone)]
pub struct ResolvedSuspension {
    pub suspension: Suspension,
    /// The run, back in the queue.
    pub run: Run,
    /// The `AGENT_RESUMED` observation.
    pub observations: Vec<Observation>,
}

/// A new version of an assistant, as [`SqlStore::create_assistant`] and
/// [`SqlStore::update_assistant`] store it. `None` fields of an update keep the current
/// version's value.
#[derive(Debug, Clone, Default)]
pub struct AssistantDraft {
    pub name: Option<String>,
    pub description: Option<String>,
    pub config: AgentConfig,
    pub locked: Option<Vec<String>>,
}

/// What [`SqlStore::put_flowchart`] stored.
#[derive(Debug, Clone)]
pub struct PutFlowchart {
    /// The new version.
    pub record: FlowchartRecord,
    /// True when the name had no live version before (new, or deleted): the API answers 201,
    /// else 200.
    pub created: bool,
}
