//! [`SqlStore`] itself: opening it on either backend ([`PgStore`], [`SqliteStore`]), the pools
//! of one backend ([`Db`]), the connections the logic asks for (a read, a snapshot, a write
//! transaction, one write statement), and what concerns the whole store (its backend's name,
//! migrations, readiness, the backlog, the signals between processes sharing it). Each
//! operation on the data is an inherent method defined in the file of its concept (`threads`,
//! `runs`, `tenant_runs`, `leases`, `apply`, `suspensions`, `flowcharts`, …), next to its SQL:
//! those files import this one, never the reverse. Below it: the dialect modules (`postgres`,
//! `sqlite`), which know nothing of [`SqlStore`].

use std::sync::Arc;

use futures::stream::BoxStream;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

use super::fragments::ServedTenants;
use super::group::GroupCommit;
use super::postgres::{self, PgStore};
use super::signals::Signal;
use super::sql::{Conn, Dialect, Link, q};
use super::sqlite::{self, SqliteStore};
use super::{Backlog, StoreError, StoreResult};
use crate::model::ThreadId;

/// The pools of one backend.
#[derive(Debug, Clone)]
pub(crate) enum Db {
    Pg(PgPool),
    Lite {
        /// Exactly one connection: the only writer of this process.
        writer: SqlitePool,
        /// Readers (the writer pool itself for an in-memory database, which is per connection).
        reader: SqlitePool,
    },
}

/// The store over Postgres or SQLite (open one with [`PgStore::connect`] or
/// [`SqliteStore::connect`]): the only door to the database. Cheap to clone (its
/// pools are shared); the service holds one behind an `Arc`.
#[derive(Debug, Clone)]
pub struct SqlStore {
    pub(crate) db: Db,
    /// This store's id on the signals it sends (a random UUID per store).
    pub(crate) origin: Arc<str>,
    /// SQLite: batches waiting for the one writer, committed together.
    pub(crate) group: Arc<GroupCommit>,
    /// The tenants this process's claims served last (see [`ServedTenants`]).
    pub(crate) served: Arc<std::sync::Mutex<ServedTenants>>,
    /// Poked when a commit of this process may have written a webhook delivery, so the
    /// delivery loop sends it at once rather than at its next look (see `webhooks.rs`).
    pub(crate) outbox: Arc<tokio::sync::Notify>,
    /// The threads one tenant may hold (`PES_TENANT_MAX_THREADS`; see `threads::thread_quota`).
    pub(crate) max_threads: u64,
    /// Steering messages one run takes (`PES_MAX_STEERS_PER_RUN`).
    pub(crate) max_steers: u64,
    /// Runs one tenant may have queued or running (`PES_TENANT_MAX_ACTIVE_RUNS`; see `quotas`).
    pub(crate) max_active_runs: u64,
    /// Flowcharts one tenant may hold (`PES_TENANT_MAX_FLOWCHARTS`).
    pub(crate) max_flowcharts: u64,
    /// The most other transactions that can be in flight beside a write transaction, every
    /// replica's together: at most Postgres's `max_connections` (unknown: `u64::MAX`); none on
    /// SQLite, whose one writer runs one write transaction at a time.
    pub(crate) in_flight: u64,
}

impl PgStore {
    /// Connect a pool of at most `max_connections` to `url` (`postgres://…`). Does not migrate.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the URL is invalid or the server cannot be reached.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<SqlStore> {
        let (pool, in_flight) = postgres::pool(url, max_connections).await?;
        let mut store = Self::from_pool(pool);
        store.in_flight = in_flight;
        Ok(store)
    }

    /// Wrap an existing pool.
    pub fn from_pool(pool: PgPool) -> SqlStore {
        SqlStore::new(Db::Pg(pool))
    }
}

