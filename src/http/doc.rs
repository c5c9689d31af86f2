//! The OpenAPI 3.1 document: its root (info, tags, the bearer scheme) and the parts every
//! operation shares. Those are added here, in one pass over the finished document, so that no
//! route can forget them: the problem+json answers of the body parser (400, 408, 413, 415, 422), of
//! authentication (401 on `/v1`), of the query parser (422) and of the connection layer (414,
//! 431); `security: []` on the open routes; and the description of every Server-Sent Events
//! response. The routes themselves document only what is theirs (success bodies, 404, 409, …).
//!
//! The same pass names every schema a client generator would otherwise name itself (`unions`:
//! inline copies become `$ref`s, tagged unions get named variants and a `discriminator`) and
//! types each observation's `content` by its `type` (`observations`).
//!
//! The files: this one holds the root and the pass; `problems` the shared problem+json answers,
//! `streams` the event streams' item schemas, `unions` and `observations` the schema naming.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::{Modify, OpenApi};

use super::Problem;
use problems::{
    FORBIDDEN, HEADERS_TOO_LARGE, INVALID_BODY, INVALID_QUERY, MALFORMED_JSON, PAYLOAD_TOO_LARGE,
    QUOTA_EXCEEDED, QUOTA_ROUTES, REQUEST_TIMEOUT, SHARED, UNAUTHORIZED, UNSUPPORTED_MEDIA_TYPE,
    URI_TOO_LONG, add, shared_response,
};
use streams::{a2a_stream_content, agui_stream_content, event_stream_content, mcp_stream_content};

mod observations;
mod problems;
mod streams;
#[cfg(test)]
mod tests;
mod unions;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The A2A JSON-RPC endpoint (behind the API keys; its errors are JSON-RPC errors).
pub const A2A_PATH: &str = "/a2a";

/// Our MCP server's JSON-RPC endpoint (behind the API keys; its errors are JSON-RPC errors).
pub const MCP_PATH: &str = "/mcp";

/// The media type of the observation streams.
pub const EVENT_STREAM: &str = "text/event-stream";

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("A tenant's API key (`PES_API_KEYS`)."))
                    .build(),
            ),
        );
        components.add_security_scheme(
            super::admin::OPERATOR_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An operator key (`PES_OPERATOR_KEYS`): the `/v1/admin/*` routes only. A \
                         tenant's key there is 403 `operator_only`; an operator key on a tenant's \
                         route is 401.",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "pes-server",
        description = "Durable Plan-Execute-Synthesize agents on threads, with an SSE observation stream.\n\n\
Every error is an RFC 9457 problem (`application/problem+json`, the `Problem` schema) with a stable \
`code`. When the server has API keys (`PES_API_KEYS`), every `/v1` route needs \
`Authorization: Bearer <key>`, and so do `POST /a2a` (the A2A agent) and `POST /mcp` (the MCP \
server), whose JSON-RPC errors are JSON-RPC error objects, not problems; the agent card, health, \
metrics and documentation routes never do. The operator's routes (`/v1/admin/*`) take an operator \
key (`PES_OPERATOR_KEYS`) instead, and a tenant's key is 403 `operator_only` there. Every route but \
the probes refuses a `Host` outside `PES_ALLOWED_HOSTS` (403 `host_refused`) and a write from an \
`Origin` the service does not allow (403 `origin_refused`). `POST /v1/ag-ui` speaks AG-UI 1.0 to \
front ends.",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(Problem, crate::events::TokenDelta)),
    tags(
        (name = "threads", description = "Threads, their agent state and history"),
        (name = "runs", description = "Runs of queries on threads"),
        (name = "observations", description = "The observation log and its SSE stream"),
        (name = "suspensions", description = "Pauses for a person"),
        (name = "tools", description = "The tools threads can enable"),
        (name = "flowcharts", description = "Flowcharts: fixed procedures registered per tenant, each a tool"),
        (name = "assistants", description = "Assistants: named, versioned configurations threads and runs start from"),
        (name = "crons", description = "Crons: schedules that post a query, one run per tick across replicas"),
        (name = "webhooks", description = "Webhook deliveries: the signed announcements of runs' ends (Standard Webhooks)"),
        (name = "store", description = "The memory store: items the agent keeps across threads, per tenant, in namespaces, found by full text or by meaning"),
        (name = "a2a", description = "The A2A agent (protocol 1.0; 0.3 method names too): its card, and JSON-RPC at `/a2a`"),
        (name = "mcp", description = "The MCP server: the agent (`ask`, `resume`) and the tenant's flowcharts as Model Context Protocol tools"),
        (name = "ag-ui", description = "The agent for AG-UI 1.0 front ends (CopilotKit and others): a run as a stream of AG-UI events"),
        (name = "admin", description = "The operator's routes (an operator key, `PES_OPERATOR_KEYS`): a tenant's spend today, raising its daily budget, deciding a suspension on it"),
        (name = "health", description = "Liveness, readiness, metrics"),
        (name = "console", description = "The web console for people (an HTML page that uses this API)")
    )
)]
pub(super) struct ApiDoc;

