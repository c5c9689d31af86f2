//! Suspensions: the pauses of a run that wait for a person. Listing, reading, and resuming by
//! `suspensionId` — exactly once: the store's compare-and-set lets one of any number of
//! concurrent resumes through and answers the others 409.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::error::RaiseJson;
use super::page::Page;
use super::runs::wants_event_stream;
use super::sse::{RunStreamParams, observation_sse};
use super::{ApiError, AppJson, AppPath, AppQuery, AppState, Problem, Tenant, parse_thread_id};
use crate::commands::DecisionRequest;
use crate::commands::StreamSpec;
use crate::model::{Decision, RaiseBy, RaiseRequest, ResumeDecision, Run, Suspension};
use crate::telemetry::TraceContext;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_suspensions))
        .routes(routes!(get_suspension))
        .routes(routes!(resume_suspension))
}

/// Which suspensions the list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SuspensionFilter {
    /// Only those waiting for a person (the default).
    Pending,
    /// Every suspension of the thread, whatever its status.
    All,
}

/// Filter of the suspension list (query string). Unknown parameters or values are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SuspensionParams {
    /// `pending` (default) or `all`.
    #[param(inline, nullable = false)]
    pub status: Option<SuspensionFilter>,
}

/// Pending suspensions of a thread (all of them with `status=all`), oldest first.
#[utoipa::path(get, path = "/v1/threads/{threadId}/suspensions", tag = "suspensions",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$"), SuspensionParams),
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
    let all = params.status == Some(SuspensionFilter::All);
    let items = state
        .cases
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
    params(("suspensionId" = String, Path, description = "Suspension id (a UUID; any other id is not found)")),
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
        .cases
        .get_suspension(&tenant, id)
        .await?
        .ok_or_else(ApiError::suspension_not_found)?;
    Ok(AppJson(s))
}

/// Body of `POST /v1/suspensions/{suspensionId}/resume`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"decision": "reject", "reason": "Not this one."}))]
pub struct ResumeRequest {
    /// `approve` (run the call as proposed), `edit` (run it with `modifiedArgs`), `reject` (do not
    /// run it; the model is told why), `respond` (do not run it; `response` is its result).
    pub decision: Decision,
    /// Why (given to the model on `reject`); at most 4,000 characters.
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub reason: Option<String>,
    /// The arguments to run the call with (`edit`), valid for the tool's schema.
    #[serde(default)]
    pub modified_args: Option<Value>,
    /// The call's result (`respond`), valid for the suspension's `inputSchema` when it has one.
    #[serde(default)]
    pub response: Option<Value>,
    /// What `approve` adds to the run's budget: required on a `budget` suspension, refused on any
    /// other; its numbers are checked by the use case (422 `invalid_raise`).
    #[serde(default)]
    #[schema(value_type = Option<RaiseBy>)]
    pub raise_by: Option<RaiseRequest>,
}

/// Body of `POST /v1/suspensions/{suspensionId}/resume`: a `decision` with the fields it takes
/// (`modifiedArgs` for `edit`, `response` for `respond`) and an optional `reason`.
// The resume body as the document states it: one shape per decision, with the rules
// `UseCases::decide` enforces on a `ResumeRequest`, so that a client generated from the
// document builds exactly one of them. A description, never built: the body is read as a
// `ResumeRequest`.
#[allow(dead_code)]
#[derive(serde::Serialize, ToSchema)]
#[serde(tag = "decision", rename_all = "lowercase", deny_unknown_fields)]
#[schema(as = ResumeRequest, example = json!({"decision": "reject", "reason": "Not this one."}))]
enum ResumeRequestSchema {
    /// Run the call as the model proposed it (a `budget` suspension: go on, with the budget
    /// raised by `raiseBy`, which it needs).
    Approve {
        /// Why; at most 4,000 characters.
        #[serde(default)]
        #[schema(max_length = 4000)]
        reason: Option<String>,
        /// What the run's budget gains (`budget` suspensions only).
        #[serde(default, rename = "raiseBy")]
        raise_by: Option<RaiseBy>,
    },
    /// Run the call with `modifiedArgs` instead.
    Edit {
        /// The arguments to run the call with, valid for the tool's schema.
        #[serde(rename = "modifiedArgs")]
        modified_args: Value,
        /// Why; at most 4,000 characters.
        #[serde(default)]
        #[schema(max_length = 4000)]
        reason: Option<String>,
    },
    /// Do not run the call; the model is told why.
    Reject {
        /// Why (given to the model); at most 4,000 characters.
        #[serde(default)]
        #[schema(max_length = 4000)]
        reason: Option<String>,
    },
    /// Do not run the call; `response` is its result.
    Respond {
        /// The call's result, valid for the suspension's `inputSchema` when it has one.
        response: Value,
        /// Why; at most 4,000 characters.
        #[serde(default)]
        #[schema(max_length = 4000)]
        reason: Option<String>,
    },
}

