//! Observation fan-out. Every commit that writes observations publishes them here, on one broadcast
//! channel per thread, so SSE streams and waiters in this process learn about them at once.
//!
//! The bus is a fast path, never the source of truth: a subscriber that sees a gap in `seq` (it
//! lagged, or the observation was committed by another replica) re-reads the observations table.
//! That is what makes the stream gap-free and duplicate-free however the wake-up arrived.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::model::{Observation, ThreadId};

/// Capacity of one thread's channel; a slower subscriber lags and falls back to the table.
const CHANNEL_CAPACITY: usize = 256;

type Key = (String, ThreadId);

/// In-process publisher of committed observations, keyed by (tenant, thread).
#[derive(Clone, Default)]
pub struct EventBus {
    channels: Arc<Mutex<HashMap<Key, broadcast::Sender<Arc<Observation>>>>>,
}

impl EventBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Listen to a thread's observations committed from now on.
    pub fn subscribe(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> broadcast::Receiver<Arc<Observation>> {
        let mut map = self.channels.lock().expect("event bus lock poisoned");
        map.entry((tenant.to_owned(), thread_id.clone()))
            .or_insert_with(|| broadcast::channel(CHANNEL_CAPACITY).0)
            .subscribe()
    }

    /// Publish committed observations (in `seq` order). Channels nobody listens to are dropped.
    pub fn publish(&self, observations: &[Observation]) {
        if observations.is_empty() {
            return;
        }
        let mut map = self.channels.lock().expect("event bus lock poisoned");
        for obs in observations {
            let key = (obs.tenant.clone(), obs.thread_id.clone());
            if let Some(tx) = map.get(&key)
                && tx.send(Arc::new(obs.clone())).is_err()
            {
                map.remove(&key);
            }
        }
    }

    /// Threads with at least one live subscriber (for metrics).
    pub fn subscribed_threads(&self) -> usize {
        let map = self.channels.lock().expect("event bus lock poisoned");
        map.values().filter(|tx| tx.receiver_count() > 0).count()
    }
}
