//! The run worker: claims queued runs under a lease, heartbeats, drives the engine and publishes
//! what it commits. [`Worker::try_run_next`] claims and drives one run, so tests can drive it one
//! run at a time; [`Worker::run`] claims for every free slot at once, drives the runs side by side
//! and sleeps, when idle, until it is woken, the poll interval passes or the next lease runs out.
//!
//! Every write is fenced by the run's lease `attempt`. A worker that loses its lease stops touching
//! the run at once; one that is shut down releases the run so another worker takes it over.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, warn};
use uuid::Uuid;

use crate::agent::{Engine, EngineError, Journal, RunEnd, RunInput, Signals};
use crate::commands::RunCommands;
use crate::events::EventBus;
use crate::model::{ResumeDecision, Run, SuspensionStatus};
use crate::store::{Batch, Fence, Resolution, SqlStore, StoreError};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::spans;

/// Conversation messages loaded as the planner's context (the engine keeps its own limit).
const HISTORY_MESSAGES: u32 = 40;

/// What one call of [`Worker::try_run_next`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Nothing was runnable.
    Idle,
    /// A run was driven until it ended this way.
    Ran(Uuid, RunEnd),
    /// A run was given back (shutdown), or lost to another worker, or hit a store error.
    Stopped(Uuid),
}

/// The two stages of shutdown, as the worker sees them.
#[derive(Debug, Clone, Default)]
pub struct Stops {
    /// Fires when shutdown begins: runs stop at their next safe point and are released.
    pub drain: CancellationToken,
    /// Fires when the grace period is over: steps in flight are abandoned too.
    pub hard_stop: CancellationToken,
}

/// Settings of the worker.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub owner: String,
    pub lease: Duration,
    /// Runs driven at once; 0 makes an API-only process that never claims.
    pub concurrency: usize,
    pub poll_interval: Duration,
    /// How often a held lease is renewed (a third of the lease unless set).
    pub heartbeat: Duration,
}

/// Claims and drives runs.
#[derive(Clone)]
pub struct Worker {
    store: Arc<SqlStore>,
    /// The bus its commits publish on, its wake-up, and the registry of the runs it drives.
    commands: RunCommands,
    engine: Arc<Engine>,
    settings: WorkerSettings,
    metrics: Metrics,
    /// Cancelled when the process starts shutting down: runs stop at their next safe point.
    drain: CancellationToken,
    /// Cancelled when in-flight runs must stop (after the shutdown grace period).
    hard_stop: CancellationToken,
    /// The watchers of parked runs (they hold leases but no slot).
    watchers: TaskTracker,
}

struct WorkerJournal {
    store: Arc<SqlStore>,
    tenant: String,
    thread_id: crate::model::ThreadId,
    run_id: uuid::Uuid,
    bus: EventBus,
    fence: Fence,
    lease: Duration,
    cancel: CancellationToken,
    /// Poked (through the run registry) when a decision on one of the run's suspensions arrives.
    decided: Arc<Notify>,
    /// Poked (through the run registry) when a person steers the run.
    steered: Arc<Notify>,
    metrics: Metrics,
    /// The run's side of its thread's token channel.
    tokens: Arc<crate::events::tokens::RunTokens>,
}

#[async_trait]
impl Journal for WorkerJournal {
    fn token_out(&self) -> Option<Arc<dyn crate::agent::TokenOut>> {
        Some(self.tokens.clone())
    }

    async fn commit(&self, batch: Batch) -> Result<(), EngineError> {
        let ended = batch.item_ends();
        self.tokens.before_commit().await;
        match self.store.apply(self.fence, self.lease, batch).await {
            Ok(applied) => {
                self.metrics.committed();
                if let Some(last) = applied.observations.last() {
                    self.tokens.committed(last.seq);
                }
                for (status, took) in ended {
                    self.metrics.item_ended(status, took);
                }
                self.bus.publish(&applied.observations);
                if applied.cancel_requested {
                    self.cancel.cancel();
                }
                Ok(())
            }
            Err(StoreError::LeaseLost) => Err(EngineError::LeaseLost),
            Err(e) => Err(EngineError::Store(e.into())),
        }
    }

    async fn decided(
        &self,
        ids: &[uuid::Uuid],
    ) -> Result<Vec<crate::model::Suspension>, EngineError> {
        let mut out = Vec::new();
        for id in ids {
            match self.store.get_suspension(&self.tenant, *id).await {
                Ok(Some(s)) if s.status != crate::model::SuspensionStatus::Pending => out.push(s),
                Ok(_) => {}
                Err(e) => return Err(EngineError::Store(e.into())),
            }
        }
        Ok(out)
    }