/// Check a resume request against its suspension (see [`crate::commands::UseCases::decide`]).
fn decide(
    state: &AppState,
    s: &Suspension,
    body: ResumeRequest,
) -> Result<ResumeDecision, ApiError> {
    Ok(state.cases.decide(
        s,
        DecisionRequest {
            decision: body.decision,
            reason: body.reason,
            modified_args: body.modified_args,
            response: body.response,
            raise_by: body.raise_by,
        },
    )?)
}

/// Resume a suspended run with a person's decision. The decision becomes the suspended tool
/// call's result and the run continues from where it stopped. With `Accept: text/event-stream`
/// the response streams the run's observations until it ends or suspends again.
#[utoipa::path(post, path = "/v1/suspensions/{suspensionId}/resume", tag = "suspensions",
    request_body = ResumeRequestSchema,
    params(("suspensionId" = String, Path, description = "Suspension id (a UUID; any other id is not found)"), RunStreamParams),
    responses(
        (status = 202, description = "Resumed: the run is queued again", body = Run),
        (status = 200, description = "With `Accept: text/event-stream`: resumed, and the run's observations as Server-Sent Events until it ends or suspends again", content_type = "text/event-stream", body = String),
        (status = 404, description = "No such suspension", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already resolved, expired or cancelled", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A body the route does not take (`validation_failed`), a decision the suspension does not allow (`decision_not_allowed`), or arguments/response that do not fit (`validation_failed`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn resume_suspension(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(suspension_id): AppPath<String>,
    AppQuery(params): AppQuery<RunStreamParams>,
    headers: HeaderMap,
    RaiseJson(body): RaiseJson<ResumeRequest>,
) -> Result<Response, ApiError> {
    let id = Uuid::parse_str(&suspension_id).map_err(|_| ApiError::suspension_not_found())?;
    let s = state.cases.pending_suspension(&tenant, id).await?;
    let decision = decide(&state, &s, body)?;
    let streamed = wants_event_stream(&headers);
    // Taken before the decision: a stream the quota refuses changes nothing.
    let slot = streamed.then(|| state.streams.take(&tenant)).transpose()?;
    // Subscribed before the run goes on, so its first deltas are not missed.
    let tokens = (streamed && params.tokens == Some(true))
        .then(|| state.cases.token_subscription(&tenant, &s.thread_id));
    let trace = TraceContext::for_resume(&headers).map(|t| t.to_stored());
    let done = state.cases.carry_out(&tenant, id, decision, trace).await?;
    if let Some(slot) = slot {
        let after = done
            .observations
            .last()
            .map(|o| o.seq)
            .unwrap_or(done.run.start_seq);
        let spec = StreamSpec {
            tenant,
            thread_id: done.run.thread_id.clone(),
            after,
            types: None,
            parent_id: None,
            run_id: Some(done.run.run_id),
            until_run_end: true,
        };
        return Ok(observation_sse(&state, spec, tokens, slot).into_response());
    }
    Ok((StatusCode::ACCEPTED, AppJson(done.run)).into_response())
}
