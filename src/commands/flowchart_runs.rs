//! Running a flowchart directly: a run of `kind: "flowchart"` that runs one of the tenant's
//! flowcharts with an input, on a new thread or on one the client names (`POST
//! /v1/flowcharts/{name}/runs`, the MCP server's flowchart tools). What is checked before the run
//! exists: the flowchart (another tenant's is not found), the input against its input schema,
//! the thread (found, and the flowchart enabled by its `tools`); then it is enqueued as any run
//! is ([`UseCases::enqueue`]: the tenant's quotas, the thread's multitask rules). The engine runs
//! it without planning or synthesis (see `agent/flowchart_run.rs`).

use serde_json::Value;

use super::{RunRequest, UseCases};
use crate::flowchart::tool::FlowTool;
use crate::model::{FlowchartCall, MultitaskStrategy, Run, ThreadId, new_id};
use crate::problem::{FieldError, Refusal};
use crate::telemetry::TraceContext;

/// The most characters of a flowchart run's query (which names the flowchart and quotes its
/// input, cut): enough to recognise the run by in a list.
const QUERY_CHARS: usize = 1000;

/// A flowchart run as a door asks for it, once parsed.
#[derive(Debug, Clone)]
pub struct FlowchartRunRequest {
    /// The flowchart's name.
    pub name: String,
    /// Its input: a JSON object that fits the flowchart's `inputSchema`.
    pub input: Value,
    /// The thread to run on (it must exist); a new thread when `None`.
    pub thread_id: Option<ThreadId>,
    /// What to do while another run of the thread is active; default `enqueue` (`steer` is
    /// refused: a flowchart run steers nothing and takes no steering).
    pub strategy: Option<MultitaskStrategy>,
    /// The trace the run's spans continue.
    pub trace: Option<TraceContext>,
}

fn flowchart_not_found(name: &str) -> Refusal {
    Refusal::NotFound {
        code: "flowchart_not_found",
        detail: format!("flowchart `{name}` not found"),
    }
}

/// What does not fit the input schema, each problem at its JSON Pointer under `/input`.
fn invalid_input(name: &str, problems: Vec<String>) -> Refusal {
    let errors: Vec<FieldError> = problems
        .iter()
        .map(|p| {
            let (at, message) = p.split_once(": ").unwrap_or(("/", p.as_str()));
            FieldError {
                path: format!("/input{}", at.trim_end_matches('/')),
                message: message.to_owned(),
            }
        })
        .collect();
    let detail = format!(
        "input does not fit the inputSchema of flowchart `{name}`: {}",
        errors
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Refusal::InvalidFields { detail, errors }
}

impl UseCases {
    /// Enqueue a run of the flowchart `request.name` with `request.input`: the run, and whether
    /// it is new (a new thread's run always is).
    ///
    /// # Errors
    /// 404 `flowchart_not_found` (another tenant's included) or `thread_not_found`; 422
    /// `validation_failed` naming each part of the input that does not fit the flowchart's
    /// input schema, or a `steer` strategy; 422 `tool_not_enabled` when the thread's `tools`
    /// leave the flowchart out; then as [`UseCases::enqueue`] (429 `quota_exceeded` for threads
    /// or active runs, 409 for a busy thread with `reject`).
    pub async fn run_flowchart(
        &self,
        tenant: String,
        request: FlowchartRunRequest,
    ) -> Result<(Run, bool), Refusal> {
        let name = request.name;
        if request.strategy == Some(MultitaskStrategy::Steer) {
            return Err(Refusal::Validation(
                "multitaskStrategy `steer` does not apply to a flowchart run: use `enqueue`, \
                 `reject` or `interrupt`"
                    .into(),
            ));
        }
        let record = self
            .store
            .get_flowchart(&tenant, &name, None, false)
            .await?
            .ok_or_else(|| flowchart_not_found(&name))?;
        let tool = FlowTool::new(record).map_err(|e| {
            Refusal::Internal(anyhow::anyhow!("flowchart `{name}` cannot be mounted: {e}"))
        })?;
        if !request.input.is_object() {
            return Err(invalid_input(
                &name,
                vec!["/: the input must be a JSON object".into()],
            ));
        }
        tool.schema
            .validate(&request.input)
            .map_err(|problems| invalid_input(&name, problems))?;
        let create_thread = request.thread_id.is_none();
        let thread_id = match request.thread_id {
            Some(id) => {
                let thread = self
                    .store
                    .get_thread(&tenant, &id)
                    .await?
                    .ok_or_else(Refusal::thread_not_found)?;
                // The engine refuses the call too (the thread's config may change meanwhile):
                // this says so before any run exists.
                if let Some(tools) = &thread.config.tools
                    && !tools.contains(&name)
                {
                    return Err(Refusal::Unprocessable {
                        code: "tool_not_enabled",
                        detail: format!(
                            "the thread's config.tools leaves out the flowchart `{name}`: add it \
                             to run it on this thread"
                        ),
                    });
                }
                id
            }
            None => ThreadId::parse(&new_id().to_string())
                .map_err(|e| Refusal::Internal(anyhow::anyhow!("a new thread id: {e}")))?,
        };
        let max = self.config.max_query_chars.clamp(2, QUERY_CHARS);
        let mut query = format!("Run the flowchart `{name}` with {}", request.input);
        if query.chars().count() > max {
            query = query.chars().take(max - 1).chain(['…']).collect();
        }
        let run = RunRequest {
            query,
            strategy: request.strategy,
            create_thread,
            trace: request.trace,
            flowchart: Some(FlowchartCall {
                name,
                input: request.input,
            }),
            ..RunRequest::default()
        };
        self.enqueue(tenant, thread_id, run).await
    }
}
