//! Steering a run: `POST /v1/threads/{threadId}/runs/{runId}/steer` commits a person's message to
//! a run that has not ended; the run reads it at its next safe point.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::runs::parse_run_id;
use super::{ApiError, AppJson, AppPath, AppState, Problem, Tenant, parse_thread_id};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(steer_run))
}

/// Body of `POST /v1/threads/{threadId}/runs/{runId}/steer`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"message": "Only look at European markets."}))]
pub struct SteerRequest {
    /// What the run should take into account from now on (1–8,000 characters).
    #[schema(min_length = 1, max_length = 8000)]
    pub message: String,
}

/// What a steer did: the message's id and the `STEERING` observation's seq.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SteerResponse {
    pub run_id: uuid::Uuid,
    /// The run's status when the message was committed: a running run reads it at its next safe
    /// point, a queued or suspended one when it goes on.
    pub status: crate::model::RunStatus,
    /// The user message the steering is in the thread's conversation.
    pub message_id: uuid::Uuid,
    /// The `seq` of its `STEERING` observation.
    pub seq: i64,
}

/// Steer a run that has not ended: the message is committed (a `STEERING` observation and a user
/// message) and reaches the run at its next safe point — every item's next model call reads it,
/// and the planner gets one refinement turn before the next item starts.
#[utoipa::path(post, path = "/v1/threads/{threadId}/runs/{runId}/steer", tag = "runs",
    request_body = SteerRequest,
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), ("runId" = String, Path, description = "Run id (a UUID; any other id is not found)")),
    responses(
        (status = 202, description = "Committed: the run reads it at its next safe point", body = SteerResponse),
        (status = 404, description = "No such thread or run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run already ended", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An empty or too long message", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn steer_run(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath((thread_id, run_id)): AppPath<(String, String)>,
    AppJson(body): AppJson<SteerRequest>,
) -> Result<(StatusCode, AppJson<SteerResponse>), ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let run_id = parse_run_id(&run_id)?;
    let steered = state
        .cases
        .steer(&tenant, &id, run_id, &body.message)
        .await?;
    let o = steered
        .observations
        .first()
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("no STEERING observation")))?;
    Ok((
        StatusCode::ACCEPTED,
        AppJson(SteerResponse {
            run_id,
            status: steered.run.status,
            message_id: o
                .payload::<crate::model::payloads::SteeringContent>()
                .map(|c| c.message_id)
                .unwrap_or_default(),
            seq: o.seq,
        }),
    ))
}
