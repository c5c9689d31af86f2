//! The runs this process drives right now ([`RunRegistry`]): how a command from outside the
//! engine (a cancel, an interrupt, a person's decision, the heartbeat's verdict on a lease) reaches
//! a run at once. The worker fills it; [`crate::commands::RunCommands`] and the replica listener
//! reach runs through it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::model::{Run, ThreadId};
use crate::store::Fence;

/// One run this process drives: how a command reaches it from outside the engine.
struct LocalRun {
    tenant: String,
    thread_id: ThreadId,
    /// The run's lease (its attempt), which the worker's heartbeat renews.
    attempt: i64,
    /// Fired by the heartbeat when the lease was lost: the run stops at once.
    lost: CancellationToken,
    /// Stops the run at its next safe point (cancel, interrupt).
    cancel: CancellationToken,
    /// Poked when one of the run's suspensions is decided while it runs, so the decision is
    /// taken in at once (see [`Journal::decision_arrived`]).
    decided: Arc<Notify>,
    steered: Arc<Notify>,
}

/// How long a cancel for a run not driven here is kept for the run, should this process be
/// about to drive it.
const EARLY_CANCEL_TTL: Duration = Duration::from_secs(60);
/// At most this many such cancels are kept (the oldest go first).
const EARLY_CANCELS: usize = 1024;

/// The runs this process drives right now, so a command (a cancel, an interrupt, a decision)
/// reaches the run at once instead of at its next heartbeat or look at the store. Filled by the
/// worker; reached through [`crate::commands::RunCommands`] and the replica listener.
#[derive(Clone, Default)]
pub struct RunRegistry {
    inner: Arc<Mutex<Runs>>,
}

#[derive(Default)]
struct Runs {
    driven: HashMap<Uuid, LocalRun>,
    /// Cancels that found no run here, newest last: a worker claims a run (reading its
    /// `cancel_requested`), loads it, and only then registers it; a cancel committed in between
    /// signals a run nobody here knows yet. [`RunRegistry::insert`] takes it from this list, so
    /// the run stops at once rather than at its next heartbeat.
    early_cancels: VecDeque<(Uuid, Instant)>,
}

impl RunRegistry {
    /// Register a run driven here; the answer is the notifications its journal awaits decisions
    /// and steering on, and the token the heartbeat fires should the lease be lost.
    pub(crate) fn insert(
        &self,
        run: &Run,
        cancel: CancellationToken,
    ) -> (Arc<Notify>, Arc<Notify>, CancellationToken) {
        let decided = Arc::new(Notify::new());
        let steered = Arc::new(Notify::new());
        let lost = CancellationToken::new();
        let local = LocalRun {
            tenant: run.tenant.clone(),
            thread_id: run.thread_id.clone(),
            attempt: run.attempt,
            lost: lost.clone(),
            cancel,
            decided: decided.clone(),
            steered: steered.clone(),
        };
        let mut runs = self.lock();
        let now = Instant::now();
        runs.early_cancels
            .retain(|(_, at)| now.duration_since(*at) < EARLY_CANCEL_TTL);
        if let Some(k) = runs
            .early_cancels
            .iter()
            .position(|(id, _)| *id == run.run_id)
        {
            runs.early_cancels.remove(k);
            local.cancel.cancel();
        }
        runs.driven.insert(run.run_id, local);
        (decided, steered, lost)
    }

    /// The leases of the runs driven here.
    pub(crate) fn fences(&self) -> Vec<Fence> {
        self.lock()
            .driven
            .iter()
            .map(|(id, r)| Fence {
                run_id: *id,
                attempt: r.attempt,
            })
            .collect()
    }

    /// Apply a heartbeat's answer: `alive` are the runs whose fence held (with whether a cancel
    /// was requested); every other run of `asked` lost its lease.
    pub(crate) fn renewed(&self, asked: &[Fence], alive: &[(Uuid, bool)]) {
        let alive: HashMap<Uuid, bool> = alive.iter().copied().collect();
        let runs = self.lock();
        for fence in asked {
            let Some(run) = runs.driven.get(&fence.run_id) else {
                continue;
            };
            match alive.get(&fence.run_id) {
                Some(true) => run.cancel.cancel(),
                Some(false) => {}
                None if run.attempt == fence.attempt => run.lost.cancel(),
                None => {}
            }
        }
    }

