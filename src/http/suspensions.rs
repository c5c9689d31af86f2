//! Suspensions: the pauses of a run that wait for a person (listing and reading them).

use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::threads::Page;
use super::{ApiError, AppJson, AppPath, AppQuery, AppState, Problem, Tenant, parse_thread_id};
use crate::model::Suspension;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_suspensions))
        .routes(routes!(get_suspension))
}

/// Filter of the suspension list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SuspensionParams {
    /// `pending` (default) or `all`.
    pub status: Option<String>,
}

/// Pending suspensions of a thread (all of them with `status=all`), oldest first.
#[utoipa::path(get, path = "/v1/threads/{threadId}/suspensions", tag = "suspensions",
    params(("threadId" = String, Path, description = "Thread id"), SuspensionParams),
    responses(
        (status = 200, description = "The suspensions", body = Page<Suspension>),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_suspensions(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
    AppQuery(params): AppQuery<SuspensionParams>,
) -> Result<AppJson<Page<Suspension>>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let all = match params.status.as_deref() {
        None | Some("pending") => false,
        Some("all") => true,
        Some(other) => {
            return Err(ApiError::Validation(format!(
                "status must be `pending` or `all`, not `{other}`"
            )));
        }
    };
    let items = state
        .store
        .list_suspensions(&tenant, &id, all)
        .await?
        .ok_or_else(ApiError::thread_not_found)?;
    Ok(AppJson(Page {
        items,
        next_cursor: None,
    }))
}

/// Read one suspension.
#[utoipa::path(get, path = "/v1/suspensions/{suspensionId}", tag = "suspensions",
    params(("suspensionId" = String, Path, description = "Suspension id")),
    responses(
        (status = 200, description = "The suspension", body = Suspension),
        (status = 404, description = "No such suspension", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_suspension(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(suspension_id): AppPath<String>,
) -> Result<AppJson<Suspension>, ApiError> {
    let id = Uuid::parse_str(&suspension_id).map_err(|_| ApiError::suspension_not_found())?;
    let s = state
        .store
        .get_suspension(&tenant, id)
        .await?
        .ok_or_else(ApiError::suspension_not_found)?;
    Ok(AppJson(s))
}