    async fn decision_arrived(&self) {
        self.decided.notified().await;
    }

    async fn steering_arrived(&self) {
        self.steered.notified().await;
    }

    async fn flowcharts(&self) -> Result<Vec<crate::flowchart::FlowchartRecord>, EngineError> {
        self.store
            .list_flowcharts(&self.tenant)
            .await
            .map_err(|e| EngineError::Store(e.into()))
    }

    async fn flowchart(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Option<crate::flowchart::FlowchartRecord>, EngineError> {
        // A pinned version is found even when deleted since: the call started on it.
        self.store
            .get_flowchart(&self.tenant, name, version, version.is_some())
            .await
            .map_err(|e| EngineError::Store(e.into()))
    }

    async fn tenant_spend(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::model::TenantDay, EngineError> {
        self.store
            .tenant_day(&self.tenant, since)
            .await
            .map_err(|e| EngineError::Store(e.into()))
    }

    async fn run_observations(
        &self,
        types: &[crate::model::ObservationType],
    ) -> Result<Vec<crate::model::Observation>, EngineError> {
        let query = crate::store::ObservationQuery {
            after: 0,
            limit: 0,
            types: Some(types.to_vec()),
            parent_id: None,
            run_id: Some(self.run_id),
        };
        self.store
            .list_observations(&self.tenant, &self.thread_id, &query)
            .await
            .map(Option::unwrap_or_default)
            .map_err(|e| EngineError::Store(e.into()))
    }
}

impl Worker {
    /// A worker over the commands' store: it sleeps on their worker wake-up (notified whenever
    /// a run may have become runnable), publishes its commits on their bus and registers the
    /// runs it drives in their registry, so cancels and decisions reach them.
    pub fn new(
        commands: RunCommands,
        engine: Arc<Engine>,
        settings: WorkerSettings,
        stops: Stops,
    ) -> Self {
        let Stops { drain, hard_stop } = stops;
        Self {
            store: commands.store().clone(),
            commands,
            engine,
            settings,
            metrics: Metrics::new(),
            drain,
            hard_stop,
            watchers: TaskTracker::new(),
        }
    }

    /// The same worker, counting what it does in `metrics` (the service's `/metrics`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Claim one runnable run and drive it until it ends, suspends or stops.
    ///
    /// # Errors
    /// A store error while claiming.
    pub async fn try_run_next(&self) -> Result<Attempt, StoreError> {
        let claim = self
            .store
            .claim_runs(&self.settings.owner, self.settings.lease, 1)
            .await?;
        self.metrics.lease_takeovers(claim.taken_over);
        match claim.runs.into_iter().next() {
            None => Ok(Attempt::Idle),
            Some(run) => Ok(self.drive(run).await),
        }
    }

    /// Claim and drive runs, up to `concurrency` at once, until `stop_claiming` fires; then wait
    /// for the runs in flight (they stop by themselves when `hard_stop` fires).
    ///
    /// One claim fills every free slot (one round trip), and a claim that filled them all is
    /// followed by another as soon as a slot frees up: there may be more. A claim that came back
    /// short took everything claimable, so the worker sleeps until it is woken (a run was
    /// enqueued or freed), the poll interval passes, or the next lease it knows of runs out —
    /// whichever comes first. That last one is what takes abandoned runs back the moment their
    /// lease expires, all of them at once; with no lease about to run out the worker polls no
    /// more often than `poll_interval`.
    pub async fn run(self, stop_claiming: CancellationToken) {
        if self.settings.concurrency == 0 {
            info!("PES_WORKER_CONCURRENCY=0: this process serves the API and runs no agents");
            return;
        }
        let slots = Arc::new(Semaphore::new(self.settings.concurrency));
        let tracker = TaskTracker::new();
        let beats_stop = CancellationToken::new();
        let beats = self.heartbeats(beats_stop.clone());
        tokio::pin!(beats);
        let claiming = self.claim_and_drive(stop_claiming, &slots, &tracker);
        tokio::select! {
            () = claiming => {}
            () = &mut beats => {}
        }
        // Runs in flight keep their leases until they end; watchers give theirs back.
        tracker.close();
        tokio::select! {
            () = tracker.wait() => {}
            () = &mut beats => {}
        }
        self.watchers.close();
        tokio::select! {
            () = self.watchers.wait() => {}
            () = &mut beats => {}
        }
        beats_stop.cancel();
    }

    async fn claim_and_drive(
        &self,
        stop_claiming: CancellationToken,
        slots: &Arc<Semaphore>,
        tracker: &TaskTracker,
    ) {
        loop {
            let first = tokio::select! {
                _ = stop_claiming.cancelled() => break,
                p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
            };
            let claimed = tokio::select! {
                _ = stop_claiming.cancelled() => break,
                c = self.fill_free_slots(first, slots, tracker) => c,
            };
            let nap = match claimed {
                // Every slot got a run: there may be more, claim again when one frees up.
                Ok(None) => continue,
                Ok(Some(nap)) => nap,
                Err(e) => {
                    error!(error = %e, "claiming runs failed; retrying");
                    tokio::select! {
                        _ = stop_claiming.cancelled() => break,
                        _ = tokio::time::sleep(self.settings.poll_interval) => {}
                    }
                    continue;
                }
            };
            tokio::select! {
                _ = stop_claiming.cancelled() => break,
                _ = self.commands.worker_woken() => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Claim a run for `first` and every other free slot in one round trip, and start driving
    /// each on `tracker`. `None` when every slot got a run; otherwise everything claimable was
    /// taken, and the answer is how long the worker may sleep before it looks again.
    async fn fill_free_slots(
        &self,
        first: OwnedSemaphorePermit,
        slots: &Arc<Semaphore>,
        tracker: &TaskTracker,
    ) -> Result<Option<Duration>, StoreError> {
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let asked = permits.len();
        let claim = self
            .store
            .claim_runs(&self.settings.owner, self.settings.lease, asked)
            .await?;
        let filled = claim.runs.len() >= asked;
        self.metrics.lease_takeovers(claim.taken_over);
        for run in claim.runs {
            let Some(permit) = permits.pop() else {
                // The store never returns more than asked; such a run's lease just expires.
                error!(run_id = %run.run_id, "the store claimed more runs than asked for");
                continue;
            };
            let me = self.clone();
            tracker.spawn(async move {
                let _permit = permit;
                me.drive(run).await;
                // The thread may have a queued run that can start now.
                me.commands.wake_worker();
            });
        }
        Ok((!filled).then(|| idle_wait(self.settings.poll_interval, claim.next_expiry)))
    }

    async fn drive(&self, run: Run) -> Attempt {
        let span = spans::invoke_agent(&run);
        let created_at = run.created_at;
        self.metrics.run_claimed();
        let outcome = self.drive_inner(run).instrument(span).await;
        let status = match outcome {
            Attempt::Ran(_, RunEnd::Completed) => "completed",
            Attempt::Ran(_, RunEnd::Failed) => "failed",
            Attempt::Ran(_, RunEnd::Cancelled) => "cancelled",
            Attempt::Ran(_, RunEnd::Suspended) => "suspended",
            Attempt::Ran(_, RunEnd::WaitingRemote) => "waiting_remote",
            _ => "released",
        };
        let age = matches!(status, "completed" | "failed" | "cancelled")
            .then(|| (chrono::Utc::now() - created_at).to_std().ok())
            .flatten();
        self.metrics.run_ended(status, age);
        outcome
    }

    async fn drive_inner(&self, run: Run) -> Attempt {
        let run_id = run.run_id;
        let fence = Fence {
            run_id,
            attempt: run.attempt,
        };
        let signals = Signals {
            cancel: CancellationToken::new(),
            drain: self.drain.clone(),
            shutdown: self.hard_stop.child_token(),
        };
        if run.cancel_requested {
            signals.cancel.cancel();
        }
        let input = match self.load(run).await {
            Ok(Some(input)) => input,
            Ok(None) => return Attempt::Stopped(run_id),
            Err(e) => {
                error!(error = %e, "loading the run failed");
                return Attempt::Stopped(run_id);
            }
        };
        let (decided, steered, lost) = self
            .commands
            .runs()
            .insert(&input.run, signals.cancel.clone());
        let journal = WorkerJournal {
            store: self.store.clone(),
            tenant: input.run.tenant.clone(),
            thread_id: input.run.thread_id.clone(),
            run_id: input.run.run_id,
            bus: self.commands.bus().clone(),
            fence,
            lease: self.settings.lease,
            cancel: signals.cancel.clone(),
            decided,
            steered,
            metrics: self.metrics.clone(),
            tokens: Arc::new(
                self.commands.bus().tokens().publisher(
                    &input.run.tenant,
                    &input.run.thread_id,
                    input.run.run_id,
                    input.run.start_seq.max(
                        self.commands
                            .bus()
                            .announced_seq(&input.run.tenant, &input.run.thread_id),
                    ),
                ),
            ),
        };
        let (tenant, thread_id) = (input.run.tenant.clone(), input.run.thread_id.clone());
        let result = tokio::select! {
            r = self.engine.drive(input, &journal, &signals) => r,
            _ = lost.cancelled() => Err(EngineError::LeaseLost),
        };
        if let Ok(RunEnd::WaitingRemote) = result {
            // The slot is given back; the lease (and the run's place in the registry, so
            // heartbeats, cancels and decisions still reach it) goes to a watcher.
            info!("every item waits on a remote agent: the run gives its slot back");
            let me = self.clone();
            let parked = Parked {
                journal,
                signals,
                lost,
                fence,
                tenant,
                thread_id,
            };
            let span = tracing::Span::current();
            self.watchers
                .spawn(async move { me.follow_remote(parked).await }.instrument(span));
            return Attempt::Ran(run_id, RunEnd::WaitingRemote);
        }
        self.commands.runs().remove(run_id);
        match result {
            Ok(end) => {
                info!(?end, "run ended");
                Attempt::Ran(run_id, end)
            }
            Err(EngineError::Stopped) => {
                match self.store.release_run(fence).await {
                    Ok(()) => info!("run released for another worker"),
                    Err(e) => warn!(error = %e, "releasing the run failed; its lease will expire"),
                }
                Attempt::Stopped(run_id)
            }
            Err(EngineError::LeaseLost) => {
                self.metrics.lease_lost();
                warn!("lease lost; another worker owns the run now");
                Attempt::Stopped(run_id)
            }
            Err(EngineError::Store(e)) => {
                error!(
                    error = format!("{e:#}"),
                    "store error; the run is retried when its lease expires"
                );
                Attempt::Stopped(run_id)
            }
        }
    }

    /// Follow the remote tasks a parked run waits on, holding its lease but no slot, until one
    /// settles, a person decides on one of its suspensions, someone cancels it, the process
    /// shuts down or the lease is lost; then (but for the last) hand the run back to the queue,
    /// still `running`, for the next claim to continue it.
    async fn follow_remote(&self, p: Parked) {
        let run_id = p.fence.run_id;
        // The decisions the run's other items wait on, should their push be lost.
        let waiting: Vec<Uuid> = match self
            .store
            .list_suspensions(&p.tenant, &p.thread_id, false)
            .await
        {
            Ok(s) => s
                .unwrap_or_default()
                .into_iter()
                .filter(|s| s.run_id == run_id)
                .map(|s| s.suspension_id)
                .collect(),
            Err(_) => vec![],
        };
        let poll = self.engine.decision_poll();
        let decided = async {
            loop {
                tokio::select! {
                    () = p.journal.decided.notified() => return,
                    () = tokio::time::sleep(poll), if !waiting.is_empty() => {
                        if p.journal.decided(&waiting).await.is_ok_and(|d| !d.is_empty()) {
                            return;
                        }
                    }
                }
            }
        };
        let why = tokio::select! {
            r = self.engine.follow_outside(&p.journal, &p.tenant, &p.thread_id, run_id) => match r {
                Ok(()) => "a remote task settled",
                Err(e) => {
                    warn!(error = %e, "following the remote tasks failed; the run looks again");
                    "an error"
                }
            },
            () = decided => "a decision arrived",
            () = p.signals.cancel.cancelled() => "a cancel was requested",
            () = self.drain.cancelled() => "shutdown",
            () = p.lost.cancelled() => {
                self.commands.runs().remove(run_id);
                self.metrics.lease_lost();
                warn!("lease lost while waiting on remote agents");
                return;
            }
        };
        // Out of the registry first: a heartbeat after the requeue would renew the lease.
        self.commands.runs().remove(run_id);
        match self.store.requeue_run(p.fence).await {
            Ok(()) => info!(%why, "the run goes back to the queue"),
            Err(e) => warn!(error = %e, %why, "requeueing the run failed; its lease will expire"),
        }
        self.commands.wake_worker();
    }

    /// Renew the leases of every run this worker drives, in one statement, every `heartbeat`
    /// (a third of the lease) until `stop` fires. A run whose lease was lost stops at once; a
    /// run someone asked to cancel is cancelled. A failed heartbeat is retried next period (the
    /// commits of busy runs extend their leases too).
    async fn heartbeats(&self, stop: CancellationToken) {
        let runs = self.commands.runs().clone();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.settings.heartbeat) => {}
            }
            let fences = runs.fences();
            if fences.is_empty() {
                continue;
            }
            match self
                .store
                .heartbeat_many(&fences, self.settings.lease)
                .await
            {
                Ok(alive) => runs.renewed(&fences, &alive),
                Err(e) => warn!(error = %e, runs = fences.len(), "heartbeat failed; retrying"),
            }
        }
    }
    async fn load(&self, mut run: Run) -> Result<Option<RunInput>, StoreError> {
        let Some(mut thread) = self.store.get_thread(&run.tenant, &run.thread_id).await? else {
            return Ok(None);
        };
        if let Some(a) = &run.assistant {
            // The version the run was enqueued with (deleted assistants included: a run already
            // enqueued finishes with it), under the thread's config and the run's, its locked
            // fields and policy floors kept; the engine overlays the two as for any run.
            let v = self
                .store
                .assistant_version(&run.tenant, &a.assistant_id, Some(a.version), true)
                .await?
                .ok_or_else(|| {
                    StoreError::Decode(format!(
                        "the run's assistant `{}` has no version {}",
                        a.assistant_id, a.version
                    ))
                })?;
            thread.config = v.base_for(&thread.config);
            run.config = v.run_overrides(&run.config);
        }
        let Some(snapshot) = self
            .store
            .agent_snapshot(&run.tenant, &run.thread_id)
            .await?
        else {
            return Ok(None);
        };
        let (own_messages, history) = self
            .store
            .recent_messages(&run.tenant, &run.thread_id, HISTORY_MESSAGES + 1)
            .await?
            .into_iter()
            .partition(|m| m.run_id == Some(run.run_id));
        // The run's own suspensions, any status: the decisions taken while it was paused. An
        // earlier run's are never this run's to act on (its end cancelled what it left).
        let suspensions = self.store.run_suspensions(&run.tenant, run.run_id).await?;
        Ok(Some(RunInput {
            run,
            thread,
            snapshot,
            history,
            suspensions,
            own_messages,
        }))
    }
}

/// A run parked on remote agents, as the watcher holds it.
struct Parked {
    journal: WorkerJournal,
    signals: Signals,
    /// Fired by the heartbeat if the lease is lost.
    lost: CancellationToken,
    fence: Fence,
    tenant: String,
    thread_id: crate::model::ThreadId,
}

/// Past a lease's expiry, before the worker looks: the store claims leases that expired strictly
/// before its clock, and the nap is never shorter than this (no busy loop).
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

/// How long a worker whose claim came back short sleeps (unless woken): the poll interval, or
/// until just after the next lease expiry if that comes sooner.
fn idle_wait(poll: Duration, next_expiry: Option<Duration>) -> Duration {
    match next_expiry {
        Some(expiry) => poll.min(expiry + EXPIRY_MARGIN),
        None => poll,
    }
}

/// Resolve suspensions whose expiry has passed as rejections (reason `expired`), so their runs go
/// on (through [`RunCommands::resume`], as a person's decision would). Safe on every replica at
/// once: each resolution is an exactly-once compare-and-set.
pub async fn sweep_suspensions(commands: RunCommands, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let due = match commands.store().due_suspensions(100).await {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "looking for expired suspensions failed");
                continue;
            }
        };
        for (tenant, id) in due {
            let resolution = Resolution {
                status: SuspensionStatus::Expired,
                decision: ResumeDecision::Reject {
                    reason: Some("expired".into()),
                },
                trace_context: None,
            };
            match commands.resume(&tenant, id, resolution).await {
                Ok(done) => {
                    info!(suspension_id = %id, run_id = %done.run.run_id, "suspension expired");
                }
                // Resolved by a person (or another replica) in the meantime.
                Err(StoreError::Conflict(_)) | Err(StoreError::SuspensionNotFound) => {}
                Err(e) => warn!(error = %e, suspension_id = %id, "expiring a suspension failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_worker_wakes_for_the_next_lease_expiry_but_never_busy_loops() {
        let poll = Duration::from_secs(1);
        assert_eq!(
            idle_wait(poll, None),
            poll,
            "no lease to wait for: the poll"
        );
        assert_eq!(
            idle_wait(poll, Some(Duration::from_millis(300))),
            Duration::from_millis(310),
            "just after the lease runs out"
        );
        assert_eq!(idle_wait(poll, Some(Duration::from_secs(20))), poll);
        assert_eq!(
            idle_wait(poll, Some(Duration::ZERO)),
            EXPIRY_MARGIN,
            "a lost race is retried soon, not in a busy loop"
        );
    }
}
