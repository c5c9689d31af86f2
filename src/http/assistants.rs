//! Assistants, per tenant: `POST/GET /v1/assistants`,
//! `GET/PUT/DELETE /v1/assistants/{assistantId}`, `GET …/versions` and `POST …/current`. The
//! handlers parse the request and call [`crate::commands::UseCases`]; the rules are there.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::page::{Page, PageParams};
use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit,
};
use crate::commands::AssistantInput;
use crate::model::{AgentConfig, Assistant, AssistantId, AssistantVersion};
use crate::problem::Refusal;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_assistant, list_assistants))
        .routes(routes!(get_assistant, put_assistant, delete_assistant))
        .routes(routes!(list_versions))
        .routes(routes!(set_current))
}

/// Body of `POST /v1/assistants`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"assistantId": "support", "name": "Support agent", "config": {"systemPrompt": "Answer briefly.", "tools": ["calculator", "current_time"]}, "locked": ["tools"]}))]
pub struct CreateAssistant {
    /// Client-chosen id (1–128 characters of `A-Za-z0-9_.:-`); a UUIDv7 when absent.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub assistant_id: Option<AssistantId>,
    /// 1–200 characters.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// At most 4,000 characters.
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub description: Option<String>,
    /// A thread config, checked as a thread's is; at most `PES_ASSISTANT_MAX_CONFIG_BYTES` of
    /// JSON.
    pub config: AgentConfig,
    /// Config field names (camelCase) that threads and runs using the assistant may not set.
    #[serde(default)]
    pub locked: Option<Vec<String>>,
}

/// Body of `PUT /v1/assistants/{assistantId}`: a new version. `config` replaces the config
/// whole; the other fields, when absent, keep the current version's.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"config": {"systemPrompt": "Answer in one sentence.", "tools": ["calculator", "current_time"]}}))]
pub struct UpdateAssistant {
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub description: Option<String>,
    pub config: AgentConfig,
    #[serde(default)]
    pub locked: Option<Vec<String>>,
}

/// Body of `POST /v1/assistants/{assistantId}/current`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"version": 1}))]
pub struct SetCurrentVersion {
    /// A version the assistant keeps.
    #[schema(minimum = 1)]
    pub version: i64,
}

/// Which version to show (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AssistantVersionParams {
    /// A version number (1 and up); the current one when absent.
    #[param(minimum = 1, nullable = false)]
    pub version: Option<i64>,
}

/// An assistant id from the path; one that cannot exist is simply not found.
fn parse_id(raw: &str) -> Result<AssistantId, Refusal> {
    AssistantId::parse(raw).map_err(|_| Refusal::NotFound {
        code: "assistant_not_found",
        detail: format!("assistant `{raw}` not found"),
    })
}

/// Create an assistant: version 1, current.
#[utoipa::path(post, path = "/v1/assistants", tag = "assistants", request_body = CreateAssistant,
    responses(
        (status = 201, description = "Created", body = Assistant),
        (status = 409, description = "The tenant has an assistant with this id (`assistant_exists`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The assistant is not valid (`validation_failed`): `errors` names every bad field as `{path, message}`", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn create_assistant(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<CreateAssistant>,
) -> Result<(StatusCode, AppJson<Assistant>), ApiError> {
    let input = AssistantInput {
        assistant_id: body.assistant_id,
        name: Some(body.name),
        description: body.description,
        config: body.config,
        locked: body.locked,
    };
    let created = state.cases.create_assistant(&tenant, input).await?;
    Ok((StatusCode::CREATED, AppJson(created)))
}

/// List the tenant's assistants, newest first, each showing its current version.
#[utoipa::path(get, path = "/v1/assistants", tag = "assistants", params(PageParams),
    responses((status = 200, description = "A page of assistants", body = Page<Assistant>)))]
pub async fn list_assistants(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppQuery(params): AppQuery<PageParams>,
) -> Result<AppJson<Page<Assistant>>, ApiError> {
    let limit = page_limit(params.limit)?;
    // Assistant ids have the thread ids' alphabet.
    let cursor = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::ThreadId))
        .transpose()?;
    let items = state
        .cases
        .list_assistants(&tenant, limit + 1, cursor.as_ref())
        .await?;
    Ok(AppJson(Page::from_overfetch(items, limit, |a| {
        encode_cursor(a.created_at, a.assistant_id.as_str())
    })))
}

