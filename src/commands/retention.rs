//! Retention: threads that clean up after themselves. A thread whose
//! time-to-live passed (its `ttlSeconds`, its assistant's, else `PES_THREAD_TTL_SECONDS`) is
//! deleted by [`sweep_expired_threads`], which every replica runs; a tenant deletes its own idle
//! threads with [`UseCases::prune_threads`] and reads what one stores with
//! [`UseCases::thread_storage`].
//!
//! Every deletion goes through [`RunCommands::delete_idle_thread`]: the same path as a `DELETE`
//! of the thread (its streams end with `THREAD_DELETED`, here and on other replicas), guarded so
//! that a thread is deleted exactly once across replicas and never while a run is queued,
//! running or suspended (what "idle" means is the store's: [`Idle`]). Both are bounded: a sweep
//! pass deletes at most `PES_RETENTION_BATCH` threads, a prune call at most
//! `PES_PRUNE_MAX_THREADS` and says when more remain.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{RunCommands, UseCases};
use crate::model::{MAX_THREAD_TTL_SECONDS, ThreadId, ThreadStatus};
use crate::problem::Refusal;
use crate::store::{Idle, StoreResult, ThreadStorage};
use crate::telemetry::metrics::Metrics;

/// A prune as a door asks for it, once parsed.
#[derive(Debug, Clone)]
pub struct PruneRequest {
    /// Threads whose last activity is at least this many seconds old (0: every idle thread).
    pub older_than_seconds: u64,
    /// Only threads showing this status (`idle` or `error`; a thread with an active run is
    /// never pruned).
    pub status: Option<ThreadStatus>,
    /// Count and name the threads a prune would delete, deleting none.
    pub dry_run: bool,
}

/// What a prune did (or, dry, would do).
#[derive(Debug, Clone)]
pub struct Pruned {
    /// The threads deleted (or matched, dry), oldest activity first.
    pub thread_ids: Vec<ThreadId>,
    /// More threads match than one call handles (`PES_PRUNE_MAX_THREADS`): call again.
    pub more: bool,
}

impl UseCases {
    /// Delete (or, with `dry_run`, only find) the tenant's threads without run activity for
    /// `older_than_seconds`, of `status` when given: at most `PES_PRUNE_MAX_THREADS`, oldest
    /// activity first. A thread that becomes busy between the look and its deletion is kept.
    ///
    /// # Errors
    /// 422 for an age past ten years or a status an idle thread cannot have.
    pub async fn prune_threads(
        &self,
        tenant: &str,
        request: PruneRequest,
    ) -> Result<Pruned, Refusal> {
        if request.older_than_seconds > MAX_THREAD_TTL_SECONDS {
            return Err(Refusal::Validation(format!(
                "olderThanSeconds must be between 0 and {MAX_THREAD_TTL_SECONDS} (ten years)"
            )));
        }
        if let Some(s @ (ThreadStatus::Busy | ThreadStatus::Suspended)) = request.status {
            return Err(Refusal::Validation(format!(
                "status `{}`: a thread with a queued, running or suspended run is never pruned; \
                 prune `idle` or `error` threads",
                s.as_str()
            )));
        }
        let which = Idle::Stale {
            tenant: tenant.to_owned(),
            older_than: request.older_than_seconds,
            status: request.status,
        };
        let max = self.config.prune_max_threads;
        let mut found = self.store.idle_threads(&which, max + 1).await?;
        let more = found.len() > max as usize;
        found.truncate(max as usize);
        if request.dry_run {
            return Ok(Pruned {
                thread_ids: found.into_iter().map(|(_, id)| id).collect(),
                more,
            });
        }
        let mut deleted = Vec::with_capacity(found.len());
        for (_, id) in found {
            if self
                .commands
                .delete_idle_thread(tenant, &id, &which)
                .await?
            {
                deleted.push(id);
            }
        }
        Ok(Pruned {
            thread_ids: deleted,
            more,
        })
    }

    /// Rows and bytes of what the thread stores, by kind.
    ///
    /// # Errors
    /// 404 when the tenant has no such thread.
    pub async fn thread_storage(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> Result<ThreadStorage, Refusal> {
        self.store
            .thread_storage(tenant, thread_id)
            .await?
            .ok_or_else(Refusal::thread_not_found)
    }
}

/// How the sweeper runs: from `PES_THREAD_TTL_SECONDS`, `PES_RETENTION_INTERVAL_SECONDS` and
/// `PES_RETENTION_BATCH`.
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// The time-to-live of a thread that sets none, nor its assistant (0: none).
    pub default_ttl: u64,
    /// The pause between two passes.
    pub every: Duration,
    /// Threads one pass deletes at most.
    pub batch: u32,
}

/// How long a fork's copy may go without a batch before the sweeper takes it for stopped (its
/// process died): far longer than any batch takes.
const STALLED_FORK_SECONDS: u64 = 600;

/// One pass of the sweeper: delete the forks whose copy stopped, then at most `batch` threads
/// whose time-to-live has passed (through [`RunCommands::delete_idle_thread`]); how many
/// threads past their time this call deleted (another replica may delete some it found first).
///
/// # Errors
/// A store failure; threads deleted before it stay deleted.
pub async fn sweep_once(commands: &RunCommands, default_ttl: u64, batch: u32) -> StoreResult<u64> {
    let stalled = commands
        .store()
        .delete_stalled_forks(STALLED_FORK_SECONDS, batch)
        .await?;
    if stalled > 0 {
        info!(forks = stalled, "deleted forks whose copy stopped");
    }
    let which = Idle::Expired { default_ttl };
    let mut deleted = 0;
    for (tenant, id) in commands.store().idle_threads(&which, batch).await? {
        if commands.delete_idle_thread(&tenant, &id, &which).await? {
            info!(%tenant, thread_id = %id, "thread deleted: its time-to-live passed");
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Delete expired threads until `stop` fires: a pass every `settings.every`, or at once after a
/// pass that deleted a full batch (a backlog drains without waiting). Safe on every replica at
/// once: each thread is deleted by one of them.
pub async fn sweep_expired_threads(
    commands: RunCommands,
    settings: SweepSettings,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut wait = settings.every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = settings.every;
        match sweep_once(&commands, settings.default_ttl, settings.batch).await {
            Ok(n) => {
                metrics.retention_pass(n);
                if n >= u64::from(settings.batch) {
                    wait = Duration::ZERO;
                }
            }
            Err(e) => warn!(error = %e, "deleting expired threads failed"),
        }
    }
}