impl SqliteStore {
    /// Open (creating the file and its folder when missing) the database at `url`:
    /// `sqlite://relative/path.db`, `sqlite:///absolute/path.db` or `sqlite::memory:`.
    /// Every connection gets `foreign_keys=ON`, `busy_timeout`, and for files WAL with
    /// `synchronous=NORMAL`. Does not migrate.
    ///
    /// # Errors
    /// [`StoreError::Database`] for a malformed URL, a folder that cannot be created or a
    /// database that cannot be opened.
    pub async fn connect(url: &str) -> StoreResult<SqlStore> {
        let (writer, reader) = sqlite::pools(url).await?;
        Ok(SqlStore::new(Db::Lite { writer, reader }))
    }
}

impl SqlStore {
    /// The store over `db`'s pools, with no quota set (what the openers above build on).
    pub(crate) fn new(db: Db) -> Self {
        let in_flight = match &db {
            Db::Pg(_) => u64::MAX,
            Db::Lite { .. } => 0,
        };
        SqlStore {
            db,
            origin: crate::model::new_id().to_string().into(),
            group: Arc::default(),
            served: Arc::default(),
            outbox: Arc::default(),
            max_threads: u64::MAX,
            max_steers: u64::MAX,
            max_active_runs: u64::MAX,
            max_flowcharts: u64::MAX,
            in_flight,
        }
    }

    /// At most `max` threads per tenant: creating or forking one past it fails with
    /// [`StoreError::OverQuota`] (unlimited until set).
    #[must_use]
    pub fn with_max_threads(mut self, max: u64) -> Self {
        self.max_threads = max;
        self
    }

    /// At most `max` runs queued or running per tenant, and `flowcharts` flowcharts: enqueueing
    /// or forking a run past the first, or registering a new flowchart past the second, fails
    /// with [`StoreError::OverQuota`] (unlimited until set).
    #[must_use]
    pub fn with_tenant_quotas(mut self, max_active_runs: u64, flowcharts: u64) -> Self {
        self.max_active_runs = max_active_runs;
        self.max_flowcharts = flowcharts;
        self
    }

    /// The same store, refusing a run's steering message past `max`
    /// ([`StoreError::SteeringQuota`]).
    #[must_use]
    pub fn with_max_steers(mut self, max: u64) -> Self {
        self.max_steers = max;
        self
    }

    fn conn(&self, link: Link) -> Conn {
        Conn::new(link, &self.origin)
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self.db {
            Db::Pg(_) => Dialect::Postgres,
            Db::Lite { .. } => Dialect::Sqlite,
        }
    }

    /// The Postgres pool, when the store is on Postgres (e.g. for a `LISTEN` connection).
    pub fn pg_pool(&self) -> Option<&PgPool> {
        match &self.db {
            Db::Pg(p) => Some(p),
            Db::Lite { .. } => None,
        }
    }

    /// A pooled connection for reads (each statement on its own).
    pub(crate) async fn read(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::Pg(p.acquire().await?)),
            Db::Lite { reader, .. } => self.conn(Link::Lite(reader.acquire().await?)),
        })
    }

    /// A read-only transaction: one snapshot for several reads.
    pub(crate) async fn snapshot(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::PgTx(
                p.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?,
            )),
            Db::Lite { reader, .. } => self.conn(Link::LiteTx(reader.begin().await?)),
        })
    }

    /// A write transaction. On SQLite it is `BEGIN IMMEDIATE` on the one writer connection:
    /// writers of this process queue on the pool, and a writer in another process is waited for
    /// (`busy_timeout`) before anything was read, so read-then-write cannot deadlock.
    pub(crate) async fn write(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::PgTx(p.begin().await?)),
            Db::Lite { writer, .. } => {
                self.conn(Link::LiteTx(writer.begin_with("BEGIN IMMEDIATE").await?))
            }
        })
    }

    /// A connection for one self-contained write statement.
    pub(crate) async fn write_one(&self) -> StoreResult<Conn> {
        Ok(match &self.db {
            Db::Pg(p) => self.conn(Link::Pg(p.acquire().await?)),
            Db::Lite { writer, .. } => self.conn(Link::Lite(writer.acquire().await?)),
        })
    }
}

