//! Token deltas between replicas sharing a Postgres store, sent only while another replica
//! streams the thread.
//!
//! - **Interest.** A replica with a `?tokens=true` stream of a thread says so with
//!   [`Signal::TokensWanted`]: at once when the thread's first stream here starts, then every
//!   [`ANNOUNCE_EVERY`] (all its streamed threads, in as few payloads as fit) while one lives. The
//!   other replicas remember it for [`INTEREST_TTL`] (three announces: one lost NOTIFY changes
//!   nothing), so interest ends by itself when the streams do, or when the replica dies.
//! - **Deltas.** A run driven here whose thread is wanted elsewhere pushes its deltas into a
//!   bounded outbox (the oldest are dropped when it is full: the run never waits). A background
//!   task sends what gathered [`FLUSH_AFTER`] after the first delta, in one round trip: per
//!   thread, consecutive deltas of one model call merged, packed into [`Signal::Tokens`] payloads
//!   under Postgres's 8,000-byte NOTIFY limit (a larger delta is cut on char boundaries).
//!   Before the run commits, what its thread has waiting is sent (one round trip, bounded by
//!   [`BEFORE_COMMIT_WAIT`], and only while the thread is wanted elsewhere): NOTIFYs arrive in
//!   commit order, so the deltas of a reply reach the other replica before the observation its
//!   commit writes, as they do here.
//! - **Arrival.** The receiving replica (a process skips its own NOTIFYs) sends the deltas on its
//!   local channel of the thread, where its streams order them by `after_seq` exactly like local
//!   ones; a replica with no stream of the thread drops them.
//!
//! With SQLite (one process) nothing here is spawned, nobody announces, and nothing is ever
//! pushed: no thread is wanted elsewhere.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::delta::{Key, TokenDelta};
use crate::store::{Signal, SqlStore, TokenPiece};
use crate::telemetry::metrics::Metrics;

/// How often a replica repeats which threads it streams.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(2);
/// How long a replica sends a thread's deltas after it was last told someone elsewhere wants them.
pub const INTEREST_TTL: Duration = Duration::from_secs(6);
/// How long deltas gather before they are sent (one NOTIFY round trip per flush).
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);
/// The longest a run's commit waits for its deltas to be sent first.
pub const BEFORE_COMMIT_WAIT: Duration = Duration::from_millis(250);
/// Deltas waiting to be sent, at most; the oldest are dropped beyond.
const OUTBOX_CAPACITY: usize = 4096;
/// The largest signal JSON sent: under Postgres's 8,000 bytes with the `from` the store adds
/// (46 bytes) and a margin.
const MAX_SIGNAL: usize = 7_900;

/// The relay's shared state: what waits to be sent, and which threads to announce now.
pub struct Relay {
    /// The clock of interest expiries (milliseconds since this, plus one: 0 means never).
    epoch: Instant,
    /// Whether the tasks run (the store is shared).
    enabled: AtomicBool,
    outbox: Mutex<Outbox>,
    /// Woken when the outbox gets its first delta.
    flush: Notify,
    /// Threads whose first stream here just started.
    fresh: Mutex<HashSet<Key>>,
    announce: Notify,
    /// Where deltas go (set when the tasks start).
    sink: OnceLock<Sink>,
    /// Held across a take and its send, so payloads leave in the order deltas were written.
    sending: tokio::sync::Mutex<Sending>,
}

struct Sink {
    store: Arc<SqlStore>,
    metrics: Metrics,
}

#[derive(Default)]
struct Sending {
    /// The last payload number.
    n: u64,
    quiet: Quiet,
}

#[derive(Default)]
struct Outbox {
    deltas: VecDeque<(Key, Arc<TokenDelta>)>,
    /// Dropped because the outbox was full, not yet counted in the metrics.
    dropped: u64,
}

impl Default for Relay {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            enabled: AtomicBool::new(false),
            outbox: Mutex::default(),
            flush: Notify::new(),
            fresh: Mutex::default(),
            announce: Notify::new(),
            sink: OnceLock::new(),
            sending: tokio::sync::Mutex::default(),
        }
    }
}

