//! The observation log over HTTP: as JSON pages, and as a Server-Sent Events stream that replays
//! from the store everything after `Last-Event-ID` (or `?after=`) and then continues live with no
//! gap and no duplicate, however long the client was away.
//!
//! How the stream stays exact: it subscribes to the in-process bus *before* it reads the table, and
//! tracks the last `seq` it has accounted for. A bus message with the next `seq` is delivered
//! directly; anything else (a gap, a lag, an observation committed by another replica) makes it
//! re-read the table after its last `seq`. The table is the truth; the bus is only a fast path.
//!
//! A stream that asked for tokens (`?tokens=true`) also sends the token deltas of its thread's
//! runs (driven by this process, or relayed from the replica that drives them), as `event: token`
//! frames without `id:`, while it waits for the next observation: they are not in the table, so a
//! replay never has them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::broadcast;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::quota::StreamSlot;
use super::threads::Page;
use super::{ApiError, AppJson, AppPath, AppQuery, AppState, Problem, Tenant, parse_thread_id};
use crate::events::{BusMsg, TokenDelta, TokenSubscription};
use crate::model::{Observation, ObservationType, ThreadId};
use crate::store::ObservationQuery;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_observations))
        .routes(routes!(events))
}

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

fn to_event(o: &Observation) -> Event {
    Event::default()
        .id(o.seq.to_string())
        .event(o.kind.as_str())
        .data(serde_json::to_string(o).unwrap_or_else(|_| "{}".into()))
}

/// An `event: token` frame: no `id:` (it is not in the log and is never replayed).
fn token_event(d: &TokenDelta) -> Event {
    Event::default()
        .event("token")
        .data(serde_json::to_string(d).unwrap_or_else(|_| "{}".into()))
}

/// One subscriber's stream, pulled by the response body: no task and no channel of its own, so an
/// idle subscriber costs its bus receiver and this struct. Observations to send wait in `pending`
/// (at most one table page); the bus is read only when `pending` is empty, so a slow client makes
/// the bus lag, which falls back to the table like any gap.
struct Producer {
    state: AppState,
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

/// The last frame of a stream whose thread was deleted: no `id:` (it is not an observation and
/// is never replayed), `event: THREAD_DELETED`.
fn thread_deleted_event(thread_id: &ThreadId) -> Event {
    Event::default()
        .event("THREAD_DELETED")
        .data(serde_json::json!({"type": "THREAD_DELETED", "threadId": thread_id}).to_string())
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
                .state
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
            .state
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

/// The observations `spec` selects, replayed from the table and then live, with no gap and no
/// duplicate. It subscribes to the bus before its first table read, so nothing committed in
/// between is missed; it ends after the run's end when `spec.until_run_end`, when the thread is
/// deleted (after [`StreamItem::ThreadDeleted`]), or with the service's shutdown token. Pulled by
/// its reader: no task of its own. With `tokens` (a subscription to the thread's token channel,
/// taken as early as the caller could), the deltas `spec` shows come between observations.
pub fn observation_stream(
    state: &AppState,
    spec: StreamSpec,
    tokens: Option<TokenSubscription>,
) -> impl Stream<Item = StreamItem> + Send + use<> {
    let producer = Producer {
        state: state.clone(),
        rx: state.bus.subscribe(&spec.tenant, &spec.thread_id),
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
    .take_until(state.shutdown.clone().cancelled_owned())
}

/// An SSE response streaming the observations `spec` selects ([`observation_stream`] as
/// frames: `id: <seq>`, `event: <type>`, `data: <observation>`), with keep-alive comments; with
/// `tokens`, `event: token` frames `{runId, itemId, phase, delta}` without `id:` too.
pub fn observation_sse(
    state: &AppState,
    spec: StreamSpec,
    tokens: Option<TokenSubscription>,
    slot: StreamSlot,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let thread_id = spec.thread_id.clone();
    let events = observation_stream(state, spec, tokens).map(move |item| {
        // The tenant's stream slot lives as long as the stream.
        let _slot = &slot;
        Ok(match item {
            StreamItem::Obs(o) => to_event(&o),
            StreamItem::ThreadDeleted => thread_deleted_event(&thread_id),
            StreamItem::Token(d) => token_event(&d),
        })
    });
    let keepalive = Duration::from_secs(state.config.sse_keepalive_seconds.max(1));
    Sse::new(events).keep_alive(KeepAlive::new().interval(keepalive).text("keep-alive"))
}

fn parse_types(raw: Option<&str>) -> Result<Option<Vec<ObservationType>>, ApiError> {
    let Some(raw) = raw.filter(|s| !s.trim().is_empty()) else {
        return Ok(None);
    };
    raw.split(',')
        .map(|t| {
            t.trim()
                .parse::<ObservationType>()
                .map_err(ApiError::Validation)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Filters of `GET /v1/threads/{threadId}/observations` (query string). Unknown parameters are
/// refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ObservationParams {
    /// Only observations with a larger `seq` (default 0).
    #[param(minimum = 0, nullable = false)]
    pub after: Option<i64>,
    /// Observations per page: 1–1000, default 100.
    #[param(minimum = 1, maximum = 1000, nullable = false)]
    pub limit: Option<u32>,
    /// Only these observation types, comma-separated (`type=PLAN,FINAL_RESPONSE`); an unknown
    /// type is refused (422).
    #[serde(rename = "type")]
    #[param(rename = "type", value_type = Option<Vec<ObservationType>>, style = Form, explode = false, nullable = false)]
    pub kind: Option<String>,
    /// Only observations with this `parentId` (an item id, or another observation's id).
    #[param(nullable = false)]
    pub parent_id: Option<String>,
    /// Only observations of this run.
    #[param(nullable = false)]
    pub run_id: Option<Uuid>,
}

/// The observation log as JSON, in `seq` order; `nextCursor` is the `seq` to pass as `after`.
#[utoipa::path(get, path = "/v1/threads/{threadId}/observations", tag = "observations",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), ObservationParams),
    responses(
        (status = 200, description = "A page of observations", body = Page<Observation>),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_observations(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<ObservationParams>,
) -> Result<AppJson<Page<Observation>>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let limit = match params.limit {
        None => 100,
        Some(n) if (1..=1000).contains(&n) => n,
        Some(_) => {
            return Err(ApiError::Validation(
                "limit must be between 1 and 1000".into(),
            ));
        }
    };
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::Validation("after must not be negative".into()));
    }
    let query = ObservationQuery {
        after,
        limit: limit + 1,
        types: parse_types(params.kind.as_deref())?,
        parent_id: params.parent_id,
        run_id: params.run_id,
    };
    let items = state
        .store
        .list_observations(&tenant, &id, &query)
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(Page::from_overfetch(items, limit, |o| {
        o.seq.to_string()
    })))
}

/// Parameters of the SSE stream (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Replay after this `seq` (the `Last-Event-ID` header wins when both are given).
    #[param(minimum = 0, nullable = false)]
    pub after: Option<i64>,
    /// Only these observation types, comma-separated (`types=PLAN,FINAL_RESPONSE`); an unknown
    /// type is refused (422).
    #[param(value_type = Option<Vec<ObservationType>>, style = Form, explode = false, nullable = false)]
    pub types: Option<String>,
    /// Only observations with this `parentId` (an item id, or another observation's id).
    #[param(nullable = false)]
    pub parent_id: Option<String>,
    /// Only observations of this run (a client following one run it posted, such as
    /// `pes-server ask`, replays just that run, however long the thread).
    #[param(nullable = false)]
    pub run_id: Option<Uuid>,
    /// Also send the model's text as it is written: `event: token` frames `{runId, itemId,
    /// phase, delta}` without `id:`, never stored and never replayed (on Postgres, from whichever
    /// replica drives the run).
    #[param(nullable = false)]
    pub tokens: Option<bool>,
}

/// The query of a route that may answer with a run's stream (`POST …/runs`, `POST …/resume`).
/// Other parameters are ignored, as they always were on these routes.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct RunStreamParams {
    /// With `Accept: text/event-stream`: also send the run's model text as it is written
    /// (`event: token` frames without `id:`, as on `/events?tokens=true`).
    #[param(nullable = false)]
    pub tokens: Option<bool>,
}

