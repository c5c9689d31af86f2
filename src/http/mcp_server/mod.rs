//! Our MCP server at `POST /mcp`: assistants and IDEs (Claude Desktop, Cursor, VS Code…) call
//! the agent as MCP tools. Built on the official Rust SDK (`rmcp`): its streamable HTTP service,
//! stateless (no session: any replica answers any request), serves protocol revision 2026-07-28
//! (per-request metadata, `server/discover`) and the `initialize` handshake of the older
//! revisions the SDKs still send (2025-06-18, 2025-11-25). The SDK hands each request's HTTP
//! parts to the handler, so the tenant is the one the API key resolved, exactly as on `/v1`.
//!
//! Tools ([`tools`]): `ask` runs a query and answers with the final answer and the thread and
//! run ids; `resume` decides a suspension; each of the tenant's flowcharts is a tool of its own,
//! which runs the flowchart itself (a run of `kind: "flowchart"` on a new thread, through
//! [`crate::commands::UseCases::run_flowchart`]: no model call unless it has `llm` stages) and
//! answers with its output. A run that needs a person answers with its pending
//! suspensions, or with the revision's input-required round trip where the client takes it
//! ([`input`]). While a call waits, the run's observations arrive as progress notifications
//! ([`calls`]). Every call is a door onto the use cases: [`crate::commands::UseCases::enqueue`],
//! `decide`, `wait_for_run`, and [`crate::commands::RunCommands::resume`].

mod calls;
mod input;
mod tools;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use uuid::Uuid;

use super::error::refusal_parts;
use super::{AppState, Problem, Tenant};
use crate::commands::{DecisionRequest, FlowchartRunRequest, RunRequest};
use crate::model::{AgentConfig, Run, SuspensionStatus, ThreadId, new_id};
use crate::problem::Refusal;
pub use calls::OBSERVATION_META;

/// The path of the MCP endpoint.
pub const PATH: &str = "/mcp";

/// One request's handler: cheap handles, made per request by the service.
#[derive(Clone)]
pub struct McpServer {
    state: AppState,
}

/// The route: `POST /mcp` (other methods are 405 problems), behind the same API keys as `/v1`
/// (the caller layers them on).
pub fn router(state: &AppState) -> Router<AppState> {
    let config = &state.config;
    let mut server = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(false)
        .with_sse_keep_alive(Some(std::time::Duration::from_secs(
            config.sse_keepalive_seconds.max(1),
        )))
        .with_cancellation_token(state.shutdown.child_token())
        .with_max_request_body_bytes(
            usize::try_from(config.mcp_max_body_bytes).unwrap_or(usize::MAX),
        );
    // `Host` is checked in front of every door (`super::hosts`), this one included.
    server = server.disable_allowed_hosts();
    let handler = McpServer {
        state: state.clone(),
    };
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        server,
    );
    Router::new().route(
        PATH,
        axum::routing::post_service(service)
            .layer(axum::middleware::map_response(problem_for_plain_errors)),
    )
}

/// The SDK answers what it refuses before JSON-RPC (a body over the limit, a missing `Accept`,
/// a `Host` not allowed) in plain text: said again as a problem, like every other refusal of
/// this server. JSON-RPC errors stay as they are (clients read them).
async fn problem_for_plain_errors(res: Response) -> Response {
    let status = res.status();
    let plain = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.starts_with("text/plain"));
    if status.as_u16() < 400 || !plain {
        return res;
    }
    let text = axum::body::to_bytes(res.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    // Our own check already let the body through as JSON: a 415 of the SDK means the JSON is
    // not a JSON-RPC message.
    let (status, code) = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (StatusCode::BAD_REQUEST, "invalid_message"),
        other => (other, plain_code(other)),
    };
    let body = Problem {
        kind: format!("urn:pes:problem:{code}"),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status: status.as_u16(),
        detail: if text.is_empty() {
            status.to_string()
        } else {
            text
        },
        code: code.to_owned(),
        errors: None,
    };
    let mut resp = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

/// The problem code of a plain-text refusal of the SDK.
fn plain_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        _ => "bad_request",
    }
}

