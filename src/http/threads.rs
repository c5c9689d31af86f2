//! Threads: create, list, read, update, delete; the agent state (seed field names) and the
//! conversation history.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit, parse_thread_id,
};
use crate::commands::{NewThread, ThreadUpdate};
use crate::model::{
    AgentConfig, AssistantId, ItemStatus, Message, Thread, ThreadId, ThreadSummary, TodoItem,
};

pub use super::page::{Page, PageParams};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_thread, list_threads))
        .routes(routes!(get_thread, patch_thread, delete_thread))
        .routes(routes!(get_state))
        .routes(routes!(list_messages))
}

/// Body of `POST /v1/threads`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"metadata": {"project": "demo"}, "config": {"tools": ["calculator", "current_time"], "maxIterations": 5}}))]
pub struct CreateThread {
    /// Client-chosen id (1–128 characters of `A-Za-z0-9_.:-`); a UUIDv7 when absent.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub thread_id: Option<ThreadId>,
    /// Any JSON object (`{}` when absent).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub config: Option<AgentConfig>,
    /// The assistant whose config the thread's runs start from (the thread's config overlays
    /// it); the thread's config may not set a field it locks.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub assistant_id: Option<AssistantId>,
    /// Pin a version of `assistantId`; absent, runs use its current version when enqueued.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub assistant_version: Option<i64>,
}

/// Body of `PATCH /v1/threads/{threadId}`: fields present replace the stored ones.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateThread {
    /// Any JSON object; replaces the stored metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Replaces the stored config.
    #[serde(default)]
    pub config: Option<AgentConfig>,
    /// Sets the thread's assistant (unpinned unless `assistantVersion` is given too); null
    /// detaches it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub assistant_id: Option<Option<AssistantId>>,
    /// Pins a version of the thread's assistant; null follows its current version.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub assistant_version: Option<Option<i64>>,
}

/// A field that may be absent (`None`), null (`Some(None)`) or set.
fn present<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// `PESAgentStateData` of a thread, with the seed's field names.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStateView {
    #[schema(value_type = String)]
    pub thread_id: ThreadId,
    pub intent: Option<String>,
    pub title: Option<String>,
    pub plan: Option<String>,
    pub todo_list: Vec<TodoItem>,
    /// The most recently started item still in progress.
    pub current_step_id: Option<String>,
    /// Every item in progress (parallel items run at once), in plan order.
    pub in_progress_item_ids: Vec<String>,
    pub is_paused: bool,
    /// The pending suspension, as `GET /v1/suspensions/{suspensionId}` shows it.
    #[schema(value_type = Option<crate::model::Suspension>)]
    pub suspension: Option<Value>,
    /// Result of each completed item, by item id.
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    pub step_outputs: serde_json::Map<String, Value>,
    /// Remote-agent tasks items wait on: `{itemId, submittedAt, taskIds}`, read from the
    /// log (a delegation's `A2A_TASK_UPDATE`s without a `TOOL_EXECUTION` yet).
    #[serde(rename = "pendingA2ATasks")]
    pub pending_a2a_tasks: Vec<Value>,
    /// Bumped on every change of the thread-level fields.
    pub version: i64,
    /// With `?atSeq=`: the seq the state was read at, the last observation of the commit that
    /// holds the one asked for (a commit's observations share one state). Absent for now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_seq: Option<i64>,
}

/// Create a thread.
#[utoipa::path(post, path = "/v1/threads", tag = "threads", request_body = CreateThread,
    responses(
        (status = 201, description = "Created", body = Thread),
        (status = 409, description = "A thread with this id exists", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn create_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<CreateThread>,
) -> Result<(StatusCode, AppJson<Thread>), ApiError> {
    let thread = state
        .cases
        .create_thread(
            &tenant,
            NewThread {
                thread_id: body.thread_id,
                metadata: body.metadata,
                config: body.config,
                assistant_id: body.assistant_id,
                assistant_version: body.assistant_version,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, AppJson(thread)))
}

/// List threads, newest first, each with its title and last query.
///
/// The title and the query of the thread's newest run are what a person recognises a thread by.
#[utoipa::path(get, path = "/v1/threads", tag = "threads", params(PageParams),
    responses((status = 200, description = "A page of threads", body = Page<ThreadSummary>)))]
