//! The tenant's flowchart registry and the tool catalogue it joins: registering a flowchart (a
//! name of its own, checked whole against the tools and the tenant's other flowcharts, every
//! problem answered at once with its JSON Pointer), reading, listing and deleting one; and the
//! catalogue of every tool a thread may enable (the operator's tools and the tenant's
//! flowcharts).

use std::collections::BTreeMap;

use serde_json::Value;

use super::UseCases;
use crate::flowchart::validate::{self, ValidationEnv};
use crate::flowchart::{FlowchartRecord, FlowchartSpec};
use crate::problem::{FieldError, Refusal};
use crate::store::StoreResult;
use crate::tools::{ServerInfo, ToolInfo};

/// A flowchart registered: its record, and whether the name was new.
#[derive(Debug, Clone)]
pub struct Registered {
    pub record: FlowchartRecord,
    /// The name was new (or its flowchart had been deleted); otherwise a new version.
    pub created: bool,
}

/// 404 `flowchart_not_found`.
pub fn flowchart_not_found() -> Refusal {
    Refusal::NotFound {
        code: "flowchart_not_found",
        detail: "flowchart not found".into(),
    }
}

/// 422 `validation_failed` naming every problem of a flowchart at its JSON Pointer.
fn invalid(problems: Vec<validate::Problem>) -> Refusal {
    let detail = format!(
        "the flowchart is not valid: {}",
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    );
    let errors = problems
        .into_iter()
        .map(|p| FieldError {
            path: p.path,
            message: p.message,
        })
        .collect();
    Refusal::InvalidFields { detail, errors }
}

impl UseCases {
    /// Register a flowchart under `name`, or a new version of it: the spec checked whole (its
    /// stages, expressions and the tools and flowcharts it calls), and the name not a tool's.
    ///
    /// # Errors
    /// 422 `validation_failed` naming every problem; 409 `tool_exists`; 429 over the tenant's
    /// flowchart quota.
    pub async fn register_flowchart(
        &self,
        tenant: &str,
        name: &str,
        body: &Value,
    ) -> Result<Registered, Refusal> {
        let spec = validate::parse_spec(body).map_err(|p| invalid(vec![p]))?;
        let tools = self.engine.tools();
        if tools.is_known(name) {
            return Err(Refusal::Conflict {
                code: "tool_exists",
                detail: format!(
                    "`{name}` is the name of a tool: a flowchart needs a name of its own"
                ),
            });
        }
        let flowcharts: BTreeMap<String, FlowchartSpec> = self
            .store
            .list_flowcharts(tenant)
            .await?
            .into_iter()
            .map(|r| (r.name, r.spec))
            .collect();
        let is_tool = |n: &str| tools.is_known(n);
        let env = ValidationEnv {
            is_tool: &is_tool,
            flowcharts: &flowcharts,
        };
        validate::validate(name, &spec, &env).map_err(invalid)?;
        let put = self.store.put_flowchart(tenant, name, &spec).await?;
        Ok(Registered {
            record: put.record,
            created: put.created,
        })
    }

    /// The latest version of each of the tenant's flowcharts, sorted by name.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_flowcharts(&self, tenant: &str) -> StoreResult<Vec<FlowchartRecord>> {
        self.store.list_flowcharts(tenant).await
    }

    /// A flowchart: its latest version, or the one `version` names.
    ///
    /// # Errors
    /// 422 for a version below 1, 404 `flowchart_not_found`.
    pub async fn flowchart(
        &self,
        tenant: &str,
        name: &str,
        version: Option<i64>,
    ) -> Result<FlowchartRecord, Refusal> {
        if version.is_some_and(|v| v < 1) {
            return Err(Refusal::Validation("version must be 1 or more".into()));
        }
        self.store
            .get_flowchart(tenant, name, version, false)
            .await?
            .ok_or_else(flowchart_not_found)
    }

    /// Delete a flowchart (every version): no longer listed nor offered to new calls, while a
    /// call in progress finishes on its version.
    ///
    /// # Errors
    /// 404 `flowchart_not_found`.
    pub async fn delete_flowchart(&self, tenant: &str, name: &str) -> Result<(), Refusal> {
        if self.store.delete_flowchart(tenant, name).await? {
            Ok(())
        } else {
            Err(flowchart_not_found())
        }
    }

    /// Every tool a thread of the tenant may enable, sorted by name (what each call kind offers:
    /// the operator's tools, the same for every tenant, delegation to remote agents, and the
    /// tenant's flowcharts), and the tool servers the operator configured with their state.
    ///
    /// # Errors
    /// The store fails.
    pub async fn tool_catalogue(
        &self,
        tenant: &str,
    ) -> StoreResult<(Vec<ToolInfo>, Vec<ServerInfo>)> {
        let flowcharts = self.store.list_flowcharts(tenant).await?;
        let items = self.engine.tool_catalogue(&flowcharts);
        Ok((items, self.engine.tools().servers()))
    }

    /// The operator's tools (no tenant's flowcharts), sorted by name: what the service's public
    /// agent card lists.
    pub fn operator_tools(&self) -> Vec<ToolInfo> {
        self.engine.tool_catalogue(&[])
    }
}