impl Relay {
    /// Now on the relay's clock, in milliseconds (never 0).
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX / 4) + 1
    }

    /// A thread's first stream here started: announce it at once (when the tasks run).
    pub(crate) fn announce_soon(&self, key: &Key) {
        if !self.enabled.load(Ordering::Acquire) {
            return;
        }
        self.fresh
            .lock()
            .expect("relay lock poisoned")
            .insert(key.clone());
        self.announce.notify_one();
    }

    /// Queue a delta for the other replicas; never waits.
    pub(crate) fn push(&self, key: &Key, d: Arc<TokenDelta>) {
        let mut out = self.outbox.lock().expect("relay lock poisoned");
        if out.deltas.len() >= OUTBOX_CAPACITY {
            out.deltas.pop_front();
            out.dropped += 1;
        }
        out.deltas.push_back((key.clone(), d));
        if out.deltas.len() == 1 {
            self.flush.notify_one();
        }
    }

    /// Whether deltas wait to be sent.
    pub(crate) fn pending(&self) -> bool {
        !self
            .outbox
            .lock()
            .expect("relay lock poisoned")
            .deltas
            .is_empty()
    }

    /// Send what waits now, after any send under way (nothing before the tasks start).
    pub(crate) async fn send_pending(&self) {
        let Some(sink) = self.sink.get() else {
            return;
        };
        let mut sending = self.sending.lock().await;
        let (deltas, dropped) = self.take();
        sink.metrics.token_deltas_dropped(dropped);
        if deltas.is_empty() {
            return;
        }
        let count = deltas.len() as u64;
        let signals = token_signals(deltas, &mut sending.n);
        match sink.store.send_signals(&signals).await {
            Ok(()) => {
                sending.quiet.failing = false;
                sink.metrics.token_payloads_sent(signals.len() as u64);
            }
            Err(e) => {
                sink.metrics.token_deltas_dropped(count);
                sending
                    .quiet
                    .failed("sending token deltas to other replicas", &e);
            }
        }
    }

    fn take(&self) -> (Vec<(Key, Arc<TokenDelta>)>, u64) {
        let mut out = self.outbox.lock().expect("relay lock poisoned");
        let dropped = std::mem::take(&mut out.dropped);
        (out.deltas.drain(..).collect(), dropped)
    }

    #[cfg(test)]
    pub(crate) fn take_for_tests(&self) -> (Vec<(Key, Arc<TokenDelta>)>, u64) {
        self.take()
    }

    fn take_fresh(&self) -> Vec<Key> {
        self.fresh
            .lock()
            .expect("relay lock poisoned")
            .drain()
            .collect()
    }
}

/// Start the announcer and the sender on `tracker`, both ending when `stop` fires (call only
/// when the store is shared).
/// `subscribed` lists the threads streamed here now (with `?tokens=true`).
pub fn spawn(
    tracker: &TaskTracker,
    relay: &Arc<Relay>,
    subscribed: Subscribed,
    store: Arc<SqlStore>,
    metrics: Metrics,
    stop: &CancellationToken,
) {
    if relay
        .sink
        .set(Sink {
            store: store.clone(),
            metrics,
        })
        .is_err()
    {
        return;
    }
    relay.enabled.store(true, Ordering::Release);
    tracker.spawn(announce(relay.clone(), subscribed, store, stop.clone()));
    tracker.spawn(send(relay.clone(), stop.clone()));
}

/// The threads streamed here now, as the local channels know them.
pub type Subscribed = Box<dyn Fn() -> Vec<Key> + Send + Sync>;

/// Logs the first failure of a streak at `warn`, the rest at `debug`.
#[derive(Default)]
struct Quiet {
    failing: bool,
}

impl Quiet {
    fn failed(&mut self, what: &str, e: &crate::store::StoreError) {
        if std::mem::replace(&mut self.failing, true) {
            debug!(error = %e, "{what} failed again");
        } else {
            warn!(error = %e, "{what} failed (further failures are logged at debug)");
        }
    }
}

/// Announce the threads streamed here: a thread's first stream at once, all of them every
/// [`ANNOUNCE_EVERY`].
async fn announce(
    relay: Arc<Relay>,
    subscribed: Subscribed,
    store: Arc<SqlStore>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(ANNOUNCE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = Quiet::default();
    loop {
        let keys = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => subscribed(),
            _ = relay.announce.notified() => relay.take_fresh(),
        };
        if keys.is_empty() {
            continue;
        }
        match store.send_signals(&wanted_signals(keys)).await {
            Ok(()) => quiet.failing = false,
            Err(e) => quiet.failed("announcing streamed threads", &e),
        }
    }
}