impl SqlStore {
    /// Backend name for logs and metrics (`postgres`, `sqlite`).
    pub fn backend(&self) -> &'static str {
        match self.dialect() {
            Dialect::Postgres => "postgres",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// Apply pending migrations (idempotent; safe with several replicas starting at once).
    ///
    /// # Errors
    /// [`StoreError::Migrate`] when a migration fails or the applied ones differ from ours.
    pub async fn migrate(&self) -> StoreResult<()> {
        match &self.db {
            Db::Pg(p) => postgres::migrate(p).await,
            Db::Lite { writer, .. } => sqlite::migrate(writer).await,
        }
    }

    /// Store reachable and migrations applied.
    ///
    /// # Errors
    /// [`StoreError::Database`] when unreachable; [`StoreError::Conflict`] naming a migration
    /// not applied yet.
    pub async fn ready(&self) -> StoreResult<()> {
        let migrator = match self.dialect() {
            Dialect::Postgres => &postgres::MIGRATOR,
            Dialect::Sqlite => &sqlite::MIGRATOR,
        };
        let applied = self
            .read()
            .await?
            .all(q("SELECT version FROM _sqlx_migrations WHERE success"))
            .await?
            .iter()
            .map(|r| r.int("version"))
            .collect::<StoreResult<Vec<i64>>>()?;
        missing_migration(migrator, &applied)
    }

    /// What waits, across every tenant and replica: queued runs and pending suspensions (read at
    /// each `/metrics` scrape; both counts use a partial index).
    pub async fn backlog(&self) -> StoreResult<Backlog> {
        let row = self
            .read()
            .await?
            .one(q(
                "SELECT (SELECT count(*) FROM runs WHERE status = 'queued') AS queued, \
                   (SELECT count(*) FROM suspensions WHERE status = 'pending') AS pending",
            ))
            .await?;
        let count = |c: &str| row.int(c).map(|n| u64::try_from(n).unwrap_or(0));
        Ok(Backlog {
            queued_runs: count("queued")?,
            pending_suspensions: count("pending")?,
        })
    }
}

impl SqlStore {
    /// Wake-ups from other processes sharing the store; `None` when the store is not shared
    /// (SQLite: one process). Delivery is best effort: callers also poll.
    ///
    /// # Errors
    /// The LISTEN connection could not be opened.
    pub async fn signals(&self) -> StoreResult<Option<BoxStream<'static, Signal>>> {
        match &self.db {
            Db::Pg(p) => postgres::signals(p, self.origin.clone()).await.map(Some),
            Db::Lite { .. } => Ok(None),
        }
    }

    /// Send these signals to the other processes sharing the store, in order, in one round
    /// trip, outside any transaction (token deltas and interest in them: best effort). Each
    /// signal's payload must fit in a NOTIFY (under 8,000 bytes). Nothing when not shared.
    ///
    /// # Errors
    /// The database refused (then none was sent).
    pub async fn send_signals(&self, signals: &[Signal]) -> StoreResult<()> {
        match &self.db {
            Db::Pg(_) if !signals.is_empty() => {
                postgres::send_signals(self.read().await?, &self.origin, signals).await
            }
            _ => Ok(()),
        }
    }

    /// The current `last_seq` of each of these threads (the poll that covers a lost signal);
    /// nothing when the store is not shared.
    pub async fn thread_seqs(
        &self,
        threads: &[(String, ThreadId)],
    ) -> StoreResult<Vec<(String, ThreadId, i64)>> {
        match &self.db {
            Db::Pg(_) => postgres::thread_seqs(self.read().await?, threads).await,
            Db::Lite { .. } => Ok(Vec::new()),
        }
    }
}

/// The first migration of `migrator` missing from `applied`, as a [`StoreError::Conflict`].
fn missing_migration(migrator: &Migrator, applied: &[i64]) -> StoreResult<()> {
    match migrator.iter().find(|m| !applied.contains(&m.version)) {
        Some(m) => Err(StoreError::Conflict(format!(
            "migration {} ({}) is not applied",
            m.version, m.description
        ))),
        None => Ok(()),
    }
}
