//! Crons, per tenant: `POST/GET /v1/crons` (`?threadId=`) and
//! `GET/PATCH/DELETE /v1/crons/{cronId}`. The handlers parse the request and call
//! [`crate::commands::UseCases`]; the rules and the scheduler are in `commands::crons`.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::page::Page;
use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit,
};
use crate::commands::crons::{CronInput, CronPatch};
use crate::model::{AgentConfig, AssistantId, Cron, MultitaskStrategy, OnMissed, ThreadId};
use crate::problem::Refusal;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_cron, list_crons))
        .routes(routes!(get_cron, patch_cron, delete_cron))
}

/// The longest schedule and time zone accepted, in bytes.
const MAX_SCHEDULE_BYTES: usize = 256;

/// Body of `POST /v1/crons`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"schedule": "0 9 * * 1-5", "timezone": "Europe/Paris", "query": "Summarize yesterday's tickets", "threadId": "triage"}))]
pub struct CreateCron {
    /// The thread each tick posts to (it must exist); absent: each tick runs on a new thread.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub thread_id: Option<ThreadId>,
    /// The assistant each tick's run uses (instead of the thread's).
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub assistant_id: Option<AssistantId>,
    /// A 5-field cron expression: minute hour day-of-month month day-of-week (`*/15 * * * *`,
    /// `0 9 * * MON-FRI`). A bad one is refused (422) naming the field that is wrong.
    #[schema(min_length = 1, max_length = 256, example = "0 9 * * 1-5")]
    pub schedule: String,
    /// An IANA time zone the schedule is read in; default `UTC`.
    #[serde(default)]
    #[schema(max_length = 256, example = "Europe/Paris")]
    pub timezone: Option<String>,
    /// The query each tick posts.
    #[schema(min_length = 1, pattern = "\\S")]
    pub query: String,
    /// Each tick's run overrides of its thread's config (checked as a run's).
    #[serde(default)]
    pub config: Option<AgentConfig>,
    /// The strategy each tick's run is posted with while the thread is busy; default `enqueue`.
    #[serde(default)]
    pub multitask_strategy: Option<MultitaskStrategy>,
    /// Default true; a disabled cron does not tick.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Ticks missed while no replica ran: `run_once` (default) makes one catch-up run at
    /// start, `skip` none.
    #[serde(default)]
    pub on_missed: Option<OnMissed>,
}

/// Body of `PATCH /v1/crons/{cronId}`: the fields to change (a cron's thread and assistant do
/// not change). A new schedule or time zone, or enabling the cron, sets its next tick from now.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"enabled": false}))]
pub struct PatchCron {
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256)]
    pub schedule: Option<String>,
    #[serde(default)]
    #[schema(max_length = 256)]
    pub timezone: Option<String>,
    #[serde(default)]
    #[schema(min_length = 1, pattern = "\\S")]
    pub query: Option<String>,
    /// Replaces the config whole.
    #[serde(default)]
    pub config: Option<AgentConfig>,
    #[serde(default)]
    pub multitask_strategy: Option<MultitaskStrategy>,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub on_missed: Option<OnMissed>,
}

/// Which crons to list (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CronParams {
    /// Only the crons of this thread.
    #[param(nullable = false, value_type = Option<String>)]
    pub thread_id: Option<String>,
    /// Items per page: 1–200, default 50.
    #[param(minimum = 1, maximum = 200, nullable = false)]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page (opaque); a cursor this API did not make is refused
    /// (422).
    #[param(min_length = 1, nullable = false)]
    pub cursor: Option<String>,
}

/// A cron id from the path; one that cannot exist is simply not found.
fn parse_id(raw: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(raw).map_err(|_| Refusal::NotFound {
        code: "cron_not_found",
        detail: format!("cron `{raw}` not found"),
    })
}

/// 422 for a schedule or time zone past its length (checked before it is parsed).
fn bounded(field: &str, value: Option<&str>) -> Result<(), ApiError> {
    match value {
        Some(v) if v.len() > MAX_SCHEDULE_BYTES => Err(ApiError::validation(format!(
            "{field} is longer than {MAX_SCHEDULE_BYTES} bytes"
        ))),
        _ => Ok(()),
    }
}

