//! The in-process bus. Every commit that writes observations publishes them here, on one
//! broadcast channel per thread, so SSE streams and waiters in this process learn about them at
//! once. Observations committed by another replica arrive as [`BusMsg::Wake`] (from
//! [`super::replicas`]: Postgres LISTEN/NOTIFY, or the poll that covers a lost notification).
//!
//! The bus is a fast path, never the source of truth: a subscriber that sees a gap in `seq` (it
//! lagged, or was woken for an observation it has not seen) re-reads the observations table.
//! That is what makes the stream gap-free and duplicate-free however the wake-up arrived.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::model::{Observation, ThreadId};

/// Capacity of one thread's channel; a slower subscriber lags and falls back to the table.
const CHANNEL_CAPACITY: usize = 256;

type Key = (String, ThreadId);

/// What a thread's subscribers receive.
#[derive(Debug, Clone)]
pub enum BusMsg {
    /// An observation committed by this process.
    Obs(Arc<Observation>),
    /// Observations up to this `seq` were committed elsewhere: read them from the table.
    Wake(i64),
    /// The thread was deleted: streams end with a final event saying so. The channel is dropped
    /// with it, so a thread created again under the same id starts a channel of its own and no
    /// old subscriber ever sees the new thread's log.
    ThreadDeleted,
}

struct Channel {
    tx: broadcast::Sender<BusMsg>,
    /// Highest `seq` announced on the channel.
    last_seq: i64,
}

/// In-process publisher of committed observations, keyed by (tenant, thread); beside them, the
/// token channels of the same threads.
#[derive(Clone, Default)]
pub struct EventBus {
    channels: Arc<Mutex<HashMap<Key, Channel>>>,
    tokens: super::TokenChannels,
}

impl EventBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// The ephemeral token deltas of the runs driven by this process.
    pub fn tokens(&self) -> &super::TokenChannels {
        &self.tokens
    }

    /// Listen to a thread's observations committed from now on.
    pub fn subscribe(&self, tenant: &str, thread_id: &ThreadId) -> broadcast::Receiver<BusMsg> {
        let mut map = self.channels.lock().expect("event bus lock poisoned");
        map.entry((tenant.to_owned(), thread_id.clone()))
            .or_insert_with(|| Channel {
                tx: broadcast::channel(CHANNEL_CAPACITY).0,
                last_seq: 0,
            })
            .tx
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
            if let Some(ch) = map.get_mut(&key) {
                ch.last_seq = ch.last_seq.max(obs.seq);
                if ch.tx.send(BusMsg::Obs(Arc::new(obs.clone()))).is_err() {
                    map.remove(&key);
                }
            }
        }
    }

    /// Observations up to `seq` exist on a thread (committed by another process): wake its
    /// subscribers unless they have already been told about them.
    pub fn wake(&self, tenant: &str, thread_id: &ThreadId, seq: i64) {
        let mut map = self.channels.lock().expect("event bus lock poisoned");
        let key = (tenant.to_owned(), thread_id.clone());
        if let Some(ch) = map.get_mut(&key)
            && seq > ch.last_seq
        {
            ch.last_seq = seq;
            if ch.tx.send(BusMsg::Wake(seq)).is_err() {
                map.remove(&key);
            }
        }
    }

    /// A thread is gone (deleted here, or found missing by the replica poll): tell its
    /// subscribers, then forget its channel.
    pub fn thread_deleted(&self, tenant: &str, thread_id: &ThreadId) {
        let mut map = self.channels.lock().expect("event bus lock poisoned");
        if let Some(ch) = map.remove(&(tenant.to_owned(), thread_id.clone())) {
            let _ = ch.tx.send(BusMsg::ThreadDeleted);
        }
    }

    /// Threads with at least one live subscriber, with the highest `seq` announced to them.
    pub fn watched(&self) -> Vec<(String, ThreadId, i64)> {
        let mut map = self.channels.lock().expect("event bus lock poisoned");
        map.retain(|_, ch| ch.tx.receiver_count() > 0);
        map.iter()
            .map(|((t, id), ch)| (t.clone(), id.clone(), ch.last_seq))
            .collect()
    }

    /// The highest `seq` announced on the thread's channel (0 when nobody listens).
    pub fn announced_seq(&self, tenant: &str, thread_id: &ThreadId) -> i64 {
        let map = self.channels.lock().expect("event bus lock poisoned");
        map.get(&(tenant.to_owned(), thread_id.clone()))
            .map_or(0, |ch| ch.last_seq)
    }

    /// Threads with at least one live subscriber (for metrics).
    pub fn subscribed_threads(&self) -> usize {
        let map = self.channels.lock().expect("event bus lock poisoned");
        map.values().filter(|ch| ch.tx.receiver_count() > 0).count()
    }

    /// Live subscribers over every thread: SSE streams and requests waiting for a run (for
    /// metrics).
    pub fn subscribers(&self) -> usize {
        let map = self.channels.lock().expect("event bus lock poisoned");
        map.values().map(|ch| ch.tx.receiver_count()).sum()
    }
}
