//! A thread's past: the points its state can be read at, and forks. The past state
//! itself is `GET /v1/threads/{threadId}/state?atSeq=` (in `threads.rs`, beside the present one).

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::page::{Page, PageParams};
use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit, parse_thread_id,
};
use crate::commands::ForkRequest;
use crate::model::{Thread, ThreadId};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_history))
        .routes(routes!(fork_thread))
}

/// A point of a thread's history: a commit that changed its state.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPoint {
    /// The commit's last observation: `GET …/state?atSeq=` reads the state there.
    pub seq: i64,
    /// The run that made the commit (none for a change made outside a run).
    pub run_id: Option<Uuid>,
    /// The type of observation `seq`.
    #[serde(rename = "type")]
    pub kind: String,
    pub created_at: DateTime<Utc>,
}

/// The points a past state can be read at, newest first.
///
/// Each is a commit that changed the state (the agent state, an item, or a suspension); every
/// seq in between reads the same state as the point before it.
#[utoipa::path(get, path = "/v1/threads/{threadId}/history", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), PageParams),
    responses(
        (status = 200, description = "A page of history points, newest first", body = Page<HistoryPoint>),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_history(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<PageParams>,
) -> Result<AppJson<Page<HistoryPoint>>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let limit = page_limit(params.limit)?;
    let before = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::Seq))
        .transpose()?
        .map(|c| c.id.parse::<i64>().unwrap_or(0));
    let points = state
        .cases
        .history(&tenant, &id, limit + 1, before)
        .await?
        .ok_or_else(ApiError::thread_not_found)?
        .into_iter()
        .map(|p| HistoryPoint {
            seq: p.seq,
            run_id: p.run_id,
            kind: p.kind,
            created_at: p.created_at,
        })
        .collect();
    Ok(AppJson(Page::from_overfetch(points, limit, |p| {
        encode_cursor(p.created_at, &p.seq.to_string())
    })))
}

/// Body of `POST /v1/threads/{threadId}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"atSeq": 12, "metadata": {"experiment": "reject instead"}}))]
pub struct ForkThread {
    /// Cut after this observation (a commit is kept whole: a seq inside one takes all of it);
    /// the source's last when absent.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub at_seq: Option<i64>,
    /// The fork's id (1–128 characters of `A-Za-z0-9_.:-`); a UUIDv7 when absent.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub thread_id: Option<ThreadId>,
    /// The fork's metadata (a JSON object; the source's when absent). `forkedFrom
    /// {threadId, atSeq}` is added to it.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

/// Fork a thread: a new thread whose log, messages, state and history are the source's up to
/// `atSeq`.
///
/// A run under way at that point continues on the fork as a new run, from its last commit
/// there, as crash recovery would continue it; a suspension pending at that point is pending on
/// the fork under a new `suspensionId` (read it from the fork's state), so a person can decide
/// differently there. The source is not changed.
#[utoipa::path(post, path = "/v1/threads/{threadId}/fork", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    request_body = ForkThread,
    responses(
        (status = 201, description = "The fork", body = Thread),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A thread with the fork's id exists", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`atSeq` is negative or past the last observation (`seq_out_of_range`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn fork_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppJson(body): AppJson<ForkThread>,
) -> Result<(StatusCode, AppJson<Thread>), ApiError> {
    let source = parse_thread_id(&thread_id)?;
    let req = ForkRequest {
        at_seq: body.at_seq,
        thread_id: body.thread_id.unwrap_or_else(ThreadId::generate),
        metadata: body.metadata,
    };
    let forked = state.cases.fork(&tenant, &source, req).await?;
    Ok((StatusCode::CREATED, AppJson(forked.thread)))
}
