//! Runs: post a query (202, or a stream of the run's observations with
//! `Accept: text/event-stream`), wait for a run, list, read and cancel runs.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::page::{Page, PageParams};
use super::sse::{RunStreamParams, observation_sse};
use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit, parse_thread_id,
};
use crate::commands::RunRequest;
use crate::commands::StreamSpec;
use crate::model::{AgentConfig, AssistantId, MultitaskStrategy, Run, ThreadId};
use crate::telemetry::TraceContext;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_run, list_runs))
        .routes(routes!(wait_run))
        .routes(routes!(get_run))
        .routes(routes!(cancel_run))
}

/// What to do when the thread does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IfNotExists {
    /// Create the thread.
    Create,
    /// Answer 404 (the default).
    Reject,
}

/// Body of `POST /v1/threads/{threadId}/runs` and `…/runs/wait`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"query": "What is 17 * 23?", "multitaskStrategy": "enqueue"}))]
pub struct CreateRun {
    /// The user's query: at least one character that is not white space, at most
    /// `PES_MAX_QUERY_CHARS` characters (32,768 by default) once trimmed.
    #[schema(min_length = 1, pattern = "\\S")]
    pub query: String,
    /// Per-run overrides of the thread's config.
    #[serde(default)]
    pub config: Option<AgentConfig>,
    /// What to do while another run of the thread is active; default `enqueue`.
    #[serde(default)]
    pub multitask_strategy: Option<MultitaskStrategy>,
    /// `create` makes the thread when it does not exist; `reject` (the default) answers 404.
    #[serde(default)]
    pub if_not_exists: Option<IfNotExists>,
    /// A repeated key on the same thread returns the first run (200) instead of a new one.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: Option<String>,
    /// The assistant whose config this run starts from, instead of the thread's (its current
    /// version unless `assistantVersion` pins one). A run may not set a config field it locks.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub assistant_id: Option<AssistantId>,
    /// A version of `assistantId` (or, without it, of the thread's assistant) to use.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub assistant_version: Option<i64>,
    /// Announce this run's end (and its suspensions) with a signed webhook: it becomes the
    /// run's `config.webhook`, instead of its thread's or assistant's.
    #[serde(default)]
    pub webhook: Option<crate::model::WebhookSpec>,
}

/// Enqueue the run `body` asks for on `thread_id` (see [`crate::commands::UseCases::enqueue`]); its spans will
/// continue `trace` (see [`TraceContext::for_run`]).
async fn enqueue(
    state: &AppState,
    tenant: String,
    thread_id: ThreadId,
    body: CreateRun,
    trace: Option<TraceContext>,
) -> Result<(Run, bool), ApiError> {
    let request = RunRequest {
        query: body.query,
        config: body.config.unwrap_or_default(),
        strategy: body.multitask_strategy,
        idempotency_key: body.idempotency_key,
        create_thread: body.if_not_exists == Some(IfNotExists::Create),
        trace,
        assistant_id: body.assistant_id,
        assistant_version: body.assistant_version,
        webhook: body.webhook,
        cron_id: None,
        flowchart: None,
    };
    Ok(state.cases.enqueue(tenant, thread_id, request).await?)
}

/// The thread id of a run request. Without `ifNotExists: "create"` an id that cannot exist names
/// no thread (404); with it, the client asks us to create a thread under an invalid id (422).
fn run_thread_id(raw: &str, body: &CreateRun) -> Result<ThreadId, ApiError> {
    if body.if_not_exists == Some(IfNotExists::Create) {
        ThreadId::parse(raw).map_err(|e| ApiError::validation(format!("invalid thread id: {e}")))
    } else {
        parse_thread_id(raw)
    }
}

