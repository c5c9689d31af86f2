//! Token deltas: the text of model replies as it streams, fanned out to the SSE clients of the
//! same thread that asked for them (`?tokens=true`), on this process and, through
//! [`super::token_relay`], on the other replicas sharing the store. Ephemeral by design: never
//! stored, never replayed, never a reason to wait.
//!
//! One broadcast channel per watched thread. A run being driven holds a [`RunTokens`] (the
//! sending side), a stream holds a [`TokenSubscription`]; the registry keeps only weak
//! references, so a channel lives exactly as long as one of them and nobody cleans up. A run
//! checks [`RunTokens::listening`] (an atomic read, a lock of its channel and a clock read)
//! before it builds a delta, so a thread nobody watches, here or elsewhere, costs no allocation
//! per token. A subscriber that falls behind by more than the channel holds loses the oldest
//! deltas: the run never waits for it.
//!
//! Across replicas: the registry also remembers which threads another replica streams (until
//! when, see [`TokenChannels::wanted_remotely`]); a run of such a thread hands its deltas to the
//! relay's outbox as well. Deltas that arrive from another replica are sent on the thread's local
//! channel ([`TokenChannels::inject`]) and never relayed again.
//!
//! Order: each delta carries the highest `seq` its run had committed when it was written
//! (`after_seq`), so a stream sends it only after the observations up to there, and before the
//! observations committed after it: the stream shows what happened in the order it happened,
//! wherever the run is driven.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::broadcast;
use uuid::Uuid;

pub(crate) use super::delta::Key;
pub use super::delta::TokenDelta;
use super::token_relay::Relay;
use crate::llm::Phase;
use crate::model::ThreadId;
use crate::store::TokenPiece;

/// Deltas a subscriber may fall behind by before it loses the oldest.
const CHANNEL_CAPACITY: usize = 1024;
/// Registries smaller than this are never pruned.
const PRUNE_FLOOR: usize = 64;

type Sender = broadcast::Sender<Arc<TokenDelta>>;

/// One thread's channel.
struct Channel {
    sender: Sender,
    key: Key,
    /// Until when (milliseconds on the relay's clock) another replica wants the thread's deltas;
    /// 0 when none does.
    remote_until: AtomicU64,
}

#[derive(Default)]
struct Registry {
    channels: HashMap<Key, Weak<Channel>>,
    /// Prune dead entries once the map grows past this.
    prune_at: usize,
    /// Threads another replica streams, with until when (relay clock, ms); read when a channel
    /// is made, so a run started after the interest arrived knows of it.
    remote: HashMap<Key, u64>,
}

/// The per-thread token channels of this process, keyed by (tenant, thread).
#[derive(Clone, Default)]
pub struct TokenChannels {
    registry: Arc<Mutex<Registry>>,
    relay: Arc<Relay>,
}