/// A use case's refusal as a JSON-RPC error: what the caller sent wrong is invalid params (with
/// the problem's `code` and `status` in `data`), the rest an internal error (logged).
pub fn api_error(e: Refusal) -> McpError {
    let (status, code, _) = refusal_parts(&e);
    if let Refusal::Internal(cause) = &e {
        tracing::error!(
            cause = format!("{cause:#}"),
            "internal error in an MCP call"
        );
        return McpError::internal_error("an internal error occurred; it has been logged", None);
    }
    let data = Some(json!({"code": code, "status": status.as_u16()}));
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        McpError::internal_error(e.to_string(), data)
    } else {
        McpError::invalid_params(e.to_string(), data)
    }
}

/// The tenant of the request (the API key's; the default tenant when keys are off).
fn tenant_of(ctx: &RequestContext<RoleServer>) -> String {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Tenant>())
        .map(|t| t.0.clone())
        .unwrap_or_else(|| crate::model::DEFAULT_TENANT.to_owned())
}

fn args<T: DeserializeOwned>(request: &CallToolRequestParams) -> Result<T, McpError> {
    let raw = Value::Object(request.arguments.clone().unwrap_or_default());
    crate::json::strict::from_value(&raw).map_err(|e| {
        McpError::invalid_params(format!("arguments of `{}`: {e}", request.name), None)
    })
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("pes-server", env!("CARGO_PKG_VERSION"))
                    .with_title("pes-server: durable Plan-Execute-Synthesize agents"),
            )
            .with_instructions(
                "`ask` runs a query through a durable agent that plans, uses tools and answers \
                 (pass `threadId` to follow up). When a run needs a person, the result lists its \
                 suspensions: decide each with `resume`. The tenant's flowcharts are tools too.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tenant = tenant_of(&ctx);
        let flowcharts = self
            .state
            .cases
            .list_flowcharts(&tenant)
            .await
            .map_err(|e| api_error(e.into()))?;
        let mut all = vec![tools::ask(), tools::resume()];
        all.extend(flowcharts.iter().map(tools::flowchart));
        Ok(ListToolsResult::with_all_items(all))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tenant = tenant_of(&ctx);
        // The call holds a stream slot while it waits, like any open stream of the tenant.
        let _slot = self.state.streams.take(&tenant).map_err(api_error)?;
        let name = request.name.to_string();
        if let Some(state) = request.request_state.as_deref() {
            return self.answered(&ctx, &tenant, &request, state).await;
        }
        let (run, after) = match name.as_str() {
            "ask" => {
                let a: tools::AskArgs = args(&request)?;
                let thread_id = match a.thread_id {
                    Some(t) => ThreadId::parse(&t)
                        .map_err(|e| McpError::invalid_params(format!("threadId: {e}"), None))?,
                    None => ThreadId::parse(&new_id().to_string())
                        .map_err(|_| McpError::internal_error("a thread id", None))?,
                };
                let run = self.enqueue(&tenant, thread_id, a.query, None).await?;
                let after = run.start_seq;
                (run, after)
            }
            "resume" => {
                let a: tools::ResumeArgs = args(&request)?;
                self.resume(&tenant, a).await?
            }
            tool => {
                let flowchart = tools::flowchart_name(tool);
                let run = self.flowchart(&tenant, &request, flowchart).await?;
                let after = run.start_seq;
                (run, after)
            }
        };
        self.finish(&ctx, &run, after).await
    }
}

impl McpServer {
    /// Post `query` on `thread_id` (created when missing), with `config` overrides.
    async fn enqueue(
        &self,
        tenant: &str,
        thread_id: ThreadId,
        query: String,
        config: Option<AgentConfig>,
    ) -> Result<Run, McpError> {
        let request = RunRequest {
            query,
            config: config.unwrap_or_default(),
            create_thread: true,
            trace: crate::telemetry::TraceContext::current(),
            ..RunRequest::default()
        };
        let (run, _) = self
            .state
            .cases
            .enqueue(tenant.to_owned(), thread_id, request)
            .await
            .map_err(api_error)?;
        Ok(run)
    }

