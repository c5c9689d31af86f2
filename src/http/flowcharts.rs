//! The flowchart registry: `PUT/GET/DELETE /v1/flowcharts/{name}` and `GET /v1/flowcharts`, per
//! tenant; and running one directly, `POST /v1/flowcharts/{name}/runs` (a run of `kind:
//! "flowchart"`, see [`crate::commands::UseCases::run_flowchart`]). A PUT is checked whole before
//! anything is stored (every problem answered at once, each with its JSON Pointer) and makes a new
//! version; a delete hides the flowchart from the API and from new calls, while the engine still
//! finds the version a call in progress was pinned to.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppJson, AppPath, AppQuery, AppState, Problem, Tenant};
use crate::commands::{FlowchartRunRequest, flowchart_not_found};
use crate::flowchart::validate;
use crate::flowchart::{FlowchartRecord, FlowchartSpec};
use crate::model::{MultitaskStrategy, Run};
use crate::problem::Refusal;
use crate::telemetry::TraceContext;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_flowcharts))
        .routes(routes!(put_flowchart, get_flowchart, delete_flowchart))
        .routes(routes!(run_flowchart))
}

/// Body of `POST /v1/flowcharts/{name}/runs`. Unknown fields are refused (422).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"input": {"amount": 40, "tier": "gold"}}))]
pub struct CreateFlowchartRun {
    /// The flowchart's input: a JSON object that fits its `inputSchema` (its `args`).
    #[schema(value_type = Object)]
    pub input: Value,
    /// The thread to run on (it must exist; the run is enqueued on it like any run); a new
    /// thread when absent (counted against `PES_TENANT_MAX_THREADS`).
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub thread_id: Option<String>,
    /// What to do while another run of the thread is active: `enqueue` (the default), `reject`
    /// or `interrupt` (`steer` is refused: a flowchart run takes no steering).
    #[serde(default)]
    pub multitask_strategy: Option<MultitaskStrategy>,
}

/// The tenant's flowcharts.
#[derive(Debug, Serialize, ToSchema)]
pub struct FlowchartList {
    /// The latest version of each, sorted by name.
    pub items: Vec<FlowchartRecord>,
}

/// Which version to read (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct VersionParams {
    /// A version number (1 and up); the latest when absent.
    #[param(minimum = 1, nullable = false)]
    pub version: Option<i64>,
}

fn not_found() -> Refusal {
    flowchart_not_found()
}

/// A flowchart name from the path; one that cannot exist is simply not found.
fn parse_name(raw: &str) -> Result<&str, Refusal> {
    if validate::is_tool_name(raw) {
        Ok(raw)
    } else {
        Err(not_found())
    }
}

/// Register a flowchart, or a new version of it.
#[utoipa::path(put, path = "/v1/flowcharts/{name}", tag = "flowcharts", request_body = FlowchartSpec,
    params(("name" = String, Path, description = "The flowchart's tool name: 1–64 characters of `A-Za-z0-9_-`", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "A new version of a flowchart that exists", body = FlowchartRecord),
        (status = 201, description = "Registered: the name was new (or its flowchart deleted)", body = FlowchartRecord),
        (status = 409, description = "The name is a tool's (`tool_exists`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The flowchart is not valid (`validation_failed`): `detail` lists every problem as `<JSON Pointer>: <message>`, and `errors` holds them as `{path, message}`", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn put_flowchart(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(name): AppPath<String>,
    AppJson(body): AppJson<Value>,
) -> Result<(StatusCode, AppJson<FlowchartRecord>), ApiError> {
    let put = state
        .cases
        .register_flowchart(&tenant, &name, &body)
        .await?;
    let status = if put.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, AppJson(put.record)))
}

/// List the tenant's flowcharts (the latest version of each).
#[utoipa::path(get, path = "/v1/flowcharts", tag = "flowcharts",
    responses((status = 200, description = "The flowcharts", body = FlowchartList)))]
pub async fn list_flowcharts(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<AppJson<FlowchartList>, ApiError> {
    let items = state.cases.list_flowcharts(&tenant).await?;
    Ok(AppJson(FlowchartList { items }))
}

/// Read a flowchart: its latest version, or the one `version` names.
#[utoipa::path(get, path = "/v1/flowcharts/{name}", tag = "flowcharts",
    params(("name" = String, Path, description = "The flowchart's tool name: 1–64 characters of `A-Za-z0-9_-` (any other name is not found)", pattern = "^[A-Za-z0-9_-]{1,64}$"), VersionParams),
    responses(
        (status = 200, description = "The flowchart", body = FlowchartRecord),
        (status = 404, description = "No such flowchart or version (`flowchart_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_flowchart(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(name): AppPath<String>,
    AppQuery(params): AppQuery<VersionParams>,
) -> Result<AppJson<FlowchartRecord>, ApiError> {
    if params.version.is_some_and(|v| v < 1) {
        return Err(ApiError::validation("version must be 1 or more".into()));
    }
    let name = parse_name(&name)?;
    let record = state.cases.flowchart(&tenant, name, params.version).await?;
    Ok(AppJson(record))
}

/// Delete a flowchart (every version): it is no longer listed nor offered to new calls, while a
/// call in progress finishes on its version. A PUT of the name registers it again, numbering on
/// from the last version.
#[utoipa::path(delete, path = "/v1/flowcharts/{name}", tag = "flowcharts",
    params(("name" = String, Path, description = "The flowchart's tool name: 1–64 characters of `A-Za-z0-9_-` (any other name is not found)", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such flowchart (`flowchart_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn delete_flowchart(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(name): AppPath<String>,
) -> Result<StatusCode, ApiError> {
    let name = parse_name(&name)?;
    state.cases.delete_flowchart(&tenant, name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Run a flowchart: a durable run of `kind: "flowchart"` that runs it with `input` (no model
/// planning or synthesis: no model call unless the flowchart has `llm` stages). Its stages are
/// `FLOWCHART_STEP` observations, a stage (or the flowchart) that needs a person suspends it as
/// any run, and its output is the run's `finalResponse.output` (and, as text, `response`).
#[utoipa::path(post, path = "/v1/flowcharts/{name}/runs", tag = "flowcharts",
    request_body = CreateFlowchartRun,
    params(("name" = String, Path, description = "The flowchart's tool name: 1–64 characters of `A-Za-z0-9_-` (any other name is not found)", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 202, description = "Enqueued: the run (`kind: \"flowchart\"`), on its thread", body = Run),
        (status = 404, description = "No such flowchart (`flowchart_not_found`) or thread (`thread_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another run of the thread is active and multitaskStrategy is `reject`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The input does not fit the flowchart's inputSchema (`validation_failed`: `errors` names each problem at its JSON Pointer under `/input`), another field is invalid, or the thread's `tools` leave the flowchart out (`tool_not_enabled`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn run_flowchart(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(name): AppPath<String>,
    headers: HeaderMap,
    AppJson(body): AppJson<CreateFlowchartRun>,
) -> Result<(StatusCode, AppJson<Run>), ApiError> {
    let name = parse_name(&name)?.to_owned();
    let thread_id = body
        .thread_id
        .as_deref()
        .map(super::parse_thread_id)
        .transpose()?;
    let request = FlowchartRunRequest {
        name,
        input: body.input,
        thread_id,
        strategy: body.multitask_strategy,
        trace: TraceContext::for_run(&headers),
    };
    let (run, _) = state.cases.run_flowchart(tenant, request).await?;
    Ok((StatusCode::ACCEPTED, AppJson(run)))
}
