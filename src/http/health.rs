//! Liveness, readiness and Prometheus metrics; plus the OpenAPI entries of the routes the
//! documentation UI serves itself (`/openapi.json`, `/docs`).

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::warn;
use utoipa::ToSchema;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::{ContentBuilder, ResponseBuilder};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppJson, AppState, Problem};
use crate::telemetry::metrics::Levels;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

/// Health answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// `postgres` or `sqlite` (readiness only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> AppJson<Health> {
    AppJson(Health {
        status: "ok".into(),
        store: None,
    })
}

/// Readiness: the store is reachable and migrated.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn readyz(State(state): State<AppState>) -> Result<AppJson<Health>, ApiError> {
    state
        .cases
        .ready()
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    Ok(AppJson(Health {
        status: "ok".into(),
        store: Some(state.cases.backend().into()),
    }))
}

/// How long a scrape waits for the store's counts before it answers without them.
const BACKLOG_TIMEOUT: Duration = Duration::from_secs(2);

/// Prometheus text-format metrics (the list is in the book, docs/src/operations/metrics.md). The gauges of what waits (queued
/// runs, pending suspensions) are read from the store now; should it not answer within two
/// seconds, they keep their last value.
///
/// Open unless `PES_METRICS_KEY` is set; then it needs `Authorization: Bearer <that key>` (the API
/// keys of tenants do not open it: it describes the whole service).
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses(
        (status = 200, description = "Metrics", content_type = "text/plain", body = String),
        (status = 401, description = "`PES_METRICS_KEY` is set and the request does not carry it as `Authorization: Bearer <key>` (`unauthorized`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(key) = state
        .config
        .metrics_key
        .as_deref()
        .filter(|k| !k.is_empty())
    {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::Unauthorized.into_response();
        }
    }
    let backlog = match tokio::time::timeout(BACKLOG_TIMEOUT, state.cases.backlog()).await {
        Ok(Ok(b)) => Some(b),
        Ok(Err(e)) => {
            warn!(error = %e, "/metrics: the store's counts could not be read");
            None
        }
        Err(_) => {
            warn!("/metrics: the store's counts took too long");
            None
        }
    };
    let busy = state.cases.busy();
    state.metrics.set_levels(Levels {
        runs_in_flight: busy.runs_in_flight,
        stream_subscribers: busy.stream_subscribers,
        streamed_threads: busy.streamed_threads,
        token_remote_threads: busy.token_remote_threads,
        runs_queued: backlog.map(|b| b.queued_runs),
        suspensions_pending: backlog.map(|b| b.pending_suspensions),
    });
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// Compare two secrets in time that depends on their lengths only, not on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Add `/openapi.json` and `/docs`, which the documentation UI serves, to the document.
pub fn document_extra_routes(api: &mut utoipa::openapi::OpenApi) {
    let op = |summary: &str, content_type: &str| {
        OperationBuilder::new()
            .summary(Some(summary))
            .tag("health")
            .security(utoipa::openapi::security::SecurityRequirement::default())
            .response(
                "200",
                ResponseBuilder::new()
                    .description(summary)
                    .content(content_type, ContentBuilder::new().build())
                    .build(),
            )
            .build()
    };
    api.paths.paths.insert(
        "/openapi.json".into(),
        PathItem::new(
            HttpMethod::Get,
            op("This OpenAPI document", "application/json"),
        ),
    );
    api.paths.paths.insert(
        "/docs".into(),
        PathItem::new(
            HttpMethod::Get,
            op("Browsable API documentation", "text/html"),
        ),
    );
}