    /// Run a flowchart: a run of `kind: "flowchart"` on a new thread, with the call's arguments
    /// as its input (checked against the flowchart's input schema before the run exists).
    async fn flowchart(
        &self,
        tenant: &str,
        request: &CallToolRequestParams,
        name: &str,
    ) -> Result<Run, McpError> {
        let run = FlowchartRunRequest {
            name: name.to_owned(),
            input: Value::Object(request.arguments.clone().unwrap_or_default()),
            thread_id: None,
            strategy: None,
            trace: crate::telemetry::TraceContext::current(),
        };
        match self.state.cases.run_flowchart(tenant.to_owned(), run).await {
            Ok((run, _)) => Ok(run),
            // The tool list is the tenant's flowcharts: one it does not have is no tool.
            Err(Refusal::NotFound { .. }) => Err(McpError::invalid_params(
                format!("no tool `{}`", request.name),
                None,
            )),
            Err(e) => Err(api_error(e)),
        }
    }

    /// Decide a suspension (`resume`): the run it resumed, and the `seq` its events follow.
    async fn resume(&self, tenant: &str, a: tools::ResumeArgs) -> Result<(Run, i64), McpError> {
        let not_found =
            || McpError::invalid_params(format!("no suspension `{}`", a.suspension_id), None);
        let id = Uuid::parse_str(&a.suspension_id).map_err(|_| not_found())?;
        let s = match self.state.cases.pending_suspension(tenant, id).await {
            Ok(s) => s,
            Err(Refusal::NotFound { .. }) => return Err(not_found()),
            Err(e) => return Err(api_error(e)),
        };
        let request = DecisionRequest {
            raise_by: None,
            decision: a.decision,
            reason: a.reason,
            modified_args: a.modified_args,
            response: a.response,
        };
        let mut after = None;
        let run = self.decide(tenant, &s, request, &mut after).await?;
        Ok((run, after.unwrap_or(0)))
    }

    /// Check and carry out one decision; the resumed run. `after` is set to the `seq` before
    /// the decision's observations, when it is the first.
    async fn decide(
        &self,
        tenant: &str,
        s: &crate::model::Suspension,
        request: DecisionRequest,
        after: &mut Option<i64>,
    ) -> Result<Run, McpError> {
        let decision = self.state.cases.decide(s, request).map_err(api_error)?;
        let done = self
            .state
            .cases
            .carry_out(tenant, s.suspension_id, decision, None)
            .await
            .map_err(api_error)?;
        if after.is_none() {
            *after = done.observations.first().map(|o| o.seq - 1);
        }
        Ok(done.run)
    }

    /// Wait for `run` after `after`, then answer: its result, or the input-required round
    /// trip when it needs a person and the client takes that.
    async fn finish(
        &self,
        ctx: &RequestContext<RoleServer>,
        run: &Run,
        after: i64,
    ) -> Result<CallToolResponse, McpError> {
        let Some(run) = calls::wait(&self.state, ctx, run, after).await? else {
            // The client went away: nothing to answer (the run goes on).
            return Err(McpError::internal_error("the call was cancelled", None));
        };
        if run.status == crate::model::RunStatus::Suspended && input::supported(ctx) {
            let pending = calls::pending(&self.state, &run).await?;
            if !pending.is_empty() {
                let state = json!({"threadId": run.thread_id, "runId": run.run_id});
                return Ok(CallToolResponse::InputRequired(input::ask_for(
                    &pending, &state,
                )?));
            }
        }
        let result: CallToolResult = calls::result_of(&self.state, &run).await?;
        Ok(CallToolResponse::Complete(result))
    }