/// Send the outbox [`FLUSH_AFTER`] after its first delta, until `stop` fires.
async fn send(relay: Arc<Relay>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = relay.flush.notified() => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(FLUSH_AFTER) => {}
        }
        relay.send_pending().await;
    }
}

fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_string(v).map_or(usize::MAX, |s| s.len())
}

/// The [`Signal::TokensWanted`] payloads announcing `keys`, each under the size limit.
fn wanted_signals(keys: Vec<Key>) -> Vec<Signal> {
    let empty = json_len(&Signal::TokensWanted {
        threads: Vec::new(),
    });
    let mut out = Vec::new();
    let (mut threads, mut size) = (Vec::new(), empty);
    for (tenant, thread) in keys {
        let pair = (tenant, thread.as_str().to_owned());
        let len = json_len(&pair) + 1;
        if size + len > MAX_SIGNAL && !threads.is_empty() {
            out.push(Signal::TokensWanted {
                threads: std::mem::take(&mut threads),
            });
            size = empty;
        }
        size += len;
        threads.push(pair);
    }
    if !threads.is_empty() {
        out.push(Signal::TokensWanted { threads });
    }
    out
}

/// The [`Signal::Tokens`] payloads carrying `deltas` (in the order they were written): grouped by
/// thread, consecutive deltas of one model call written after the same commit merged, packed
/// under the size limit; `n` numbers the payloads.
fn token_signals(deltas: Vec<(Key, Arc<TokenDelta>)>, n: &mut u64) -> Vec<Signal> {
    let mut groups: Vec<(Key, Vec<TokenPiece>)> = Vec::new();
    let mut index: HashMap<Key, usize> = HashMap::new();
    for (key, d) in deltas {
        let i = *index.entry(key.clone()).or_insert_with(|| {
            groups.push((key, Vec::new()));
            groups.len() - 1
        });
        let pieces = &mut groups[i].1;
        match pieces.last_mut() {
            Some(p)
                if p.run_id == d.run_id
                    && p.item_id == d.item_id
                    && p.phase == d.phase
                    && p.after_seq == d.after_seq =>
            {
                p.text.push_str(&d.delta);
            }
            _ => pieces.push(TokenPiece {
                run_id: d.run_id,
                item_id: d.item_id.clone(),
                phase: d.phase,
                text: d.delta.clone(),
                after_seq: d.after_seq,
            }),
        }
    }
    let mut out = Vec::new();
    for ((tenant, thread), pieces) in groups {
        let thread = thread.as_str().to_owned();
        let signal = |n: &mut u64, deltas: Vec<TokenPiece>| {
            *n += 1;
            Signal::Tokens {
                tenant: tenant.clone(),
                thread: thread.clone(),
                n: *n,
                deltas,
            }
        };
        let envelope = json_len(&Signal::Tokens {
            tenant: tenant.clone(),
            thread: thread.clone(),
            n: u64::MAX,
            deltas: Vec::new(),
        });
        // Room for one piece with some text (never short of it with ids of at most 128 chars).
        let Some(room) = MAX_SIGNAL.checked_sub(envelope + 1).filter(|r| *r > 256) else {
            debug!(tenant, thread, "ids too long to relay token deltas");
            continue;
        };
        let (mut batch, mut size) = (Vec::new(), envelope);
        for part in pieces.into_iter().flat_map(|p| fit(p, room)) {
            let len = json_len(&part) + 1;
            if size + len > MAX_SIGNAL && !batch.is_empty() {
                out.push(signal(n, std::mem::take(&mut batch)));
                size = envelope;
            }
            size += len;
            batch.push(part);
        }
        if !batch.is_empty() {
            out.push(signal(n, batch));
        }
    }
    out
}

/// The bytes `c` takes inside a JSON string.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{08}' | '\u{0C}' | '\n' | '\r' | '\t' => 2,
        c if u32::from(c) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `piece` as pieces whose JSON takes at most `room` bytes each, its text cut on char boundaries.