impl TokenChannels {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().expect("token registry lock poisoned")
    }

    /// The thread's channel, made when nobody holds it.
    fn channel(&self, tenant: &str, thread_id: &ThreadId) -> Arc<Channel> {
        let mut reg = self.lock();
        let key = (tenant.to_owned(), thread_id.clone());
        if let Some(live) = reg.channels.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let channel = Arc::new(Channel {
            sender: broadcast::channel(CHANNEL_CAPACITY).0,
            remote_until: AtomicU64::new(reg.remote.get(&key).copied().unwrap_or(0)),
            key: key.clone(),
        });
        reg.channels.insert(key, Arc::downgrade(&channel));
        if reg.channels.len() > reg.prune_at.max(PRUNE_FLOOR) {
            reg.channels.retain(|_, w| w.strong_count() > 0);
            reg.prune_at = reg.channels.len() * 2;
        }
        channel
    }

    /// Listen to the deltas of the thread's runs from now on (driven here, or elsewhere when the
    /// store is shared: the first subscriber of a thread has it announced to the other replicas
    /// at once).
    pub fn subscribe(&self, tenant: &str, thread_id: &ThreadId) -> TokenSubscription {
        let channel = self.channel(tenant, thread_id);
        if channel.sender.receiver_count() == 0 {
            self.relay.announce_soon(&channel.key);
        }
        TokenSubscription {
            rx: channel.sender.subscribe(),
            _channel: channel,
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
            channel: self.channel(tenant, thread_id),
            relay: self.relay.clone(),
            run_id,
            committed: Arc::new(AtomicI64::new(seq)),
        }
    }

    /// Another replica streams these threads: their runs driven here send their deltas there
    /// for `ttl` from now (unless told again).
    pub fn wanted_remotely(&self, threads: impl IntoIterator<Item = Key>, ttl: Duration) {
        let now = self.relay.now_ms();
        let until = now + u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX / 2);
        let mut reg = self.lock();
        reg.remote.retain(|_, t| *t > now);
        for key in threads {
            if let Some(live) = reg.channels.get(&key).and_then(Weak::upgrade) {
                live.remote_until.fetch_max(until, Ordering::AcqRel);
            }
            reg.remote.insert(key, until);
        }
    }

    /// Threads another replica streams now (for metrics).
    pub fn remotely_wanted(&self) -> usize {
        let now = self.relay.now_ms();
        self.lock().remote.values().filter(|t| **t > now).count()
    }

    /// Deltas a run driven by another replica wrote: to this thread's streams here, if any
    /// (never relayed again).
    pub fn inject(&self, tenant: &str, thread_id: &ThreadId, pieces: Vec<TokenPiece>) {
        let key = (tenant.to_owned(), thread_id.clone());
        let Some(channel) = self.lock().channels.get(&key).and_then(Weak::upgrade) else {
            return;
        };
        for p in pieces {
            // No receiver left: dropped, as it should be.
            let _ = channel.sender.send(Arc::new(TokenDelta {
                run_id: p.run_id,
                item_id: p.item_id,
                phase: p.phase,
                delta: p.text,
                after_seq: p.after_seq,
            }));
        }
    }

    /// Threads with a live subscriber here (announced to the other replicas periodically).
    pub(crate) fn subscribed(&self) -> Vec<Key> {
        self.lock()
            .channels
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| c.sender.receiver_count() > 0)
            .map(|c| c.key.clone())
            .collect()
    }

    /// The relay to the other replicas (its tasks run only when the store is shared).
    pub(crate) fn relay(&self) -> &Arc<Relay> {
        &self.relay
    }

    /// Threads with a live channel (for tests of the clean-up).
    pub fn live_channels(&self) -> usize {
        self.lock()
            .channels
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

/// A stream's side of a thread's token channel.
pub struct TokenSubscription {
    rx: broadcast::Receiver<Arc<TokenDelta>>,
    /// Keeps the channel alive while the stream is.
    _channel: Arc<Channel>,
}

impl TokenSubscription {
    /// The next delta; deltas lost to lag are skipped.
    pub async fn recv(&mut self) -> Arc<TokenDelta> {
        loop {
            match self.rx.recv().await {
                Ok(d) => return d,
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                // Never: this subscription holds the channel.
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

/// A run's side of its thread's token channel.
#[derive(Clone)]
pub struct RunTokens {
    channel: Arc<Channel>,
    relay: Arc<Relay>,
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

    /// Before the run commits: while another replica wants the thread, send the deltas waiting
    /// for it first (bounded by [`super::token_relay::BEFORE_COMMIT_WAIT`]), so they arrive
    /// there before the observations this commit writes.
    pub async fn before_commit(&self) {
        if self.wanted_remotely() && self.relay.pending() {
            let _ = tokio::time::timeout(
                super::token_relay::BEFORE_COMMIT_WAIT,
                self.relay.send_pending(),
            )
            .await;
        }
    }

    fn wanted_remotely(&self) -> bool {
        let until = self.channel.remote_until.load(Ordering::Acquire);
        until != 0 && until > self.relay.now_ms()
    }
}

impl crate::agent::TokenOut for RunTokens {
    fn listening(&self) -> bool {
        self.channel.sender.receiver_count() > 0 || self.wanted_remotely()
    }

    fn publish(&self, item_id: Option<&str>, phase: Phase, delta: &str) {
        let here = self.channel.sender.receiver_count() > 0;
        let there = self.wanted_remotely();
        if !here && !there {
            return;
        }
        let d = Arc::new(TokenDelta {
            run_id: self.run_id,
            item_id: item_id.map(str::to_owned),
            phase,
            delta: delta.to_owned(),
            after_seq: self.committed.load(Ordering::Acquire),
        });
        if there {
            self.relay.push(&self.channel.key, d.clone());
        }
        if here {
            // No receiver left in between: the delta is dropped, as it should be.
            let _ = self.channel.sender.send(d);
        }
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
    async fn a_thread_wanted_elsewhere_sends_its_deltas_to_the_relay_until_the_interest_expires() {
        let channels = TokenChannels::default();
        let t = ThreadId::parse("t").unwrap();
        let key = ("default".to_owned(), t.clone());
        // Interest that arrived before the run started is known to it.
        channels.wanted_remotely([key.clone()], Duration::from_secs(60));
        let publisher = channels.publisher("default", &t, Uuid::nil(), 2);
        let other = channels.publisher("default", &ThreadId::parse("u").unwrap(), Uuid::nil(), 0);
        assert!(publisher.listening());
        assert!(!other.listening());
        assert_eq!(channels.remotely_wanted(), 1);
        publisher.publish(None, Phase::Plan, "{\"a");
        other.publish(None, Phase::Plan, "nobody");
        let (sent, dropped) = channels.relay().take_for_tests();
        assert_eq!(dropped, 0);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            (&sent[0].0, sent[0].1.delta.as_str(), sent[0].1.after_seq),
            (&key, "{\"a", 2)
        );
        // Expired interest: nothing is built any more.
        channels.wanted_remotely([], Duration::ZERO);
        let late = channels.publisher("default", &ThreadId::parse("v").unwrap(), Uuid::nil(), 0);
        channels.wanted_remotely(
            [("default".to_owned(), ThreadId::parse("v").unwrap())],
            Duration::ZERO,
        );
        assert!(!late.listening());
        assert_eq!(channels.remotely_wanted(), 1);
    }

    #[tokio::test]
    async fn deltas_from_another_replica_reach_the_streams_of_their_thread_here() {
        let channels = TokenChannels::default();
        let t = ThreadId::parse("t").unwrap();
        // Nobody streams it here: dropped, and no channel is made for them.
        channels.inject("default", &t, vec![]);
        assert_eq!(channels.live_channels(), 0);
        let mut sub = channels.subscribe("default", &t);
        let piece = TokenPiece {
            run_id: Uuid::nil(),
            item_id: Some("s1".into()),
            phase: Phase::Execute,
            text: "far".into(),
            after_seq: 7,
        };
        channels.inject("default", &t, vec![piece]);
        let d = sub.recv().await;
        assert_eq!((d.delta.as_str(), d.after_seq), ("far", 7));
        // Never relayed again, even when another replica wants the thread too.
        channels.wanted_remotely([("default".to_owned(), t.clone())], Duration::from_secs(60));
        channels.inject("default", &t, vec![]);
        assert!(channels.relay().take_for_tests().0.is_empty());
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
