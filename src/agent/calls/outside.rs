//! Calls that only wait outside the process (a delegation whose remote task is recorded): which
//! items of a run do (so the scheduler may park the run and give its worker slot back,
//! [`crate::agent::RunEnd::WaitingRemote`]), and following them while the run is parked, each
//! kind as it says ([`super::CallKind::follow`]).

use std::collections::HashSet;
use std::sync::Mutex;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::{KINDS, RunRef};
use crate::agent::journal::Journal;
use crate::agent::{Engine, EngineError};
use crate::model::ThreadId;

/// The items of a run whose call only waits outside the process (a delegation that recorded its
/// remote task): the scheduler may park the run when every item in flight is one of these.
#[derive(Default)]
pub(in crate::agent) struct Watching {
    items: Mutex<HashSet<String>>,
    /// Poked when an item starts waiting, so the scheduler looks again.
    pub changed: tokio::sync::Notify,
}

impl Watching {
    pub(in crate::agent) fn insert(&self, item: &str) {
        self.items
            .lock()
            .expect("never poisoned")
            .insert(item.to_owned());
        self.changed.notify_one();
    }

    /// The item's I/O ended: it waits no more.
    pub fn remove(&self, item: &str) {
        self.items.lock().expect("never poisoned").remove(item);
    }

    /// Whether `item` only waits outside.
    pub fn contains(&self, item: &str) -> bool {
        self.items.lock().expect("never poisoned").contains(item)
    }

    /// Whether every one of `items` only waits outside (false for none).
    pub fn all<'i>(&self, mut items: impl Iterator<Item = &'i String>) -> bool {
        let set = self.items.lock().expect("never poisoned");
        let mut any = false;
        let all = items.all(|i| {
            any = true;
            set.contains(i)
        });
        any && all
    }
}

impl Engine {
    /// Follow what a parked run waits on outside the process ([`crate::agent::RunEnd::WaitingRemote`]),
    /// with the run's lease but no worker slot, committing what it reports as the run itself
    /// would: every kind's calls that wait outside. Returns once one of them settles (its outcome
    /// is committed: the run, back in the queue, reads it) or when none is left to follow.
    ///
    /// # Errors
    /// The run's records could not be read.
    pub async fn follow_outside(
        &self,
        journal: &dyn Journal,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: uuid::Uuid,
    ) -> Result<(), EngineError> {
        let run = RunRef {
            tenant,
            thread_id,
            run_id,
        };
        let mut following: FuturesUnordered<_> = KINDS
            .iter()
            .filter_map(|k| k.follow(self, journal, run))
            .collect();
        match following.next().await {
            Some(r) => r,
            None => Ok(()),
        }
    }
}