    /// The retry of a call that asked for input: decide what the person answered, then wait
    /// for the run again.
    async fn answered(
        &self,
        ctx: &RequestContext<RoleServer>,
        tenant: &str,
        request: &CallToolRequestParams,
        state: &str,
    ) -> Result<CallToolResponse, McpError> {
        let bad_state =
            || McpError::invalid_params("requestState was not made by this server", None);
        let handle: input::State = serde_json::from_str(state).map_err(|_| bad_state())?;
        let thread_id = ThreadId::parse(&handle.thread_id).map_err(|_| bad_state())?;
        let run = self
            .state
            .cases
            .get_run(tenant, &thread_id, handle.run_id)
            .await
            .map_err(|e| api_error(e.into()))?
            .ok_or_else(bad_state)?;
        let mut after = None;
        let mut current = run.clone();
        for (key, answer) in request.input_responses.iter().flatten() {
            let Ok(id) = Uuid::parse_str(key) else {
                continue;
            };
            let Some(s) = self
                .state
                .cases
                .get_suspension(tenant, id)
                .await
                .map_err(|e| api_error(e.into()))?
                .filter(|s| s.run_id == run.run_id && s.status == SuspensionStatus::Pending)
            else {
                // Unknown, or decided elsewhere meanwhile: nothing to do with this answer.
                continue;
            };
            if let Some(decision) = input::decision(&s, answer)? {
                current = self.decide(tenant, &s, decision, &mut after).await?;
            }
        }
        match after {
            Some(after) => self.finish(ctx, &current, after).await,
            // Nothing decided (the person cancelled): the suspensions, named.
            None => Ok(CallToolResponse::Complete(
                calls::result_of(&self.state, &current).await?,
            )),
        }
    }
}

/// `POST /mcp` in the OpenAPI document: one JSON-RPC endpoint, answered as JSON or as
/// Server-Sent Events of JSON-RPC messages.
pub fn document_route(api: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::request_body::RequestBodyBuilder;
    use utoipa::openapi::{ContentBuilder, ObjectBuilder, Ref, ResponseBuilder, Type};
    let message = || {
        ContentBuilder::new()
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .description(Some(
                        "A JSON-RPC 2.0 message of the Model Context Protocol \
                         (https://modelcontextprotocol.io/specification/2026-07-28).",
                    ))
                    .property(
                        "jsonrpc",
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .enum_values(Some(["2.0"])),
                    )
                    .required("jsonrpc"),
            ))
            .build()
    };
    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                super::doc::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    let op = OperationBuilder::new()
        .summary(Some("The MCP server: the agent and the tenant's flowcharts as MCP tools"))
        .description(Some(
            "Model Context Protocol over streamable HTTP, stateless: revision 2026-07-28 \
             (per-request `_meta`, `server/discover`) and the `initialize` handshake of \
             2025-06-18 and 2025-11-25. Tools: `ask {query, threadId?}`, `resume {suspensionId, \
             decision, response?, modifiedArgs?, reason?}`, and each of the tenant's flowcharts. \
             A request needs `Accept: application/json, text/event-stream`; a call's progress \
             notifications (with a `progressToken`) carry the run's observations.",
        ))
        .tag("mcp")
        .request_body(Some(
            RequestBodyBuilder::new()
                .content("application/json", message())
                .required(Some(utoipa::openapi::Required::True))
                .build(),
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The JSON-RPC response, as JSON or as Server-Sent Events (`data:` one JSON-RPC message each: notifications, then the response)")
                .content("application/json", message())
                .content(super::doc::EVENT_STREAM, ContentBuilder::new().build())
                .build(),
        )
        .response(
            "202",
            ResponseBuilder::new()
                .description("A notification or response from the client, accepted")
                .build(),
        )
        .response(
            "400",
            ResponseBuilder::new()
                .description("A protocol violation (the JSON-RPC error), or a body that is not a JSON-RPC message (a problem, `invalid_message`)")
                .content("application/json", message())
                .content(
                    super::doc::PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build(),
        )
        .response(
            "404",
            ResponseBuilder::new()
                .description("A method the server does not have: the JSON-RPC error (-32601)")
                .content("application/json", message())
                .build(),
        )
        .response("403", problem("A `Host` not in `PES_ALLOWED_HOSTS` (`host_refused`), or a write from an `Origin` not allowed (`origin_refused`)"))
        .response("406", problem("`Accept` lacks `application/json` or `text/event-stream`"))
        .build();
    api.paths
        .paths
        .insert(PATH.into(), PathItem::new(HttpMethod::Post, op));
}
