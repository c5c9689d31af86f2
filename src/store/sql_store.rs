//! [`SqlStore`]: the one [`Store`] implementation, over either backend. The logic lives in one
//! file per concept (`threads`, `runs`, `leases`, `apply`, `suspensions`) and is written once;
//! what truly differs per backend (connecting, the claim query, the seq counter's round trip,
//! inserting a list of observations, LISTEN/NOTIFY) is in `postgres.rs` and `sqlite.rs`.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use super::db::Db;
pub use super::db::SqlStore;
use super::rows::Cols;
use super::sql::{Dialect, q};
use super::{
    AgentSnapshot, Applied, Backlog, Batch, CancelledRun, Claim, CreatedRun, Fence, NewRun,
    ObservationQuery, PageCursor, PutFlowchart, Resolution, ResolvedSuspension, RunFilter, Signal,
    Store, StoreResult, ThreadPatch,
};
use crate::flowchart::{FlowchartRecord, FlowchartSpec};
use crate::model::{AgentConfig, Message, Observation, Run, Suspension, Thread, ThreadId};

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

    async fn backlog(&self) -> StoreResult<Backlog> {
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

    async fn find_run(&self, tenant: &str, run_id: Uuid) -> StoreResult<Option<Run>> {
        self.run_by_id(tenant, run_id).await
    }

    async fn count_active_runs(&self, tenant: &str, cap: u64) -> StoreResult<u64> {
        self.active_runs(tenant, cap).await
    }

    async fn list_tenant_runs(
        &self,
        tenant: &str,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<(Vec<Run>, u64)> {
        self.tenant_runs(tenant, filter, limit, cursor).await
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

    async fn requeue_run(&self, fence: Fence) -> StoreResult<()> {
        self.requeue(fence).await
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

    async fn put_flowchart(
        &self,
        tenant: &str,
        name: &str,
        spec: &FlowchartSpec,
    ) -> StoreResult<PutFlowchart> {
        self.insert_flowchart(tenant, name, spec).await
    }

    async fn get_flowchart(
        &self,
        tenant: &str,
        name: &str,
        version: Option<i64>,
        include_deleted: bool,
    ) -> StoreResult<Option<FlowchartRecord>> {
        self.flowchart(tenant, name, version, include_deleted).await
    }

    async fn list_flowcharts(&self, tenant: &str) -> StoreResult<Vec<FlowchartRecord>> {
        self.flowcharts(tenant).await
    }

    async fn delete_flowchart(&self, tenant: &str, name: &str) -> StoreResult<bool> {
        self.remove_flowchart(tenant, name).await
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

    async fn send_signals(&self, signals: &[Signal]) -> StoreResult<()> {
        match &self.db {
            Db::Pg(_) if !signals.is_empty() => {
                super::postgres::send_signals(self.read().await?, &self.origin, signals).await
            }
            _ => Ok(()),
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
