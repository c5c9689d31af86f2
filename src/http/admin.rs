//! The operator's routes, `/v1/admin/*`: a tenant's spend today, raising its daily budget for the
//! rest of the UTC day, and deciding a suspension on a tenant's day (any tenant's: the operator is
//! above tenants). They take the operator's keys (`PES_OPERATOR_KEYS`) and no other: a tenant's
//! key is 403 `operator_only`, no key 401. A service with no keys at all (the local, first-run
//! setup) has one person, who is both its tenant and its operator: the routes are open there.
//! Without operator keys on a service that has tenant keys, nobody is the operator: 403 to all.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::error::RaiseJson;
use super::{ApiError, AppJson, AppPath, AppState, Problem, bearer_key};
use crate::commands::DecisionRequest;
use crate::model::{Decision, RaiseBy, RaiseRequest, Run, TenantRaise, TenantSpend};
use crate::telemetry::TraceContext;

/// The name of the operator key's security scheme in the OpenAPI document.
pub const OPERATOR_SCHEME: &str = "operatorKey";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(admin_tenant_spend))
        .routes(routes!(admin_raise_tenant_budget))
        .routes(routes!(admin_resume_suspension))
}

/// Let through only the operator (see the module doc).
pub(super) async fn authenticate_operator(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if state.operator_keys.is_empty() {
        if state.api_keys.is_empty() {
            // No keys at all: the local person is the operator, as they are the tenant.
            return next.run(req).await;
        }
        return ApiError::operator_only(
            "the operator's routes need an operator key, and this service has none \
             (PES_OPERATOR_KEYS)",
        )
        .into_response();
    }
    match bearer_key(req.headers()) {
        Some(k) if state.operator_keys.contains(k) => next.run(req).await,
        Some(k) if state.api_keys.contains_key(k) => ApiError::operator_only(
            "a tenant's key cannot act for the operator: `/v1/admin/*` needs an operator key \
             (PES_OPERATOR_KEYS)",
        )
        .into_response(),
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// Today's (UTC) spend of a tenant: tokens and US dollars its runs used, its daily budget
/// (`PES_TENANT_BUDGETS`: its own entry, or `*`), the operator's raises of the day, and the limits
/// in force.
#[utoipa::path(get, path = "/v1/admin/tenants/{tenant}/spend", tag = "admin",
    security(("operatorKey" = [])),
    params(("tenant" = String, Path, description = "A tenant's name, as `PES_API_KEYS` gives it (`default` on a service without keys)")),
    responses(
        (status = 200, description = "The tenant's day", body = TenantSpend),
        (status = 403, description = "Not the operator: a tenant's key, or no operator keys configured (`operator_only`); or a refused `Host` or `Origin` (`host_refused`, `origin_refused`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A tenant the service does not serve (`tenant_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn admin_tenant_spend(
    State(state): State<AppState>,
    AppPath(tenant): AppPath<String>,
) -> Result<AppJson<TenantSpend>, ApiError> {
    Ok(AppJson(state.cases.tenant_spend(&tenant).await?))
}

/// A run a raise let go on.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumedRun {
    #[schema(value_type = String)]
    pub thread_id: crate::model::ThreadId,
    pub run_id: Uuid,
    /// Its suspension on the tenant's day, now resolved as approved.
    pub suspension_id: Uuid,
}

/// What `POST /v1/admin/tenants/{tenant}/budget-raises` did.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantRaiseResult {
    /// The raise, as stored.
    pub raise: TenantRaise,
    /// The tenant's runs that were stopped on its day and go on now.
    pub resumed: Vec<ResumedRun>,
    /// The tenant's day after the raise.
    pub spend: TenantSpend,
}

/// Raise a tenant's daily budget for the rest of the UTC day: every replica's runs of the tenant
/// see the raised limits at their next read of the day (within a second), and its runs stopped
/// on its day go on (their suspensions on it resolved as approved, each exactly once). Each of
/// `tokens` and `usd` is at most `PES_MAX_BUDGET_RAISE_TOKENS` / `PES_MAX_BUDGET_RAISE_USD`.
#[utoipa::path(post, path = "/v1/admin/tenants/{tenant}/budget-raises", tag = "admin",
    security(("operatorKey" = [])),
    request_body(content = RaiseBy, description = "What to add to the tenant's daily limits for the rest of the UTC day (at least one of `tokens` and `usd`)", example = json!({"tokens": 100000, "usd": 5})),
    params(("tenant" = String, Path, description = "A tenant's name, as `PES_API_KEYS` gives it (`default` on a service without keys)")),
    responses(
        (status = 201, description = "Raised; the runs it let go on, and the tenant's day now", body = TenantRaiseResult),
        (status = 403, description = "Not the operator: a tenant's key, or no operator keys configured (`operator_only`); or a refused `Host` or `Origin` (`host_refused`, `origin_refused`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A tenant the service does not serve (`tenant_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A raise that is missing, not a finite number, not whole (tokens), not above 0, or past its bound (`invalid_raise`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn admin_raise_tenant_budget(
    State(state): State<AppState>,
    AppPath(tenant): AppPath<String>,
    RaiseJson(body): RaiseJson<RaiseRequest>,
) -> Result<Response, ApiError> {
    let raised = state.cases.raise_tenant_budget(&tenant, &body).await?;
    let result = TenantRaiseResult {
        raise: raised.raise,
        resumed: raised
            .resumed
            .into_iter()
            .map(|r| ResumedRun {
                thread_id: r.run.thread_id,
                run_id: r.run.run_id,
                suspension_id: r.suspension.suspension_id,
            })
            .collect(),
        spend: raised.spend,
    };
    Ok((StatusCode::CREATED, AppJson(result)).into_response())
}

/// Body of `POST /v1/admin/suspensions/{suspensionId}/resume`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"decision": "approve", "raiseBy": {"tokens": 100000}}))]
pub struct OperatorResumeRequest {
    /// `approve` (with `raiseBy`: the tenant's day is raised by it, and its runs stopped on the
    /// day go on) or `reject` (the run fails `budget_exceeded`).
    pub decision: Decision,
    /// Why; at most 4,000 characters.
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub reason: Option<String>,
    /// What `approve` adds to the tenant's daily limits for the rest of the UTC day.
    #[serde(default)]
    #[schema(value_type = Option<RaiseBy>)]
    pub raise_by: Option<RaiseRequest>,
}

/// Decide a suspension on a tenant's daily budget (`kind: "budget"`, `scope: "tenant"`), whatever
/// the tenant: `approve` with `raiseBy` raises the tenant's day for the rest of the UTC day (in
/// the same transaction, so exactly once) and lets this run and the tenant's other runs stopped
/// on its day go on; `reject` fails the run. Other suspensions are their tenant's to decide.
#[utoipa::path(post, path = "/v1/admin/suspensions/{suspensionId}/resume", tag = "admin",
    security(("operatorKey" = [])),
    request_body = OperatorResumeRequest,
    params(("suspensionId" = String, Path, description = "Suspension id (a UUID; any other id is not found)")),
    responses(
        (status = 202, description = "Decided: the run is queued again", body = Run),
        (status = 403, description = "Not the operator: a tenant's key, or no operator keys configured (`operator_only`); or a refused `Host` or `Origin` (`host_refused`, `origin_refused`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such suspension", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already resolved, expired or cancelled", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a suspension on a tenant's day (`not_on_tenant_budget`), a decision it does not take (`decision_not_allowed`), or a raise that is missing, not finite or past its bound (`invalid_raise`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn admin_resume_suspension(
    State(state): State<AppState>,
    AppPath(suspension_id): AppPath<String>,
    headers: HeaderMap,
    RaiseJson(body): RaiseJson<OperatorResumeRequest>,
) -> Result<Response, ApiError> {
    let id = Uuid::parse_str(&suspension_id).map_err(|_| ApiError::suspension_not_found())?;
    let request = DecisionRequest {
        decision: body.decision,
        reason: body.reason,
        modified_args: None,
        response: None,
        raise_by: body.raise_by,
    };
    let trace = TraceContext::for_resume(&headers).map(|t| t.to_stored());
    let done = state.cases.operator_resume(id, request, trace).await?;
    Ok((StatusCode::ACCEPTED, AppJson::<Run>(done.run)).into_response())
}
