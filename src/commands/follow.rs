//! Following a thread's observations: replayed from the store after a `seq`, then live, with no
//! gap and no duplicate, however long the follower was away. Every door that streams a thread
//! (the SSE stream, AG-UI, A2A, the MCP server's wait for a run) follows it here and only words
//! what it gets.
//!
//! How the stream stays exact: it subscribes to the in-process bus *before* it reads the table, and
//! tracks the last `seq` it has accounted for. A bus message with the next `seq` is delivered
//! directly; anything else (a gap, a lag, an observation committed by another replica) makes it
//! re-read the table after its last `seq`. The table is the truth; the bus is only a fast path.
//!
//! A follower that asked for tokens also gets the token deltas of its thread's runs (driven by
//! this process, or relayed from the replica that drives them) while it waits for the next
//! observation: they are not in the table, so a replay never has them.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::broadcast;
use uuid::Uuid;

use super::UseCases;
use crate::events::{BusMsg, TokenDelta, TokenSubscription};
use crate::model::{Observation, ObservationType, ThreadId};
use crate::store::{ObservationQuery, SqlStore};

/// Rows read from the table per query while replaying.
const REPLAY_PAGE: u32 = 500;

/// What a stream shows.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub tenant: String,
    pub thread_id: ThreadId,
    /// Only observations with `seq > after`.
    pub after: i64,
    pub types: Option<Vec<ObservationType>>,
    pub parent_id: Option<String>,
    pub run_id: Option<Uuid>,
    /// End the stream after the run's completion, failure, cancellation or suspension.
    pub until_run_end: bool,
}

impl StreamSpec {
    fn matches(&self, o: &Observation) -> bool {
        self.types.as_ref().is_none_or(|t| t.contains(&o.kind))
            && self
                .parent_id
                .as_ref()
                .is_none_or(|p| o.parent_id.as_ref() == Some(p))
            && self.run_id.is_none_or(|r| o.run_id == Some(r))
    }

    fn ends_with(&self, o: &Observation) -> bool {
        self.until_run_end && self.run_id == o.run_id && o.kind.ends_run_stream()
    }

    /// Whether the stream shows a token delta: of its run, under its `parentId` (an item id),
    /// whatever its `types`.
    fn shows_token(&self, d: &TokenDelta) -> bool {
        self.run_id.is_none_or(|r| d.run_id == r)
            && self
                .parent_id
                .as_ref()
                .is_none_or(|p| d.item_id.as_ref() == Some(p))
    }
}

/// What a stream of observations yields.
#[derive(Debug, Clone)]
pub enum StreamItem {
    /// The next observation the stream shows.
    Obs(Box<Observation>),
    /// The thread was deleted: the stream ends after this.
    ThreadDeleted,
    /// A token delta (streams that asked for them only).
    Token(Arc<TokenDelta>),
}

/// One subscriber's stream, pulled by the response body: no task and no channel of its own, so an
/// idle subscriber costs its bus receiver and this struct. Observations to send wait in `pending`
/// (at most one table page); the bus is read only when `pending` is empty, so a slow client makes
/// the bus lag, which falls back to the table like any gap.
struct Producer {
    store: Arc<SqlStore>,
    spec: StreamSpec,
    rx: broadcast::Receiver<BusMsg>,
    /// The thread's token deltas, when the client asked for them.
    tokens: Option<TokenSubscription>,
    /// A delta written after observations this stream has not sent yet: it waits for them.
    held: Option<Arc<TokenDelta>>,
    /// The last `seq` accounted for (sent, or filtered out).
    last: i64,
    /// When the streamed thread was created: a thread deleted and created again under the same
    /// id is another thread, whose log this stream must never show.
    thread_created_at: Option<chrono::DateTime<chrono::Utc>>,
    pending: VecDeque<StreamItem>,
    /// A table read under way: `Some(seen)` until a short page ends it, where `seen` is a `seq`
    /// known committed (a bus message that revealed a gap).
    catching_up: Option<Option<i64>>,
    /// Whether the first page of this catch-up has been read (the thread is checked before it).
    checked: bool,
    /// Send what is pending, then end.
    ended: bool,
}

impl Producer {
    /// Queue `o` if the stream shows it; end after the run's end when asked to.
    fn push(&mut self, o: &Observation) {
        if self.spec.matches(o) {
            self.pending.push_back(StreamItem::Obs(Box::new(o.clone())));
        }
        if self.spec.ends_with(o) {
            self.ended = true;
        }
    }

    /// Tell the client the thread is gone, then end.
    fn deleted(&mut self) {
        self.pending.push_back(StreamItem::ThreadDeleted);
        self.ended = true;
    }

