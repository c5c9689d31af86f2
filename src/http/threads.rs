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
use crate::model::{
    AgentConfig, AssistantId, AssistantPin, ItemStatus, Message, Thread, ThreadId, ThreadSummary,
    TodoItem,
};
use crate::store::ThreadPatch;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_thread, list_threads))
        .routes(routes!(get_thread, patch_thread, delete_thread))
        .routes(routes!(get_state))
        .routes(routes!(super::history::list_history))
        .routes(routes!(super::history::fork_thread))
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

/// `assistantVersion` must name a version (1 and up) of an assistant the same body names.
fn check_version(version: Option<i64>, has_assistant: bool) -> Result<(), ApiError> {
    match version {
        Some(v) if v < 1 => Err(ApiError::Validation(
            "assistantVersion must be 1 or more".into(),
        )),
        Some(_) if !has_assistant => Err(ApiError::Validation(
            "assistantVersion pins a version of an assistant: set assistantId too".into(),
        )),
        _ => Ok(()),
    }
}

/// A page of items.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Page<T: ToSchema> {
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

impl<T: ToSchema> Page<T> {
    /// A page from `limit + 1` rows: the extra row only tells that there is a next page, whose
    /// cursor `cursor_of` makes from the page's last item.
    pub fn from_overfetch(mut items: Vec<T>, limit: u32, cursor_of: impl Fn(&T) -> String) -> Self {
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(cursor_of)
        } else {
            None
        };
        Page { items, next_cursor }
    }
}

/// Pagination parameters (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page: 1–200, default 50.
    #[param(minimum = 1, maximum = 200, nullable = false)]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page (opaque); a cursor this API did not make is refused
    /// (422).
    #[param(min_length = 1, nullable = false)]
    pub cursor: Option<String>,
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

pub(super) fn check_metadata(metadata: &Option<Value>) -> Result<(), ApiError> {
    match metadata {
        Some(Value::Object(_)) | None => Ok(()),
        Some(_) => Err(ApiError::Validation(
            "metadata must be a JSON object".into(),
        )),
    }
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
    check_metadata(&body.metadata)?;
    check_version(body.assistant_version, body.assistant_id.is_some())?;
    state.cases.storage_room(&tenant).await?;
    let config = body.config.unwrap_or_default();
    state.cases.check_config(&tenant, &config).await?;
    let assistant = body.assistant_id.map(|assistant_id| AssistantPin {
        assistant_id,
        version: body.assistant_version,
    });
    if let Some(pin) = &assistant {
        state
            .cases
            .check_thread_assistant(&tenant, pin, &config)
            .await?;
    }
    let id = body.thread_id.unwrap_or_else(ThreadId::generate);
    let metadata = body
        .metadata
        .unwrap_or_else(|| Value::Object(Default::default()));
    let thread = state
        .store
        .create_thread_using(&tenant, &id, metadata, config, assistant.as_ref())
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
        .store
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
        .store
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
    check_metadata(&body.metadata)?;
    check_version(body.assistant_version.flatten(), true)?;
    if let Some(cfg) = &body.config {
        state.cases.check_config(&tenant, cfg).await?;
    }
    let assistant = state
        .cases
        .patch_thread_assistant(
            &tenant,
            &id,
            body.assistant_id,
            body.assistant_version,
            body.config.as_ref(),
        )
        .await?;
    let patch = ThreadPatch {
        metadata: body.metadata,
        config: body.config,
        assistant,
    };
    let thread = state
        .store
        .update_thread(&tenant, &id, patch)
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
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
    if state.commands.delete_thread(&tenant, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::thread_not_found())
    }
}

/// The remote tasks a thread's items wait on, by item: `{itemId, submittedAt, taskIds}`.
async fn pending_remote_tasks(
    state: &AppState,
    tenant: &str,
    id: &ThreadId,
    upto: Option<i64>,
) -> Result<Vec<Value>, ApiError> {
    use crate::model::ObservationType as T;
    let read = |types: Vec<T>| {
        let query = crate::store::ObservationQuery {
            after: 0,
            limit: 0,
            types: Some(types),
            parent_id: None,
            run_id: None,
        };
        async move {
            state
                .store
                .list_observations(tenant, id, &query)
                .await
                .map(Option::unwrap_or_default)
                .map(|mut found| {
                    // A past state waits on what was sent and unanswered by then.
                    found.retain(|o| upto.is_none_or(|at| o.seq <= at));
                    found
                })
        }
    };
    // Most threads never delegate: their tool results are not read at all.
    let updates = read(vec![T::A2aTaskUpdate]).await?;
    if updates.is_empty() {
        return Ok(vec![]);
    }
    let mut seen = read(vec![T::ToolExecution]).await?;
    seen.extend(updates);
    // The ledger wants the log in commit order.
    seen.sort_by_key(|o| o.seq);
    let ledger = crate::agent::DelegationLedger::read(&seen);
    // By item, in the order first sent: (submittedAt, taskIds).
    let mut by_item: Vec<(String, Value, Vec<String>)> = Vec::new();
    for r in ledger.unanswered() {
        let (Some(item), Some(task)) = (&r.item_id, &r.task_id) else {
            continue;
        };
        match by_item.iter_mut().find(|(i, _, _)| i == item) {
            Some((_, _, tasks)) if !tasks.contains(task) => tasks.push(task.clone()),
            Some(_) => {}
            None => by_item.push((
                item.clone(),
                serde_json::json!(r.submitted_at),
                vec![task.clone()],
            )),
        }
    }
    Ok(by_item
        .into_iter()
        .map(|(item, at, tasks)| serde_json::json!({"itemId": item, "submittedAt": at, "taskIds": tasks}))
        .collect())
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
                .store
                .state_snapshot(&tenant, &id)
                .await?
                .ok_or_else(ApiError::thread_not_found)?,
            None,
        ),
        Some(at) => {
            let past = super::history::state_at(&state, &tenant, &id, at).await?;
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
        pending_remote_tasks(&state, &tenant, &id, at_seq).await?
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
        .store
        .list_messages(&tenant, &id, limit + 1, cursor.as_ref())
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(Page::from_overfetch(items, limit, |m| {
        encode_cursor(m.created_at, &m.id.to_string())
    })))
}