fn fit(piece: TokenPiece, room: usize) -> Vec<TokenPiece> {
    if json_len(&piece) <= room {
        return vec![piece];
    }
    let overhead = json_len(&TokenPiece {
        text: String::new(),
        ..piece.clone()
    });
    let text_room = room.saturating_sub(overhead).max(6);
    let mut parts = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, c) in piece.text.char_indices() {
        let len = escaped_len(c);
        if used + len > text_room {
            parts.push(piece.text[start..i].to_owned());
            (start, used) = (i, 0);
        }
        used += len;
    }
    parts.push(piece.text[start..].to_owned());
    parts
        .into_iter()
        .map(|text| TokenPiece {
            text,
            ..piece.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Phase;
    use crate::model::ThreadId;
    use uuid::Uuid;

    fn key(thread: &str) -> Key {
        ("default".into(), ThreadId::parse(thread).unwrap())
    }

    fn delta(text: &str, item: Option<&str>, after_seq: i64) -> Arc<TokenDelta> {
        Arc::new(TokenDelta {
            run_id: Uuid::nil(),
            item_id: item.map(str::to_owned),
            phase: Phase::Execute,
            delta: text.into(),
            after_seq,
        })
    }

    /// The NOTIFY payload's size: the signal and the `from` the store adds.
    fn payload_len(s: &Signal) -> usize {
        serde_json::to_string(s).unwrap().len() + r#","from":""#.len() + 36
    }

    #[test]
    fn deltas_of_one_call_merge_and_every_payload_fits_a_notify() {
        let nasty: String = "\"\\\n\u{1}é😀a".repeat(3000);
        let deltas = vec![
            (key("a"), delta("hel", Some("s1"), 3)),
            (key("b"), delta("other", None, 1)),
            (key("a"), delta("lo", Some("s1"), 3)),
            (key("a"), delta(" world", Some("s1"), 4)),
            (key("a"), delta(&nasty, Some("s2"), 5)),
        ];
        let mut n = 0;
        let signals = token_signals(deltas, &mut n);
        assert!(
            signals.len() > 3,
            "the big delta was cut: {}",
            signals.len()
        );
        assert_eq!(n, signals.len() as u64);
        let mut of_a = Vec::new();
        for s in &signals {
            assert!(payload_len(s) < 8000, "{}", payload_len(s));
            let back: Signal = serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap();
            assert_eq!(&back, s);
            if let Signal::Tokens { thread, deltas, .. } = back
                && thread == "a"
            {
                of_a.extend(deltas);
            }
        }
        assert_eq!(of_a[0].text, "hello");
        assert_eq!(of_a[0].after_seq, 3);
        assert_eq!(of_a[1].text, " world");
        let big: String = of_a[2..].iter().map(|p| p.text.as_str()).collect();
        assert_eq!(big, nasty);
        assert!(of_a[2..].iter().all(|p| p.after_seq == 5));
    }

    #[test]
    fn many_streamed_threads_are_announced_in_payloads_that_fit() {
        let keys: Vec<Key> = (0..500).map(|i| key(&format!("{i:0>100}"))).collect();
        let signals = wanted_signals(keys);
        assert!(signals.len() > 1);
        let mut all = 0;
        for s in &signals {
            assert!(payload_len(s) < 8000);
            let Signal::TokensWanted { threads } = s else {
                panic!()
            };
            all += threads.len();
        }
        assert_eq!(all, 500);
    }

    #[test]
    fn a_full_outbox_drops_its_oldest_deltas() {
        let relay = Relay::default();
        for i in 0..OUTBOX_CAPACITY + 3 {
            relay.push(&key("a"), delta(&i.to_string(), None, 0));
        }
        let (deltas, dropped) = relay.take();
        assert_eq!(dropped, 3);
        assert_eq!(deltas.len(), OUTBOX_CAPACITY);
        assert_eq!(deltas[0].1.delta, "3");
    }

    #[test]
    fn malformed_or_unknown_payloads_parse_as_no_signal() {
        for p in [
            r#"{"k":"t","tenant":"x"}"#,
            r#"{"k":"zz","from":"x"}"#,
            r#"{"k":"t","tenant":"x","thread":"y","n":1,"deltas":[{"r":"nope"}]}"#,
            "not json",
        ] {
            assert!(serde_json::from_str::<Signal>(p).is_err(), "{p}");
        }
    }
}
