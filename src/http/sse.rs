//! The observation log over HTTP: as JSON pages, and as a Server-Sent Events stream that replays
//! from the store everything after `Last-Event-ID` (or `?after=`) and then continues live with no
//! gap and no duplicate, however long the client was away.
//!
//! The stream is the use case [`crate::commands::UseCases::follow`] worded as frames.
//!
//! A stream that asked for tokens (`?tokens=true`) also sends the token deltas of its thread's
//! runs (driven by this process, or relayed from the replica that drives them), as `event: token`
//! frames without `id:`, while it waits for the next observation: they are not in the table, so a
//! replay never has them.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use futures::StreamExt;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::page::Page;
use super::quota::StreamSlot;
use super::{ApiError, AppJson, AppPath, AppQuery, AppState, Problem, Tenant, parse_thread_id};
use crate::commands::{ObservationQuery, StreamItem, StreamSpec};
use crate::events::{TokenDelta, TokenSubscription};
use crate::model::{Observation, ObservationType, ThreadId};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_observations))
        .routes(routes!(events))
}

/// An observation as an SSE frame: `id: <seq>`, `event: <type>`, `data: <observation>`.
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

/// The last frame of a stream whose thread was deleted: no `id:` (it is not an observation and
/// is never replayed), `event: THREAD_DELETED`.
fn thread_deleted_event(thread_id: &ThreadId) -> Event {
    Event::default()
        .event("THREAD_DELETED")
        .data(serde_json::json!({"type": "THREAD_DELETED", "threadId": thread_id}).to_string())
}

/// An SSE response streaming the observations `spec` selects ([`crate::commands::UseCases::follow`] as
/// frames: `id: <seq>`, `event: <type>`, `data: <observation>`), with keep-alive comments; with
/// `tokens`, `event: token` frames `{runId, itemId, phase, delta}` without `id:` too.
pub fn observation_sse(
    state: &AppState,
    spec: StreamSpec,
    tokens: Option<TokenSubscription>,
    slot: StreamSlot,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let thread_id = spec.thread_id.clone();
    let events = state.cases.follow(spec, tokens).map(move |item| {
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
                .map_err(ApiError::validation)
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
            return Err(ApiError::validation(
                "limit must be between 1 and 1000".into(),
            ));
        }
    };
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::validation("after must not be negative".into()));
    }
    let query = ObservationQuery {
        after,
        limit: limit + 1,
        types: parse_types(params.kind.as_deref())?,
        parent_id: params.parent_id,
        run_id: params.run_id,
    };
    let items = state
        .cases
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
        return Err(ApiError::validation("after must not be negative".into()));
    }
    let types = parse_types(params.types.as_deref())?;
    state
        .cases
        .get_thread(&tenant, &id)
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    let slot = state.streams.take(&tenant)?;
    let tokens =
        (params.tokens == Some(true)).then(|| state.cases.token_subscription(&tenant, &id));
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