/// Read an assistant: its current version, or the one `version` names.
#[utoipa::path(get, path = "/v1/assistants/{assistantId}", tag = "assistants",
    params(("assistantId" = String, Path, description = "Assistant id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), AssistantVersionParams),
    responses(
        (status = 200, description = "The assistant", body = Assistant),
        (status = 404, description = "No such assistant (`assistant_not_found`) or version (`assistant_version_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_assistant(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
    AppQuery(params): AppQuery<AssistantVersionParams>,
) -> Result<AppJson<Assistant>, ApiError> {
    if params.version.is_some_and(|v| v < 1) {
        return Err(ApiError::validation("version must be 1 or more".into()));
    }
    let id = parse_id(&id)?;
    Ok(AppJson(
        state
            .cases
            .get_assistant(&tenant, &id, params.version)
            .await?,
    ))
}

/// Add a version to an assistant and make it current. Past `PES_ASSISTANT_MAX_VERSIONS`
/// versions, the oldest are deleted, except the current one and those active runs use.
#[utoipa::path(put, path = "/v1/assistants/{assistantId}", tag = "assistants", request_body = UpdateAssistant,
    params(("assistantId" = String, Path, description = "Assistant id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 200, description = "The assistant, showing its new version", body = Assistant),
        (status = 404, description = "No such assistant (`assistant_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The version is not valid (`validation_failed`): `errors` names every bad field as `{path, message}`", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn put_assistant(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
    AppJson(body): AppJson<UpdateAssistant>,
) -> Result<AppJson<Assistant>, ApiError> {
    let id = parse_id(&id)?;
    let input = AssistantInput {
        assistant_id: None,
        name: body.name,
        description: body.description,
        config: body.config,
        locked: body.locked,
    };
    Ok(AppJson(
        state.cases.update_assistant(&tenant, &id, input).await?,
    ))
}

/// Delete an assistant. Runs already enqueued with it finish; new runs naming it, and runs of
/// threads that use it, are refused (422 `assistant_not_found`).
#[utoipa::path(delete, path = "/v1/assistants/{assistantId}", tag = "assistants",
    params(("assistantId" = String, Path, description = "Assistant id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such assistant (`assistant_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn delete_assistant(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&id)?;
    state.cases.delete_assistant(&tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List an assistant's versions (those kept), newest first.
#[utoipa::path(get, path = "/v1/assistants/{assistantId}/versions", tag = "assistants",
    params(("assistantId" = String, Path, description = "Assistant id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), PageParams),
    responses(
        (status = 200, description = "A page of versions", body = Page<AssistantVersion>),
        (status = 404, description = "No such assistant (`assistant_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_versions(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
    AppQuery(params): AppQuery<PageParams>,
) -> Result<AppJson<Page<AssistantVersion>>, ApiError> {
    let id = parse_id(&id)?;
    let limit = page_limit(params.limit)?;
    // The cursor's id is the last version shown.
    let before = match params.cursor.as_deref() {
        Some(c) => Some(
            decode_cursor(c, CursorKey::ThreadId)?
                .id
                .parse::<i64>()
                .map_err(|_| ApiError::validation("invalid cursor".into()))?,
        ),
        None => None,
    };
    let items = state
        .cases
        .list_assistant_versions(&tenant, &id, limit + 1, before)
        .await?;
    Ok(AppJson(Page::from_overfetch(items, limit, |v| {
        encode_cursor(v.created_at, &v.version.to_string())
    })))
}

/// Choose the version that runs: roll back or forward. Runs enqueued from now on (on threads
/// that pin no version) use it; runs already enqueued keep theirs.
#[utoipa::path(post, path = "/v1/assistants/{assistantId}/current", tag = "assistants", request_body = SetCurrentVersion,
    params(("assistantId" = String, Path, description = "Assistant id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 200, description = "The assistant, showing the version now current", body = Assistant),
        (status = 404, description = "No such assistant (`assistant_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The assistant keeps no such version (`assistant_version_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn set_current(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
    AppJson(body): AppJson<SetCurrentVersion>,
) -> Result<AppJson<Assistant>, ApiError> {
    let id = parse_id(&id)?;
    Ok(AppJson(
        state
            .cases
            .set_current_assistant_version(&tenant, &id, body.version)
            .await?,
    ))
}
