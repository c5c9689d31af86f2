//! Runs: post a query (202, or a stream of the run's observations with
//! `Accept: text/event-stream`), wait for a run, list, read and cancel runs.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::sse::{RunStreamParams, StreamSpec, observation_sse};
use super::threads::{Page, PageParams, check_config};
use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit, parse_thread_id,
};
use crate::events::BusMsg;
use crate::model::{AgentConfig, MultitaskStrategy, Run, RunStatus, ThreadId};
use crate::store::NewRun;
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
}

/// Enqueue the run `body` asks for on `thread_id`; its spans will continue `trace` (see
/// [`TraceContext::for_run`]).
pub(crate) async fn enqueue(
    state: &AppState,
    tenant: String,
    thread_id: ThreadId,
    body: CreateRun,
    trace: Option<TraceContext>,
) -> Result<(Run, bool), ApiError> {
    let query = body.query.trim().to_owned();
    if query.is_empty() {
        return Err(ApiError::Validation("query must not be empty".into()));
    }
    if query.chars().count() > state.config.max_query_chars {
        return Err(ApiError::Validation(format!(
            "query is longer than {} characters (PES_MAX_QUERY_CHARS)",
            state.config.max_query_chars
        )));
    }
    if let Some(k) = &body.idempotency_key
        && (k.is_empty() || k.chars().count() > 256)
    {
        return Err(ApiError::Validation(
            "idempotencyKey must be 1 to 256 characters".into(),
        ));
    }
    let config = body.config.unwrap_or_default();
    check_config(state, &tenant, &config).await?;
    if config.require_approval.is_some() || config.tools.is_some() {
        // Read only when the run touches the policy: the common run costs no extra query.
        if let Some(thread) = state.store.get_thread(&tenant, &thread_id).await? {
            check_policy_floor(&thread.config, &config)?;
        }
    }
    let max_active = state.config.tenant_max_active_runs;
    if state.store.count_active_runs(&tenant, max_active).await? >= max_active {
        return Err(ApiError::QuotaExceeded {
            detail: format!(
                "the tenant has {max_active} runs queued or running, its quota \
                 (PES_TENANT_MAX_ACTIVE_RUNS): post again when some have ended"
            ),
            retry_after_seconds: 5,
        });
    }
    let strategy = body
        .multitask_strategy
        .unwrap_or(MultitaskStrategy::Enqueue);
    let create_thread = body.if_not_exists == Some(IfNotExists::Create);
    let shown_id = thread_id.to_string();
    let created = state
        .commands
        .enqueue(NewRun {
            tenant,
            thread_id,
            query,
            config,
            strategy,
            idempotency_key: body.idempotency_key,
            create_thread,
            trace_context: trace.map(|t| t.to_stored()),
        })
        .await
        .map_err(|e| match e {
            // Say how to get the thread the client evidently expected.
            crate::store::StoreError::ThreadNotFound => ApiError::NotFound {
                code: "thread_not_found",
                detail: format!(
                    "thread `{shown_id}` not found: create it with `POST /v1/threads`, or post \
                     the run with `\"ifNotExists\": \"create\"` to create it on the fly"
                ),
            },
            other => other.into(),
        })?;
    Ok((created.run, created.created))
}

/// A run may tighten its thread's tool policy, never loosen it: its `requireApproval` keeps every
/// tool the thread's names (the engine also takes the union, so a later change to the thread
/// cannot open a gap), and its `tools` stay within the thread's.
///
/// # Errors
/// 422 `policy_floor` naming the first tool the run would drop or add.
fn check_policy_floor(thread: &AgentConfig, run: &AgentConfig) -> Result<(), ApiError> {
    if let (Some(floor), Some(asked)) = (&thread.require_approval, &run.require_approval)
        && let Some(dropped) = floor.iter().find(|n| !asked.contains(n))
    {
        return Err(ApiError::Unprocessable {
            code: "policy_floor",
            detail: format!(
                "config.requireApproval may add tools to the thread's, never drop one: \
                 `{dropped}` needs approval on this thread"
            ),
        });
    }
    if let (Some(allowed), Some(asked)) = (&thread.tools, &run.tools)
        && let Some(extra) = asked.iter().find(|n| !allowed.contains(n))
    {
        return Err(ApiError::Unprocessable {
            code: "policy_floor",
            detail: format!(
                "config.tools may narrow the thread's tools, never widen them: `{extra}` is not \
                 enabled on this thread"
            ),
        });
    }
    Ok(())
}

/// The thread id of a run request. Without `ifNotExists: "create"` an id that cannot exist names
/// no thread (404); with it, the client asks us to create a thread under an invalid id (422).
fn run_thread_id(raw: &str, body: &CreateRun) -> Result<ThreadId, ApiError> {
    if body.if_not_exists == Some(IfNotExists::Create) {
        ThreadId::parse(raw).map_err(|e| ApiError::Validation(format!("invalid thread id: {e}")))
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
        (status = 200, description = "With `Accept: text/event-stream`: the run's observations as Server-Sent Events until it completes, fails, is cancelled or suspends. Otherwise: the run already created with this `idempotencyKey`.",
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
        .then(|| state.bus.tokens().subscribe(&tenant, &id));
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

/// Wait until a run completes, fails, is cancelled or suspends, then return it.
pub(crate) async fn wait_for_run(
    state: &AppState,
    tenant: &str,
    thread_id: &ThreadId,
    run_id: Uuid,
) -> Result<Run, ApiError> {
    let mut rx = state.bus.subscribe(tenant, thread_id);
    loop {
        let run = state
            .store
            .get_run(tenant, thread_id, run_id)
            .await?
            .ok_or_else(ApiError::run_not_found)?;
        if run.status.is_terminal() || run.status == RunStatus::Suspended {
            return Ok(run);
        }
        // Re-check on any observation of the run that may end it, or every second in case the
        // run is driven by another replica.
        let deadline = tokio::time::sleep(Duration::from_secs(1));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = state.shutdown.cancelled() => {
                    return Err(ApiError::Unavailable("the service is shutting down".into()));
                }
                _ = &mut deadline => break,
                msg = rx.recv() => match msg {
                    Ok(BusMsg::Obs(o)) if o.run_id == Some(run_id) && o.kind.ends_run_stream() => break,
                    Ok(BusMsg::Obs(_)) => {}
                    Ok(BusMsg::Wake(_) | BusMsg::ThreadDeleted) | Err(_) => break,
                },
            }
        }
    }
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
        wait_for_run(&state, &tenant, &id, run.run_id).await?,
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
        .store
        .list_runs(&tenant, &id, limit + 1, cursor.as_ref())
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(Page::from_overfetch(items, limit, |r| {
        encode_cursor(r.created_at, &r.run_id.to_string())
    })))
}

fn parse_run_id(raw: &str) -> Result<Uuid, ApiError> {
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
        .store
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
    let cancelled = state.commands.cancel(&tenant, &id, run_id).await?;
    Ok((StatusCode::ACCEPTED, AppJson(cancelled.run)))
}
