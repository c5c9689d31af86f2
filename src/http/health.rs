//! Liveness, readiness and Prometheus metrics; plus the OpenAPI entries of the routes the
//! documentation UI serves itself (`/openapi.json`, `/docs`).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::{ContentBuilder, ResponseBuilder};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppJson, AppState, Problem};

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
    if state.shutdown.is_cancelled() {
        return Err(ApiError::Unavailable("shutting down".into()));
    }
    state
        .store
        .ready()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(AppJson(Health {
        status: "ok".into(),
        store: Some(state.store.backend().into()),
    }))
}

/// Prometheus text-format metrics.
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Metrics", content_type = "text/plain", body = String)))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let m = &state.metrics;
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    };
    counter(
        "pes_runs_claimed_total",
        "Runs claimed by this process.",
        m.runs_claimed.load(Ordering::Relaxed),
    );
    counter(
        "pes_runs_completed_total",
        "Runs completed here.",
        m.runs_completed.load(Ordering::Relaxed),
    );
    counter(
        "pes_runs_failed_total",
        "Runs failed here.",
        m.runs_failed.load(Ordering::Relaxed),
    );
    counter(
        "pes_runs_cancelled_total",
        "Runs cancelled here.",
        m.runs_cancelled.load(Ordering::Relaxed),
    );
    counter(
        "pes_runs_suspended_total",
        "Runs suspended here.",
        m.runs_suspended.load(Ordering::Relaxed),
    );
    counter(
        "pes_runs_released_total",
        "Runs released, lost or stopped here.",
        m.runs_released.load(Ordering::Relaxed),
    );
    counter(
        "pes_leases_lost_total",
        "Leases lost to another worker.",
        m.leases_lost.load(Ordering::Relaxed),
    );
    counter(
        "pes_commits_total",
        "Run state commits.",
        m.commits.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP pes_runs_in_flight Runs this process drives now.\n# TYPE pes_runs_in_flight gauge\npes_runs_in_flight {}",
        state.commands.runs().len()
    );
    let _ = writeln!(
        out,
        "# HELP pes_streamed_threads Threads with a live SSE subscriber here.\n# TYPE pes_streamed_threads gauge\npes_streamed_threads {}",
        state.bus.subscribed_threads()
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
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
