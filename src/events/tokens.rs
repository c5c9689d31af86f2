//! Token deltas: the text of model replies as it streams, fanned out to the SSE clients of the
//! same thread on this process that asked for them (`?tokens=true`). Ephemeral by design: never
//! stored, never replayed, never a reason to wait.
//!
//! One broadcast channel per watched thread. A run being driven holds a [`RunTokens`] (the
//! sending side), a stream holds a [`TokenSubscription`]; the registry keeps only weak
//! references, so a channel lives exactly as long as one of them and nobody cleans up. A run
//! checks [`RunTokens::listening`] (one atomic read and a lock of its channel) before it builds a
//! delta, so a thread nobody watches costs no allocation per token. A subscriber that falls
//! behind by more than the channel holds loses the oldest deltas: the run never waits for it.
//!
//! Order: each delta carries the highest `seq` its run had committed when it was written
//! (`after_seq`), so a stream sends it only after the observations up to there, and before the
//! observations committed after it: the stream shows what happened in the order it happened.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde::Serialize;
use tokio::sync::broadcast;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::llm::Phase;
use crate::model::ThreadId;

/// Deltas a subscriber may fall behind by before it loses the oldest.
const CHANNEL_CAPACITY: usize = 1024;
/// Registries smaller than this are never pruned.
const PRUNE_FLOOR: usize = 64;

/// One `event: token` frame: a piece of a model reply as it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenDelta {
    /// The run whose model is writing.
    pub run_id: Uuid,
    /// The todo item the reply is for; null for the run's plan and synthesis.
    pub item_id: Option<String>,
    /// `plan`, `execute`, `synthesize`, `compact` or `flowchart`. In structured phases (plan,
    /// synthesis, compaction, a flowchart stage with a schema) the text is the JSON being
    /// written.
    #[schema(value_type = String)]
    pub phase: Phase,
    /// The next piece of text.
    pub delta: String,
    /// The thread's last `seq` committed by the run (or known to it) when this was written: a
    /// stream sends the delta after the observations up to it.
    #[serde(skip)]
    pub after_seq: i64,
}

type Sender = broadcast::Sender<Arc<TokenDelta>>;
type Key = (String, ThreadId);

#[derive(Default)]
struct Registry {
    channels: HashMap<Key, Weak<Sender>>,
    /// Prune dead entries once the map grows past this.
    prune_at: usize,
}

/// The per-thread token channels of this process, keyed by (tenant, thread).
#[derive(Clone, Default)]
pub struct TokenChannels {
    registry: Arc<Mutex<Registry>>,
}

impl TokenChannels {
    /// The thread's channel, made when nobody holds it.
    fn channel(&self, tenant: &str, thread_id: &ThreadId) -> Arc<Sender> {
        let mut reg = self.registry.lock().expect("token registry lock poisoned");
        let key = (tenant.to_owned(), thread_id.clone());
        if let Some(live) = reg.channels.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let sender = Arc::new(broadcast::channel(CHANNEL_CAPACITY).0);
        reg.channels.insert(key, Arc::downgrade(&sender));
        if reg.channels.len() > reg.prune_at.max(PRUNE_FLOOR) {
            reg.channels.retain(|_, w| w.strong_count() > 0);
            reg.prune_at = reg.channels.len() * 2;
        }
        sender
    }

    /// Listen to the deltas of the thread's runs driven here from now on.
    pub fn subscribe(&self, tenant: &str, thread_id: &ThreadId) -> TokenSubscription {
        let sender = self.channel(tenant, thread_id);
        TokenSubscription {
            rx: sender.subscribe(),
            _sender: sender,
        }
    }

    /// The sending side for one run of the thread, whose log is known up to `seq`.
    pub fn publisher(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
        seq: i64,
    ) -> RunTokens {
        RunTokens {
            sender: self.channel(tenant, thread_id),
            run_id,
            committed: Arc::new(AtomicI64::new(seq)),
        }
    }

    /// Threads with a live channel (for tests of the clean-up).
    pub fn live_channels(&self) -> usize {
        let reg = self.registry.lock().expect("token registry lock poisoned");
        reg.channels
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

/// A stream's side of a thread's token channel.
pub struct TokenSubscription {
    rx: broadcast::Receiver<Arc<TokenDelta>>,
    /// Keeps the channel alive while the stream is.
    _sender: Arc<Sender>,
}

impl TokenSubscription {
    /// The next delta; deltas lost to lag are skipped.
    pub async fn recv(&mut self) -> Arc<TokenDelta> {
        loop {
            match self.rx.recv().await {
                Ok(d) => return d,
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                // Never: this subscription holds a sender.
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

/// A run's side of its thread's token channel.
#[derive(Clone)]
pub struct RunTokens {
    sender: Arc<Sender>,
    run_id: Uuid,
    /// The highest `seq` the run has committed (or knew of when it started).
    committed: Arc<AtomicI64>,
}

impl RunTokens {
    /// The run committed observations up to `seq` (called before they are published, so no
    /// delta written after them can be sent before them).
    pub fn committed(&self, seq: i64) {
        self.committed.fetch_max(seq, Ordering::AcqRel);
    }
}

impl crate::agent::TokenOut for RunTokens {
    fn listening(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    fn publish(&self, item_id: Option<&str>, phase: Phase, delta: &str) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        // No receiver left in between: the delta is dropped, as it should be.
        let _ = self.sender.send(Arc::new(TokenDelta {
            run_id: self.run_id,
            item_id: item_id.map(str::to_owned),
            phase,
            delta: delta.to_owned(),
            after_seq: self.committed.load(Ordering::Acquire),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::TokenOut;

    #[tokio::test]
    async fn deltas_reach_subscribers_of_the_thread_only_and_channels_die_with_their_holders() {
        let channels = TokenChannels::default();
        let t1 = ThreadId::parse("t1").unwrap();
        let t2 = ThreadId::parse("t2").unwrap();
        let run = Uuid::nil();
        let publisher = channels.publisher("default", &t1, run, 4);
        assert!(!publisher.listening());
        // Nobody listens: nothing is sent (and nothing waits).
        publisher.publish(None, Phase::Plan, "lost");
        let mut sub = channels.subscribe("default", &t1);
        let other_tenant = channels.subscribe("acme", &t1);
        let other_thread = channels.subscribe("default", &t2);
        assert!(publisher.listening());
        publisher.committed(6);
        publisher.committed(5);
        publisher.publish(Some("s1"), Phase::Execute, "hel");
        let d = sub.recv().await;
        assert_eq!(
            *d,
            TokenDelta {
                run_id: run,
                item_id: Some("s1".into()),
                phase: Phase::Execute,
                delta: "hel".into(),
                after_seq: 6,
            }
        );
        assert_eq!(other_tenant.rx.len(), 0);
        assert_eq!(other_thread.rx.len(), 0);
        drop((sub, other_tenant, other_thread, publisher));
        assert_eq!(channels.live_channels(), 0);
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_loses_the_oldest_deltas_and_never_blocks_the_run() {
        let channels = TokenChannels::default();
        let t = ThreadId::parse("t").unwrap();
        let publisher = channels.publisher("default", &t, Uuid::nil(), 0);
        let mut sub = channels.subscribe("default", &t);
        for i in 0..CHANNEL_CAPACITY + 10 {
            publisher.publish(None, Phase::Synthesize, &i.to_string());
        }
        assert_eq!(sub.recv().await.delta, "10");
    }
}