    pub(crate) fn remove(&self, run_id: Uuid) {
        self.lock().driven.remove(&run_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.inner.lock().expect("registry lock")
    }

    /// Cancel a run driven here; false when this process does not drive it.
    /// A cancel for a run not driven here is kept a minute, for a run this process has claimed
    /// but not registered yet (see [`Runs::early_cancels`]).
    pub fn cancel(&self, run_id: Uuid) -> bool {
        let mut runs = self.lock();
        match runs.driven.get(&run_id) {
            Some(r) => {
                r.cancel.cancel();
                true
            }
            None => {
                if runs.early_cancels.len() >= EARLY_CANCELS {
                    runs.early_cancels.pop_front();
                }
                runs.early_cancels.push_back((run_id, Instant::now()));
                false
            }
        }
    }

    /// Cancel the runs of a thread driven here, but `except` (an `interrupt` displaced them in
    /// favour of `except`); how many there were.
    pub fn cancel_thread(&self, tenant: &str, thread_id: &ThreadId, except: Uuid) -> usize {
        let map = self.lock();
        let mut n = 0;
        for (id, r) in map.driven.iter() {
            if *id != except && r.tenant == tenant && &r.thread_id == thread_id {
                r.cancel.cancel();
                n += 1;
            }
        }
        n
    }

    /// One of a run's suspensions was decided while it runs: tell the run, if this process
    /// drives it (false otherwise). A run not waiting for it yet finds it when it next waits.
    pub fn decided(&self, run_id: Uuid) -> bool {
        match self.lock().driven.get(&run_id) {
            Some(r) => {
                // `notify_one` keeps a permit when nobody waits right now, so a decision that
                // arrives between two waits is not missed.
                r.decided.notify_one();
                true
            }
            None => false,
        }
    }

    /// Runs driven by this process right now.
    /// A person steered a run: tell the run, if this process drives it. False when it does not.
    pub fn steered(&self, run_id: Uuid) -> bool {
        match self.lock().driven.get(&run_id) {
            Some(r) => {
                r.steered.notify_one();
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.lock().driven.len()
    }

    /// No run is driven here.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AgentConfig, MultitaskStrategy, RunPhase, RunStatus, Usage, new_id};

    fn run() -> Run {
        Run {
            run_id: new_id(),
            thread_id: ThreadId::from_stored("t".into()),
            tenant: "default".into(),
            status: RunStatus::Running,
            kind: crate::model::RunKind::Agent,
            query: "q".into(),
            config: AgentConfig::default(),
            assistant: None,
            multitask_strategy: MultitaskStrategy::Enqueue,
            idempotency_key: None,
            created_at: chrono::Utc::now(),
            started_at: None,
            ended_at: None,
            usage: Usage::default(),
            error: None,
            final_response: None,
            suspension: None,
            attempt: 1,
            cron_id: None,
            phase: RunPhase::New,
            cancel_requested: false,
            start_seq: 0,
            trace_context: None,
            flowchart: None,
        }
    }

    /// A cancel signalled while the worker was still loading the run it had claimed stops the
    /// run as soon as it is registered; a run no cancel named starts uncancelled.
    #[test]
    fn a_cancel_that_came_before_the_run_was_registered_is_kept_for_it() {
        let registry = RunRegistry::default();
        let (early, other) = (run(), run());
        assert!(!registry.cancel(early.run_id), "not driven here yet");
        let token = CancellationToken::new();
        registry.insert(&early, token.clone());
        assert!(token.is_cancelled());
        let token = CancellationToken::new();
        registry.insert(&other, token.clone());
        assert!(!token.is_cancelled());
        // Taken once: the run's next attempt here is not cancelled by it again.
        registry.remove(early.run_id);
        let token = CancellationToken::new();
        registry.insert(&early, token.clone());
        assert!(!token.is_cancelled());
        // Bounded: the oldest of too many unknown runs' cancels go first.
        let first = run();
        registry.cancel(first.run_id);
        for _ in 0..EARLY_CANCELS {
            registry.cancel(new_id());
        }
        let token = CancellationToken::new();
        registry.insert(&first, token.clone());
        assert!(!token.is_cancelled());
    }
}