/// The thread's observations as Server-Sent Events: `id: <seq>`, `event: <type>`,
/// `data: <observation JSON>`; a `: keep-alive` comment every 15 s. The stream replays the log
/// after `Last-Event-ID` (or `after`) and then goes on live until the client leaves. With
/// `tokens=true`, live `event: token` frames carry the model's text as it is written.
#[utoipa::path(get, path = "/v1/threads/{threadId}/events", tag = "observations",
    params(
        ("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"),
        ("Last-Event-ID" = Option<i64>, Header, minimum = 0, nullable = false,
            description = "Replay after this `seq` (the `id:` of the last event the client saw); wins over `after`. Anything but an integer from 0 to 2^63−1 is answered 400."),
        EventParams
    ),
    responses(
        (status = 200, description = "The event stream", content_type = "text/event-stream", body = String),
        (status = 400, description = "A `Last-Event-ID` that is not an integer from 0 to 2^63−1", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn events(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    headers: HeaderMap,
    AppQuery(params): AppQuery<EventParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let header_after = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    ApiError::BadHeader("Last-Event-ID must be a seq (an integer ≥ 0)".into())
                })?,
        ),
        None => None,
    };
    if params.after.is_some_and(|a| a < 0) {
        return Err(ApiError::Validation("after must not be negative".into()));
    }
    let types = parse_types(params.types.as_deref())?;
    state
        .store
        .get_thread(&tenant, &id)
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    let slot = state.streams.take(&tenant)?;
    let tokens = (params.tokens == Some(true)).then(|| state.bus.tokens().subscribe(&tenant, &id));
    let spec = StreamSpec {
        tenant,
        thread_id: id,
        after: header_after.or(params.after).unwrap_or(0),
        types,
        parent_id: params.parent_id,
        run_id: params.run_id,
        until_run_end: false,
    };
    Ok(observation_sse(&state, spec, tokens, slot))
}