/// Create a cron: from its next tick on, each tick posts `query` (exactly one run per tick,
/// whatever the number of replicas).
#[utoipa::path(post, path = "/v1/crons", tag = "crons", request_body = CreateCron,
    responses(
        (status = 201, description = "Created, with its next tick (`nextRunAt`)", body = Cron),
        (status = 422, description = "A bad schedule, time zone, query or config (`validation_failed`, naming what is wrong), or a `threadId` or `assistantId` that names nothing (`thread_not_found`, `assistant_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn create_cron(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<CreateCron>,
) -> Result<(StatusCode, AppJson<Cron>), ApiError> {
    bounded("schedule", Some(&body.schedule))?;
    bounded("timezone", body.timezone.as_deref())?;
    let input = CronInput {
        thread_id: body.thread_id,
        assistant_id: body.assistant_id,
        schedule: body.schedule,
        timezone: body.timezone,
        query: body.query,
        config: body.config.unwrap_or_default(),
        multitask_strategy: body.multitask_strategy,
        enabled: body.enabled,
        on_missed: body.on_missed,
    };
    let cron = state.cases.create_cron(&tenant, input).await?;
    Ok((StatusCode::CREATED, AppJson(cron)))
}

/// List the tenant's crons, newest first.
#[utoipa::path(get, path = "/v1/crons", tag = "crons", params(CronParams),
    responses((status = 200, description = "A page of crons", body = Page<Cron>)))]
pub async fn list_crons(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppQuery(params): AppQuery<CronParams>,
) -> Result<AppJson<Page<Cron>>, ApiError> {
    let limit = page_limit(params.limit)?;
    let cursor = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::Uuid))
        .transpose()?;
    // A thread id that cannot exist has no crons.
    let thread = match params.thread_id.as_deref().map(ThreadId::parse) {
        Some(Err(_)) => {
            return Ok(AppJson(Page::from_overfetch(vec![], limit, |_| {
                String::new()
            })));
        }
        Some(Ok(t)) => Some(t),
        None => None,
    };
    let items = state
        .cases
        .list_crons(&tenant, thread.as_ref(), limit + 1, cursor.as_ref())
        .await?;
    Ok(AppJson(Page::from_overfetch(items, limit, |c| {
        encode_cursor(c.created_at, &c.cron_id.to_string())
    })))
}

/// Read a cron, with its next tick and what its last tick did.
#[utoipa::path(get, path = "/v1/crons/{cronId}", tag = "crons",
    params(("cronId" = Uuid, Path, description = "The cron")),
    responses(
        (status = 200, description = "The cron", body = Cron),
        (status = 404, description = "No such cron (`cron_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_cron(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
) -> Result<AppJson<Cron>, ApiError> {
    let id = parse_id(&id)?;
    Ok(AppJson(state.cases.get_cron(&tenant, id).await?))
}

/// Change a cron: its schedule, time zone, query, config, strategy, `enabled` or `onMissed`.
#[utoipa::path(patch, path = "/v1/crons/{cronId}", tag = "crons", request_body = PatchCron,
    params(("cronId" = Uuid, Path, description = "The cron")),
    responses(
        (status = 200, description = "The cron, changed", body = Cron),
        (status = 404, description = "No such cron (`cron_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn patch_cron(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
    AppJson(body): AppJson<PatchCron>,
) -> Result<AppJson<Cron>, ApiError> {
    let id = parse_id(&id)?;
    bounded("schedule", body.schedule.as_deref())?;
    bounded("timezone", body.timezone.as_deref())?;
    let patch = CronPatch {
        schedule: body.schedule,
        timezone: body.timezone,
        query: body.query,
        config: body.config,
        multitask_strategy: body.multitask_strategy,
        enabled: body.enabled,
        on_missed: body.on_missed,
    };
    Ok(AppJson(state.cases.update_cron(&tenant, id, patch).await?))
}

/// Delete a cron; the runs it made stay.
#[utoipa::path(delete, path = "/v1/crons/{cronId}", tag = "crons",
    params(("cronId" = Uuid, Path, description = "The cron")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such cron (`cron_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn delete_cron(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&id)?;
    state.cases.delete_cron(&tenant, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