/// Add the shared parts to every operation of `api` (see the module documentation).
pub(super) fn add_shared_parts(api: &mut Document) {
    let components = api.components.get_or_insert_with(Default::default);
    // Copies first, while `Observation` is still the struct utoipa inlined into its page.
    unions::reference_inline_copies(components);
    unions::name_tagged_unions(components);
    // Read with `deny_unknown_fields`: a resume body and a flowchart stage take no other field.
    unions::close_variants(components, "ResumeRequest");
    unions::close_variants(components, "Stage");
    observations::document(components);
    for shared in SHARED {
        components
            .responses
            .insert(shared.0.to_owned(), RefOr::T(shared_response(shared)));
    }
    for (method, path) in QUOTA_ROUTES {
        let item = api.paths.paths.get_mut(path);
        let op = item.and_then(|i| match method {
            "get" => i.get.as_mut(),
            "put" => i.put.as_mut(),
            _ => i.post.as_mut(),
        });
        if let Some(op) = op {
            add(op, QUOTA_EXCEEDED);
        }
    }
    for (path, item) in api.paths.paths.iter_mut() {
        let guarded = path.starts_with("/v1/") || path == A2A_PATH || path == MCP_PATH;
        // JSON-RPC answers a body it cannot parse as a JSON-RPC error (documented by the route):
        // no body-shape problems, but a body not declared JSON is refused before it is read.
        let json_rpc = path == A2A_PATH || path == MCP_PATH;
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        // The probes answer any `Host` (see `super::hosts`).
        let probe = matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics");
        for op in ops.into_iter().flatten() {
            if !probe {
                add(op, FORBIDDEN);
            }
            if guarded {
                add(op, UNAUTHORIZED);
            } else {
                // The open routes need no key, whatever the document's default says.
                op.security = Some(vec![]);
            }
            if json_rpc {
                for shared in [REQUEST_TIMEOUT, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE] {
                    add(op, shared);
                }
            } else if op.request_body.is_some() {
                for shared in [
                    MALFORMED_JSON,
                    REQUEST_TIMEOUT,
                    PAYLOAD_TOO_LARGE,
                    UNSUPPORTED_MEDIA_TYPE,
                    INVALID_BODY,
                ] {
                    add(op, shared);
                }
            }
            let has_query = op
                .parameters
                .iter()
                .flatten()
                .any(|p| matches!(p.parameter_in, utoipa::openapi::path::ParameterIn::Query));
            if has_query {
                add(op, INVALID_QUERY);
            }
            add(op, URI_TOO_LONG);
            add(op, HEADERS_TOO_LARGE);
            for response in op.responses.responses.values_mut() {
                if let RefOr::T(response) = response
                    && let Some(content) = response.content.get_mut(EVENT_STREAM)
                {
                    *content = if path == MCP_PATH {
                        mcp_stream_content()
                    } else if json_rpc {
                        a2a_stream_content()
                    } else if path == super::agui::PATH {
                        agui_stream_content()
                    } else {
                        event_stream_content()
                    };
                }
            }
        }
    }
}
