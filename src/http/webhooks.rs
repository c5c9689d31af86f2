//! Webhook deliveries, per tenant: `GET /v1/webhook-deliveries` (`?runId=`,
//! `?status=`, paged) and `POST /v1/webhook-deliveries/{deliveryId}/retry`. Webhooks themselves
//! are set on runs, threads and assistants (`webhook`, `config.webhook`).

use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::page::Page;
use super::{
    ApiError, AppJson, AppPath, AppQuery, AppState, CursorKey, Problem, Tenant, decode_cursor,
    encode_cursor, page_limit,
};
use crate::model::{DeliveryStatus, WebhookDelivery};
use crate::problem::Refusal;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_deliveries))
        .routes(routes!(retry_delivery))
}

/// Which deliveries to list (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeliveryParams {
    /// Only the deliveries of this run.
    #[param(nullable = false)]
    pub run_id: Option<Uuid>,
    /// Only deliveries in this status: `pending`, `delivered` or `failed`.
    #[param(nullable = false, value_type = Option<DeliveryStatus>)]
    pub status: Option<DeliveryStatus>,
    /// Items per page: 1–200, default 50.
    #[param(minimum = 1, maximum = 200, nullable = false)]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page (opaque); a cursor this API did not make is refused
    /// (422).
    #[param(min_length = 1, nullable = false)]
    pub cursor: Option<String>,
}

/// A delivery id from the path; one that cannot exist is simply not found.
fn parse_id(raw: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(raw).map_err(|_| Refusal::NotFound {
        code: "delivery_not_found",
        detail: format!("webhook delivery `{raw}` not found"),
    })
}

/// List the tenant's webhook deliveries, newest first: each with its attempts, its last error
/// and, while pending, when it is tried next.
#[utoipa::path(get, path = "/v1/webhook-deliveries", tag = "webhooks", params(DeliveryParams),
    responses((status = 200, description = "A page of deliveries", body = Page<WebhookDelivery>)))]
pub async fn list_deliveries(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppQuery(params): AppQuery<DeliveryParams>,
) -> Result<AppJson<Page<WebhookDelivery>>, ApiError> {
    let limit = page_limit(params.limit)?;
    let cursor = params
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, CursorKey::Uuid))
        .transpose()?;
    let items = state
        .cases
        .list_deliveries(
            &tenant,
            params.run_id,
            params.status,
            limit + 1,
            cursor.as_ref(),
        )
        .await?;
    Ok(AppJson(Page::from_overfetch(items, limit, |d| {
        encode_cursor(d.created_at, &d.delivery_id.to_string())
    })))
}

/// Send a failed delivery again: it is pending at once, with a fresh round of attempts and the
/// same `webhook-id`.
#[utoipa::path(post, path = "/v1/webhook-deliveries/{deliveryId}/retry", tag = "webhooks",
    params(("deliveryId" = Uuid, Path, description = "The delivery (its `webhook-id`)")),
    responses(
        (status = 200, description = "The delivery, pending again", body = WebhookDelivery),
        (status = 404, description = "No such delivery (`delivery_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The delivery is pending or delivered, not failed (`delivery_not_failed`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn retry_delivery(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(id): AppPath<String>,
) -> Result<AppJson<WebhookDelivery>, ApiError> {
    let id = parse_id(&id)?;
    Ok(AppJson(state.cases.retry_delivery(&tenant, id).await?))
}
