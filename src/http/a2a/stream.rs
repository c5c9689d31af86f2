//! A task as a stream of A2A events, built from its run's observation log: the log is read up to
//! a point `P` (now, or the client's `Last-Event-ID`) and folded into the task, which is the first
//! event (`id: P`); then the observations after `P` follow from the same replay-then-live stream
//! as `/v1/threads/{id}/events` ([`crate::commands::UseCases::follow`]), each turned into the status and
//! artifact updates it stands for (`id:` its `seq`). The log is the only source, so a client that
//! resubscribes after a restart of the server gets the task as it is and every update after it:
//! nothing is lost and nothing is invented. The stream ends when the task ends or needs input.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::a2a::rpc::{RpcError, success};
use crate::a2a::tasks::TaskFold;
use crate::a2a::types::{StreamResponse, Version};
use crate::commands::ObservationQuery;
use crate::commands::{StreamItem, StreamSpec};
use crate::http::AppState;
use crate::http::quota::StreamSlot;
use crate::model::Run;

/// Observations read per page while folding the log.
const FOLD_PAGE: u32 = 500;

/// The SSE response streaming `run`'s task: the task folded from the log up to `replay_to`
/// (default: all of it so far), then every update after that point.
///
/// # Errors
/// The thread is gone (task not found), or the store fails.
pub async fn task_events(
    state: &AppState,
    run: Run,
    replay_to: Option<i64>,
    rpc_id: Value,
    version: Version,
    slot: StreamSlot,
) -> Result<Response, RpcError> {
    let mut fold = TaskFold::new(&run);
    let mut point = run.start_seq;
    let limit = replay_to.map(|p| p.max(run.start_seq));
    'pages: loop {
        let query = ObservationQuery {
            after: point,
            limit: FOLD_PAGE,
            run_id: Some(run.run_id),
            ..Default::default()
        };
        let page = state
            .cases
            .list_observations(&run.tenant, &run.thread_id, &query)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "reading a task's observations failed");
                RpcError::internal()
            })?
            .ok_or_else(|| RpcError::task_not_found(&run.run_id.to_string()))?;
        let full = page.len() == FOLD_PAGE as usize;
        for o in &page {
            if limit.is_some_and(|l| o.seq > l) {
                break 'pages;
            }
            fold.apply(o);
            point = o.seq;
        }
        if !full {
            break;
        }
    }
    if let Some(l) = limit {
        point = point.max(l);
    }
    let frame = move |id: i64, item: &StreamResponse, rpc_id: &Value| -> Event {
        Event::default()
            .id(id.to_string())
            .data(success(rpc_id, item.to_wire(version)).to_string())
    };
    // The task as of `point`: its metadata says where the updates that follow start.
    let mut task = fold.task();
    if let Some(pes) = task
        .metadata
        .as_mut()
        .and_then(|m| m.get_mut("pes"))
        .and_then(Value::as_object_mut)
    {
        pes.insert("seq".into(), point.into());
    }
    let first = frame(point, &StreamResponse::Task(task), &rpc_id);
    let head = futures::stream::iter([Ok::<_, Infallible>(first)]);
    if fold.finished() {
        return Ok(sse(state, head.boxed(), slot));
    }
    let spec = StreamSpec {
        tenant: run.tenant.clone(),
        thread_id: run.thread_id.clone(),
        after: point,
        types: None,
        parent_id: None,
        run_id: Some(run.run_id),
        until_run_end: true,
    };
    let observations = state.cases.follow(spec, None).boxed();
    let updates = futures::stream::unfold(
        (fold, observations, false),
        move |(mut fold, mut observations, done)| {
            let rpc_id = rpc_id.clone();
            async move {
                if done {
                    return None;
                }
                let item = observations.next().await?;
                let StreamItem::Obs(o) = item else {
                    return None;
                };
                let frames: Vec<Result<Event, Infallible>> = fold
                    .apply(&o)
                    .iter()
                    .map(|e| Ok(frame(o.seq, e, &rpc_id)))
                    .collect();
                let done = fold.finished();
                Some((futures::stream::iter(frames), (fold, observations, done)))
            }
        },
    )
    .flatten();
    Ok(sse(state, head.chain(updates).boxed(), slot))
}

/// The SSE response; `slot` (the tenant's stream quota) is held until the body is dropped.
fn sse(
    state: &AppState,
    events: futures::stream::BoxStream<'static, Result<Event, Infallible>>,
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