    /// Read the next page of the table after `last` (checking first, once per catch-up, that
    /// the thread is still this stream's thread).
    async fn catch_up_page(&mut self, seen: Option<i64>) {
        if !self.checked {
            self.checked = true;
            match self
                .store
                .get_thread(&self.spec.tenant, &self.spec.thread_id)
                .await
            {
                Ok(Some(t)) if self.thread_created_at.is_none_or(|c| c == t.created_at) => {
                    self.thread_created_at = Some(t.created_at);
                }
                Ok(_) => return self.deleted(),
                Err(e) => {
                    tracing::warn!(error = %e, "reading a streamed thread failed; ending the stream");
                    self.ended = true;
                    return;
                }
            }
        }
        let query = ObservationQuery {
            after: self.last,
            limit: REPLAY_PAGE,
            types: self.spec.types.clone(),
            parent_id: self.spec.parent_id.clone(),
            run_id: self.spec.run_id,
        };
        let page = match self
            .store
            .list_observations(&self.spec.tenant, &self.spec.thread_id, &query)
            .await
        {
            Ok(Some(p)) => p,
            Ok(None) => return self.deleted(),
            Err(e) => {
                tracing::warn!(error = %e, "reading observations for a stream failed; ending it");
                self.ended = true;
                return;
            }
        };
        let full = page.len() as u32 == REPLAY_PAGE;
        for o in &page {
            self.last = o.seq;
            self.push(o);
            if self.ended {
                return;
            }
        }
        if !full {
            if let Some(s) = seen {
                self.last = self.last.max(s);
            }
            self.catching_up = None;
        }
    }

    fn start_catch_up(&mut self, seen: Option<i64>) {
        self.catching_up = Some(seen);
        self.checked = false;
    }

    /// The held delta, when every observation committed before it was written has been sent
    /// (or filtered out) and none committed after it is waiting ahead of it.
    fn release_held(&mut self) -> Option<StreamItem> {
        let d = self.held.as_ref()?;
        let next_is_later = match self.pending.front() {
            Some(StreamItem::Obs(o)) => o.seq > d.after_seq,
            Some(_) => false,
            None => true,
        };
        (d.after_seq <= self.last && next_is_later)
            .then(|| self.held.take().map(StreamItem::Token))
            .flatten()
    }

    /// The next item to send, or `None` when the stream is over.
    async fn next_item(&mut self) -> Option<StreamItem> {
        loop {
            if let Some(d) = self.release_held() {
                return Some(d);
            }
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.ended {
                return None;
            }
            if let Some(seen) = self.catching_up {
                self.catch_up_page(seen).await;
                continue;
            }
            let msg = match self.tokens.as_mut() {
                // Deltas first: a delta and the commit that follows its reply may both be
                // waiting, and the delta was written first. One written after a commit this
                // stream has not sent is held until it has (and no other is read meanwhile).
                Some(tokens) if self.held.is_none() => tokio::select! {
                    biased;
                    d = tokens.recv() => Err(d),
                    m = self.rx.recv() => Ok(m),
                },
                _ => Ok(self.rx.recv().await),
            };
            let msg = match msg {
                Ok(m) => m,
                Err(d) if !self.spec.shows_token(&d) => continue,
                Err(d) if d.after_seq <= self.last => return Some(StreamItem::Token(d)),
                Err(d) => {
                    self.held = Some(d);
                    continue;
                }
            };
            match msg {
                Ok(BusMsg::Obs(o)) if o.seq <= self.last => {}
                Ok(BusMsg::Obs(o)) if o.seq == self.last + 1 => {
                    self.last = o.seq;
                    self.push(&o);
                }
                Ok(BusMsg::Obs(o)) => self.start_catch_up(Some(o.seq)),
                Ok(BusMsg::Wake(seq)) if seq <= self.last => {}
                Ok(BusMsg::Wake(seq)) => self.start_catch_up(Some(seq)),
                Ok(BusMsg::ThreadDeleted) => self.deleted(),
                Err(broadcast::error::RecvError::Lagged(_)) => self.start_catch_up(None),
                // The channel is only dropped with its thread.
                Err(broadcast::error::RecvError::Closed) => self.deleted(),
            }
        }
    }
}

impl UseCases {
    /// The observations `spec` selects, replayed from the table and then live, with no gap and
    /// no duplicate. It subscribes to the bus before its first table read, so nothing committed
    /// in between is missed; it ends after the run's end when `spec.until_run_end`, when the
    /// thread is deleted (after [`StreamItem::ThreadDeleted`]), or with the service's shutdown.
    /// Pulled by its reader: no task of its own. With `tokens` (a subscription to the thread's
    /// token channel, taken as early as the caller could: [`UseCases::token_subscription`]), the
    /// deltas `spec` shows come between observations.
    pub fn follow(
        &self,
        spec: StreamSpec,
        tokens: Option<TokenSubscription>,
    ) -> impl Stream<Item = StreamItem> + Send + use<> {
        let producer = Producer {
            store: self.store.clone(),
            rx: self.commands.bus().subscribe(&spec.tenant, &spec.thread_id),
            tokens,
            held: None,
            last: spec.after,
            spec,
            thread_created_at: None,
            pending: VecDeque::new(),
            catching_up: Some(None),
            checked: false,
            ended: false,
        };
        futures::stream::unfold(producer, |mut p| async move {
            let item = p.next_item().await?;
            Some((item, p))
        })
        .take_until(self.shutdown.clone().cancelled_owned())
    }

    /// A subscription to the model's text of a thread's runs as it is written: take it before
    /// the run goes on (before a resume, an enqueue), so its first deltas are not missed.
    pub fn token_subscription(&self, tenant: &str, thread_id: &ThreadId) -> TokenSubscription {
        self.commands.bus().tokens().subscribe(tenant, thread_id)
    }
}
