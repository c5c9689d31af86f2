//! [`SqlStore`]: the one [`Store`] implementation, over either backend. The logic lives in one
//! file per concept (`threads`, `runs`, `leases`, `apply`, `suspensions`) and is written once;
//! what truly differs per backend (connecting, the claim query, the seq counter's round trip,
//! inserting a list of observations, LISTEN/NOTIFY) is in `postgres.rs` and `sqlite.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::sql::{Conn, Dialect, Link};
use super::{
    AgentSnapshot, Applied, Batch, CancelledRun, Claim, CreatedRun, Fence, NewRun,
    ObservationQuery, PageCursor, Resolution, ResolvedSuspension, Signal, Store, StoreResult,
    ThreadPatch,
};
use crate::model::{AgentConfig, Message, Observation, Run, Suspension, Thread, ThreadId};

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

/// The store over Postgres or SQLite (open one with [`super::postgres::PgStore::connect`] or
/// [`super::sqlite::SqliteStore::connect`]).
#[derive(Debug, Clone)]
pub struct SqlStore {
    pub(crate) db: Db,
    /// This store's id on the signals it sends (a random UUID per store).
    pub(crate) origin: Arc<str>,
}

impl SqlStore {
    pub(crate) fn new(db: Db) -> Self {
        SqlStore {
            db,
            origin: crate::model::new_id().to_string().into(),
        }
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

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        match self.dialect() {
            Dialect::Postgres => "postgres",
            Dialect::Sqlite => "sqlite",
        }
    }

    async fn migrate(&self) -> StoreResult<()> {
        match &self.db {
            Db::Pg(p) => super::postgres::migrate(p).await,
            Db::Lite { writer, .. } => super::sqlite::migrate(writer).await,
        }
    }

    async fn ready(&self) -> StoreResult<()> {
        let migrator = match self.dialect() {
            Dialect::Postgres => &super::postgres::MIGRATOR,
            Dialect::Sqlite => &super::sqlite::MIGRATOR,
        };
        self.migrations_applied(migrator).await
    }

    async fn create_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        metadata: Value,
        config: AgentConfig,
    ) -> StoreResult<Thread> {
        self.insert_thread(tenant, thread_id, metadata, config)
            .await
    }

    async fn get_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<Option<Thread>> {
        self.thread(tenant, thread_id).await
    }

    async fn list_threads(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<Thread>> {
        self.threads(tenant, limit, cursor).await
    }

    async fn update_thread(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        patch: ThreadPatch,
    ) -> StoreResult<Option<Thread>> {
        self.patch_thread(tenant, thread_id, patch).await
    }

    async fn delete_thread(&self, tenant: &str, thread_id: &ThreadId) -> StoreResult<bool> {
        self.remove_thread(tenant, thread_id).await
    }

    async fn agent_snapshot(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> StoreResult<Option<AgentSnapshot>> {
        self.snapshot_of(tenant, thread_id).await
    }

    async fn list_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Message>>> {
        self.messages(tenant, thread_id, limit, cursor).await
    }

    async fn recent_messages(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
    ) -> StoreResult<Vec<Message>> {
        self.newest_messages(tenant, thread_id, limit).await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreatedRun> {
        self.enqueue(new).await
    }

    async fn get_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<Option<Run>> {
        self.run(tenant, thread_id, run_id).await
    }

    async fn list_runs(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Option<Vec<Run>>> {
        self.runs(tenant, thread_id, limit, cursor).await
    }

    async fn cancel_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> StoreResult<CancelledRun> {
        self.cancel(tenant, thread_id, run_id).await
    }

    async fn claim_runs(&self, owner: &str, lease: Duration, max: usize) -> StoreResult<Claim> {
        match &self.db {
            Db::Pg(_) => {
                super::postgres::claim_runs(self.write_one().await?, owner, lease, max).await
            }
            Db::Lite { .. } => {
                let conn = self.write().await?;
                super::sqlite::claim_runs(conn, owner, lease, max).await
            }
        }
    }

    async fn heartbeat(&self, fence: Fence, lease: Duration) -> StoreResult<bool> {
        self.extend_lease(fence, lease).await
    }

    async fn heartbeat_many(
        &self,
        fences: &[Fence],
        lease: Duration,
    ) -> StoreResult<Vec<(Uuid, bool)>> {
        self.extend_leases(fences, lease).await
    }

    async fn release_run(&self, fence: Fence) -> StoreResult<()> {
        self.release(fence).await
    }

    async fn apply(&self, fence: Fence, lease: Duration, batch: Batch) -> StoreResult<Applied> {
        self.commit_batch(fence, lease, batch).await
    }

    async fn list_observations(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        query: &ObservationQuery,
    ) -> StoreResult<Option<Vec<Observation>>> {
        self.observations(tenant, thread_id, query).await
    }

    async fn list_suspensions(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        include_resolved: bool,
    ) -> StoreResult<Option<Vec<Suspension>>> {
        self.suspensions(tenant, thread_id, include_resolved).await
    }

    async fn get_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
    ) -> StoreResult<Option<Suspension>> {
        self.suspension(tenant, suspension_id).await
    }

    async fn resolve_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        resolution: Resolution,
    ) -> StoreResult<ResolvedSuspension> {
        self.resolve(tenant, suspension_id, resolution).await
    }

    async fn due_suspensions(&self, limit: u32) -> StoreResult<Vec<(String, Uuid)>> {
        self.due(limit).await
    }

    async fn signals(&self) -> StoreResult<Option<futures::stream::BoxStream<'static, Signal>>> {
        match &self.db {
            Db::Pg(p) => super::postgres::signals(p, self.origin.clone())
                .await
                .map(Some),
            Db::Lite { .. } => Ok(None),
        }
    }

    async fn thread_seqs(
        &self,
        threads: &[(String, ThreadId)],
    ) -> StoreResult<Vec<(String, ThreadId, i64)>> {
        match &self.db {
            Db::Pg(_) => super::postgres::thread_seqs(self.read().await?, threads).await,
            Db::Lite { .. } => Ok(Vec::new()),
        }
    }
}