pub async fn list_threads(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppQuery(params): AppQuery<PageParams>,
) -> Result<AppJson<Page<ThreadSummary>>, ApiError> {
    let limit = page_limit(params.limit)?;
    let cursor = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::ThreadId))
        .transpose()?;
    let items = state
        .cases
        .list_threads(&tenant, limit + 1, cursor.as_ref())
        .await?;
    Ok(AppJson(Page::from_overfetch(items, limit, |t| {
        encode_cursor(t.thread.created_at, t.thread.thread_id.as_str())
    })))
}

/// Read a thread.
#[utoipa::path(get, path = "/v1/threads/{threadId}", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 200, description = "The thread", body = Thread),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
) -> Result<AppJson<Thread>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let thread = state
        .cases
        .get_thread(&tenant, &id)
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(thread))
}

/// Update a thread's metadata and/or config.
#[utoipa::path(patch, path = "/v1/threads/{threadId}", tag = "threads", request_body = UpdateThread,
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 200, description = "The updated thread", body = Thread),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn patch_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppJson(body): AppJson<UpdateThread>,
) -> Result<AppJson<Thread>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let update = ThreadUpdate {
        metadata: body.metadata,
        config: body.config,
        assistant_id: body.assistant_id,
        assistant_version: body.assistant_version,
    };
    let thread = state.cases.update_thread(&tenant, &id, update).await?;
    Ok(AppJson(thread))
}

/// Delete a thread with its runs, state, messages, suspensions and observations.
#[utoipa::path(delete, path = "/v1/threads/{threadId}", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn delete_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    state.cases.delete_thread(&tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Query of `GET /v1/threads/{threadId}/state`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct StateParams {
    /// Read the state as it was right after observation `atSeq` was committed (0: before the
    /// first); past the thread's last observation is 422 `seq_out_of_range`. Absent: now.
    #[param(minimum = 0, nullable = false)]
    pub at_seq: Option<i64>,
}

/// The agent state of a thread (`PESAgentStateData`), now or at a past observation.
#[utoipa::path(get, path = "/v1/threads/{threadId}/state", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), StateParams),
    responses(
        (status = 200, description = "The agent state", body = AgentStateView),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`atSeq` is negative or past the last observation (`seq_out_of_range`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_state(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<StateParams>,
) -> Result<AppJson<AgentStateView>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let (snap, at_seq) = match params.at_seq {
        None => (
            state
                .cases
                .state_snapshot(&tenant, &id)
                .await?
                .ok_or_else(ApiError::thread_not_found)?,
            None,
        ),
        Some(at) => {
            let past = state.cases.state_at(&tenant, &id, at).await?;
            (past.snapshot, Some(past.seq))
        }
    };
    let step_outputs = snap
        .items
        .iter()
        .filter(|i| i.status == ItemStatus::Completed)
        .map(|i| {
            (
                i.id.to_string(),
                Value::String(i.result.clone().unwrap_or_default()),
            )
        })
        .collect();
    // Only a thread with work in flight can wait on remote agents.
    let busy = snap
        .items
        .iter()
        .any(|i| matches!(i.status, ItemStatus::InProgress | ItemStatus::Waiting));
    let pending_a2a_tasks = if busy {
        state
            .cases
            .pending_remote_tasks(&tenant, &id, at_seq)
            .await?
    } else {
        vec![]
    };
    let suspension = snap
        .pending_suspension
        .as_ref()
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null));
    Ok(AppJson(AgentStateView {
        thread_id: id,
        intent: snap.state.intent,
        title: snap.state.title,
        plan: snap.state.plan,
        current_step_id: snap.state.current_step_id,
        in_progress_item_ids: snap
            .items
            .iter()
            .filter(|i| i.status == ItemStatus::InProgress)
            .map(|i| i.id.to_string())
            .collect(),
        is_paused: suspension.is_some(),
        suspension,
        step_outputs,
        pending_a2a_tasks,
        version: snap.state.version,
        todo_list: snap.items,
        at_seq,
    }))
}

/// Conversation history, oldest first.
#[utoipa::path(get, path = "/v1/threads/{threadId}/messages", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), PageParams),
    responses(
        (status = 200, description = "A page of messages", body = Page<Message>),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_messages(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<PageParams>,
) -> Result<AppJson<Page<Message>>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let limit = page_limit(params.limit)?;
    let cursor = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::Uuid))
        .transpose()?;
    let items = state
        .cases
        .list_messages(&tenant, &id, limit + 1, cursor.as_ref())
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(Page::from_overfetch(items, limit, |m| {
        encode_cursor(m.created_at, &m.id.to_string())
    })))
}
