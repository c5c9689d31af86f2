//! One AG-UI run as Server-Sent Events: the todo list is folded from the thread's log up to the
//! point the run starts after (so its `STATE_SNAPSHOT` is the list as it stood right there),
//! then the run's observations after that point come from the same replay-then-live stream as
//! `/v1/threads/{id}/events` ([`crate::commands::UseCases::follow`]) and go through the [`Fold`], with the
//! synthesis's token deltas between them. The log is the only source: a client that reconnects
//! (`Last-Event-ID`) gets the same events from where it was, with nothing lost.
//!
//! Frames carry only `data:` (one event each) and, on the last event an observation gave, `id:`
//! its `seq`: the point to reconnect after. Events that come from no observation (the opening
//! ones, the answer's text as it streams, an end the stream had to make up) carry no `id:`.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as Frame, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::Value;
use uuid::Uuid;

use super::events::Event;
use super::fold::{Base, Fold};
use crate::commands::ObservationQuery;
use crate::commands::{StreamItem, StreamSpec};
use crate::events::TokenSubscription;
use crate::http::quota::StreamSlot;
use crate::http::{ApiError, AppState};
use crate::model::{Observation, ObservationType, Run, RunStatus, Suspension};

/// Observations read per page while folding the log.
const FOLD_PAGE: u32 = 500;

/// Where an AG-UI run starts in the log of our run.
pub struct Start {
    /// Our run.
    pub run: Run,
    /// The AG-UI run id (the input's `runId`, or one made for it).
    pub agui_run_id: String,
    /// The events follow the observations after this `seq`.
    pub after: i64,
    /// The run goes on from where an earlier stream left it (a resume, a reconnect): its items
    /// already running or waiting open their steps at once.
    pub continuing: bool,
    /// A reconnect: the run may have ended at or before `after`, in which case its end is said
    /// again from the stored run.
    pub reconnect: bool,
}

/// The SSE response of the AG-UI run `start` describes; `slot` (the tenant's stream quota) is
/// held until the body is dropped.
///
/// # Errors
/// The thread is gone (404), or the store fails.
pub async fn agui_sse(
    state: &AppState,
    start: Start,
    tokens: Option<TokenSubscription>,
    slot: StreamSlot,
) -> Result<Response, ApiError> {
    let run = start.run;
    let tenant = run.tenant.clone();
    let base = read_base(state, &run, start.after).await?;
    let mut fold = Fold::new(
        run.thread_id.to_string(),
        start.agui_run_id,
        run.run_id,
        base,
    );
    let now = chrono::Utc::now().timestamp_millis();
    let head: Vec<Frame> = fold
        .open(start.continuing, start.after, now)
        .iter()
        .map(|e| frame(e, None))
        .collect();
    if start.reconnect
        && let Some(tail) = ended_before(state, &mut fold, &run, start.after).await?
    {
        let all = head.into_iter().chain(tail).map(Ok::<_, Infallible>);
        return Ok(sse(state, futures::stream::iter(all).boxed(), slot));
    }
    let spec = StreamSpec {
        tenant: tenant.clone(),
        thread_id: run.thread_id.clone(),
        after: start.after,
        types: None,
        parent_id: None,
        run_id: Some(run.run_id),
        until_run_end: true,
    };
    let items = state.cases.follow(spec, tokens).boxed();
    let reader = state.clone();
    let events =
        futures::stream::unfold((fold, items, false), move |(mut fold, mut items, done)| {
            let state = reader.clone();
            async move {
                if done {
                    return None;
                }
                let now = chrono::Utc::now().timestamp_millis();
                let frames = match items.next().await {
                    Some(StreamItem::Obs(o)) => {
                        let suspensions = suspensions_named(&state, &o).await;
                        let events = fold.observation(&o, &suspensions);
                        let last = events.len().saturating_sub(1);
                        events
                            .iter()
                            .enumerate()
                            .map(|(i, e)| frame(e, (i == last).then_some(o.seq)))
                            .collect()
                    }
                    Some(StreamItem::Token(d)) => {
                        fold.token(&d, now).iter().map(|e| frame(e, None)).collect()
                    }
                    Some(StreamItem::ThreadDeleted) => fold
                        .cut("the thread was deleted", "thread_deleted", now)
                        .iter()
                        .map(|e| frame(e, None))
                        .collect(),
                    None => fold
                        .cut(
                            "the stream ended before the run did (the service is shutting \
                             down): post the same input again with `Last-Event-ID` to go on",
                            "unavailable",
                            now,
                        )
                        .iter()
                        .map(|e| frame(e, None))
                        .collect::<Vec<_>>(),
                };
                let done = fold.finished();
                Some((
                    futures::stream::iter(frames.into_iter().map(Ok::<_, Infallible>)),
                    (fold, items, done),
                ))
            }
        })
        .flatten();
    let head = futures::stream::iter(head.into_iter().map(Ok::<_, Infallible>));
    Ok(sse(state, head.chain(events).boxed(), slot))
}