pub(crate) fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// Post a query: enqueue a run. With `Accept: text/event-stream` the response streams the run's
/// observations until it completes, fails, is cancelled or suspends.
#[utoipa::path(post, path = "/v1/threads/{threadId}/runs", tag = "runs", request_body = CreateRun,
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), RunStreamParams),
    responses(
        (status = 202, description = "Enqueued", body = Run),
        (status = 200, description = "With `Accept: text/event-stream`: the run's observations as Server-Sent Events until it completes, fails, is cancelled or suspends. Otherwise: the run already created with this `idempotencyKey`, or (`multitaskStrategy: steer` on a busy thread) the active run the query steered.",
            content((Run = "application/json"), (String = "text/event-stream"))),
        (status = 404, description = "No such thread (and `ifNotExists` is not `create`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another run is active and multitaskStrategy is `reject`", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn create_run(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<RunStreamParams>,
    headers: HeaderMap,
    AppJson(body): AppJson<CreateRun>,
) -> Result<Response, ApiError> {
    let id = run_thread_id(&thread_id, &body)?;
    let streamed = wants_event_stream(&headers);
    // Taken before the run exists: a stream the quota refuses starts no work.
    let slot = streamed.then(|| state.streams.take(&tenant)).transpose()?;
    // Subscribed before the run exists, so its first deltas are not missed.
    let tokens = (streamed && params.tokens == Some(true))
        .then(|| state.cases.token_subscription(&tenant, &id));
    let trace = TraceContext::for_run(&headers);
    let (run, created) = enqueue(&state, tenant.clone(), id.clone(), body, trace).await?;
    if let Some(slot) = slot {
        let spec = StreamSpec {
            tenant,
            thread_id: id,
            after: run.start_seq,
            types: None,
            parent_id: None,
            run_id: Some(run.run_id),
            until_run_end: true,
        };
        return Ok(observation_sse(&state, spec, tokens, slot).into_response());
    }
    let status = if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, AppJson(run)).into_response())
}

/// Post a query and answer when its run completes, fails, is cancelled or suspends.
#[utoipa::path(post, path = "/v1/threads/{threadId}/runs/wait", tag = "runs", request_body = CreateRun,
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 200, description = "The run, ended or suspended, with its final response", body = Run),
        (status = 404, description = "No such thread (and `ifNotExists` is not `create`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another run is active and multitaskStrategy is `reject`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The service shut down before the run ended (`unavailable`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn wait_run(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    headers: HeaderMap,
    AppJson(body): AppJson<CreateRun>,
) -> Result<AppJson<Run>, ApiError> {
    let id = run_thread_id(&thread_id, &body)?;
    let trace = TraceContext::for_run(&headers);
    let (run, _) = enqueue(&state, tenant.clone(), id.clone(), body, trace).await?;
    Ok(AppJson(
        state.cases.wait_for_run(&tenant, &id, run.run_id).await?,
    ))
}

/// List a thread's runs, newest first.
#[utoipa::path(get, path = "/v1/threads/{threadId}/runs", tag = "runs",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), PageParams),
    responses(
        (status = 200, description = "A page of runs", body = Page<Run>),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_runs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<PageParams>,
) -> Result<AppJson<Page<Run>>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let limit = page_limit(params.limit)?;
    let cursor = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::Uuid))
        .transpose()?;
    let items = state
        .cases
        .list_runs(&tenant, &id, limit + 1, cursor.as_ref())
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(Page::from_overfetch(items, limit, |r| {
        encode_cursor(r.created_at, &r.run_id.to_string())
    })))
}

pub(super) fn parse_run_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::run_not_found())
}

/// Read one run.
#[utoipa::path(get, path = "/v1/threads/{threadId}/runs/{runId}", tag = "runs",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), ("runId" = String, Path, description = "Run id (a UUID; any other id is not found)")),
    responses(
        (status = 200, description = "The run", body = Run),
        (status = 404, description = "No such thread or run", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_run(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath((thread_id, run_id)): AppPath<(String, String)>,
) -> Result<AppJson<Run>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let run_id = parse_run_id(&run_id)?;
    let run = state
        .cases
        .get_run(&tenant, &id, run_id)
        .await?
        .ok_or_else(ApiError::run_not_found)?;
    Ok(AppJson(run))
}

/// Cancel a queued, running or suspended run. A running run stops at its next safe point, with
/// its in-flight model or tool call abandoned.
#[utoipa::path(post, path = "/v1/threads/{threadId}/runs/{runId}/cancel", tag = "runs",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), ("runId" = String, Path, description = "Run id (a UUID; any other id is not found)")),
    responses(
        (status = 202, description = "Cancelled, or cancelling", body = Run),
        (status = 404, description = "No such thread or run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run already ended", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn cancel_run(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath((thread_id, run_id)): AppPath<(String, String)>,
) -> Result<(StatusCode, AppJson<Run>), ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let run_id = parse_run_id(&run_id)?;
    let cancelled = state.cases.cancel(&tenant, &id, run_id).await?;
    Ok((StatusCode::ACCEPTED, AppJson(cancelled.run)))
}
