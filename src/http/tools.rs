//! The tool catalogue: `GET /v1/tools`, every tool a thread may enable (built-in, MCP, the
//! caller's tenant's flowcharts), with its argument schema, its source
//! and whether it can be called right now; and the tool servers the operator configured, with
//! their state.

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppJson, AppState, Tenant};
use crate::tools::{ServerInfo, ToolInfo};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_tools))
}

/// The tool catalogue.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCatalogue {
    /// Every tool, sorted by name.
    pub items: Vec<ToolInfo>,
    /// The tool servers the operator configured (`PES_MCP_SERVERS`), sorted by name. A server
    /// that never answered has no tools listed yet; its state says why.
    pub servers: Vec<ServerInfo>,
}

/// List every tool a thread can enable (`config.tools`, `config.requireApproval`): the tools the
/// operator configured, the same for every tenant, and the caller's tenant's flowcharts.
#[utoipa::path(get, path = "/v1/tools", tag = "tools",
    responses((status = 200, description = "The catalogue", body = ToolCatalogue)))]
pub async fn list_tools(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<AppJson<ToolCatalogue>, ApiError> {
    let (items, servers) = state.cases.tool_catalogue(&tenant).await?;
    Ok(AppJson(ToolCatalogue { items, servers }))
}