/// One event as a frame: its JSON, with `id:` when it is the last one of an observation.
fn frame(e: &Event, seq: Option<i64>) -> Frame {
    let data = serde_json::to_string(e).unwrap_or_else(|_| "{}".into());
    let f = Frame::default().data(data);
    match seq {
        Some(s) => f.id(s.to_string()),
        None => f,
    }
}

/// The suspensions a `RUN_SUSPENDED` waits on, as stored (decided since or not: the interrupt
/// is what the run was waiting for at that point). Empty for other observations, and when the
/// store cannot be read (the fold then ends the run without interrupts).
async fn suspensions_named(state: &AppState, o: &Observation) -> Vec<Suspension> {
    if o.kind != ObservationType::RunSuspended {
        return Vec::new();
    }
    let ids: Vec<Uuid> = o
        .content
        .get("suspensionIds")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().and_then(|s| Uuid::parse_str(s).ok()))
                .collect()
        })
        .unwrap_or_default();
    let all = match state
        .cases
        .list_suspensions(&o.tenant, &o.thread_id, true)
        .await
    {
        Ok(all) => all.unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "reading the suspensions of an AG-UI interrupt failed");
            return Vec::new();
        }
    };
    ids.iter()
        .filter_map(|id| all.iter().find(|s| s.suspension_id == *id).cloned())
        .collect()
}

/// The todo list as it stood at `after`, and of `run` the usage it had when it last suspended
/// and its model: read from the thread's log (only the observation types that matter).
async fn read_base(state: &AppState, run: &Run, after: i64) -> Result<Base, ApiError> {
    let mut base = Base::default();
    let mut point = 0;
    loop {
        let query = ObservationQuery {
            after: point,
            limit: FOLD_PAGE,
            types: Some(vec![
                ObservationType::Plan,
                ObservationType::PlanUpdate,
                ObservationType::ItemStatusChange,
                ObservationType::RunStarted,
                ObservationType::RunSuspended,
            ]),
            parent_id: None,
            run_id: None,
        };
        let page = state
            .cases
            .list_observations(&run.tenant, &run.thread_id, &query)
            .await?
            .ok_or_else(ApiError::thread_not_found)?;
        let full = page.len() == FOLD_PAGE as usize;
        for o in &page {
            if o.seq > after {
                return Ok(base);
            }
            base.apply(o, run.run_id);
            point = o.seq;
        }
        if !full {
            return Ok(base);
        }
    }
}

/// For a reconnect: when `run` has ended (or waits for people) and its log has no end after
/// `after`, the client is past that end; its end is said again from the run as stored.
async fn ended_before(
    state: &AppState,
    fold: &mut Fold,
    run: &Run,
    after: i64,
) -> Result<Option<Vec<Frame>>, ApiError> {
    let now_run = state
        .cases
        .get_run(&run.tenant, &run.thread_id, run.run_id)
        .await?
        .ok_or_else(ApiError::run_not_found)?;
    if !(now_run.status.is_terminal() || now_run.status == RunStatus::Suspended) {
        return Ok(None);
    }
    let query = ObservationQuery {
        after,
        limit: 1,
        types: Some(vec![
            ObservationType::RunCompleted,
            ObservationType::RunFailed,
            ObservationType::RunCancelled,
            ObservationType::RunSuspended,
        ]),
        parent_id: None,
        run_id: Some(run.run_id),
    };
    let later = state
        .cases
        .list_observations(&run.tenant, &run.thread_id, &query)
        .await?
        .unwrap_or_default();
    if !later.is_empty() {
        return Ok(None);
    }
    let pending: Vec<Suspension> = state.cases.pending_of_run(run).await?;
    let now = chrono::Utc::now().timestamp_millis();
    Ok(Some(
        fold.ended(&now_run, &pending, now)
            .iter()
            .map(|e| frame(e, None))
            .collect(),
    ))
}

/// The SSE response; `slot` is held until the body is dropped.
fn sse(
    state: &AppState,
    events: futures::stream::BoxStream<'static, Result<Frame, Infallible>>,
    slot: StreamSlot,
) -> Response {
    let events = events.map(move |e| {
        let _slot = &slot;
        e
    });
    let keepalive = Duration::from_secs(state.config.sse_keepalive_seconds.max(1));
    let events: std::pin::Pin<Box<dyn Stream<Item = _> + Send>> = Box::pin(events);
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(keepalive).text("keep-alive"))
        .into_response()
}
