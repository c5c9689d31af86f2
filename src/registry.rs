//! The runs this process drives right now ([`RunRegistry`]): how a command from outside the
//! engine (a cancel, an interrupt, a person's decision, the heartbeat's verdict on a lease) reaches
//! a run at once. The worker fills it; [`crate::commands::RunCommands`] and the replica listener
//! reach runs through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

/// The runs this process drives right now, so a command (a cancel, an interrupt, a decision)
/// reaches the run at once instead of at its next heartbeat or look at the store. Filled by the
/// worker; reached through [`crate::commands::RunCommands`] and the replica listener.
#[derive(Clone, Default)]
pub struct RunRegistry {
    inner: Arc<Mutex<HashMap<Uuid, LocalRun>>>,
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
        self.lock().insert(run.run_id, local);
        (decided, steered, lost)
    }

    /// The leases of the runs driven here.
    pub(crate) fn fences(&self) -> Vec<Fence> {
        self.lock()
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
            let Some(run) = runs.get(&fence.run_id) else {
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
        self.lock().remove(&run_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, LocalRun>> {
        self.inner.lock().expect("registry lock")
    }

    /// Cancel a run driven here; false when this process does not drive it.
    pub fn cancel(&self, run_id: Uuid) -> bool {
        match self.lock().get(&run_id) {
            Some(r) => {
                r.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Cancel the runs of a thread driven here, but `except` (an `interrupt` displaced them in
    /// favour of `except`); how many there were.
    pub fn cancel_thread(&self, tenant: &str, thread_id: &ThreadId, except: Uuid) -> usize {
        let map = self.lock();
        let mut n = 0;
        for (id, r) in map.iter() {
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
        match self.lock().get(&run_id) {
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
        match self.lock().get(&run_id) {
            Some(r) => {
                r.steered.notify_one();
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No run is driven here.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
