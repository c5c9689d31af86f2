//! The HTTP API: one router per resource, assembled with its OpenAPI document by
//! [`router`] (a pure factory: no I/O, so tests can `oneshot` it). Cross-cutting pieces live here:
//! the shared [`AppState`], API-key authentication that resolves the tenant (an operator key is
//! refused there: [`admin`] has its own), the host and origin check in front of every door
//! ([`hosts`]), the problem+json fallbacks for unknown routes and methods, and page cursors.
//! [`serve`] owns the connections the router is served on (their caps and timeouts); [`console`]
//! serves the web console, outside the API keys (its data calls carry them).

pub mod a2a;
pub mod admin;
pub mod agui;
pub mod assistants;
pub mod console;
pub mod crons;
pub mod doc;
pub mod error;
pub mod flowcharts;
pub mod health;
pub mod history;
pub mod hosts;
pub mod mcp_server;
pub mod memory;
pub mod page;
pub mod quota;
pub mod retention;
pub mod runs;
pub mod serve;
pub mod sse;
pub mod steering;

pub mod suspensions;
pub mod threads;
pub mod tools;
pub mod webhooks;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::HeaderName;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::commands::PageCursor;
use crate::config::Config;
use crate::model::{DEFAULT_TENANT, ThreadId};
use crate::telemetry::metrics::Metrics;
pub use error::{ApiError, AppJson, AppPath, AppQuery, Problem};

/// Cheap, cloneable handles every handler may use.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// Fires when the service shuts down: the MCP server's sessions end with it.
    pub shutdown: CancellationToken,
    /// This instance's Prometheus series (`/metrics`).
    pub metrics: Metrics,
    /// API key → tenant; empty when authentication is off.
    pub api_keys: Arc<HashMap<String, String>>,
    /// The operator's keys (`PES_OPERATOR_KEYS`): `/v1/admin/*` only.
    pub operator_keys: Arc<HashSet<String>>,
    /// The hosts and origins every door answers (`PES_ALLOWED_HOSTS`, `PES_ALLOWED_ORIGINS`).
    pub hosts: Arc<hosts::HostPolicy>,
    /// Open event streams per tenant (`PES_TENANT_MAX_STREAMS`).
    pub streams: quota::StreamSlots,
    /// The use cases every door shares: a door reaches the store, the engine and the event bus
    /// only through them.
    pub cases: crate::commands::UseCases,
}

/// The tenant of the request, resolved from its API key (the default tenant when keys are off).
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Tenant>()
            .cloned()
            .unwrap_or_else(|| Tenant(DEFAULT_TENANT.to_owned())))
    }
}

/// The bearer key of a request, if it carries one.
pub(crate) fn bearer_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// The tenant routes' authentication: the API key resolves the tenant (the default tenant when
/// there are no keys). An operator key is refused here whatever else is configured: it acts for
/// nobody's threads.
async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let key = bearer_key(req.headers());
    if key.is_some_and(|k| state.operator_keys.contains(k)) {
        return ApiError::OperatorKeyOnTenantRoute.into_response();
    }
    if state.api_keys.is_empty() {
        return next.run(req).await;
    }
    match key.and_then(|k| state.api_keys.get(k)) {
        Some(tenant) => {
            req.extensions_mut().insert(Tenant(tenant.clone()));
            next.run(req).await
        }
        None => ApiError::Unauthorized.into_response(),
    }
}

/// Whether a `Content-Type` names JSON: `application/json` or any `application/*+json`
/// (`application/a2a+json`, `application/merge-patch+json`), parameters such as `charset` allowed.
fn is_json_media_type(value: &str) -> bool {
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// Refuses, with 415, a write (POST, PUT, PATCH, DELETE) whose body is not declared JSON: a
/// `Content-Type` other than JSON, or a body sent with none. This is what keeps another web site
/// from starting work through a visitor's browser: an HTML form or a `text/plain` `fetch` is a
/// "simple" cross-site request that needs no preflight, while a JSON body does. It runs before the
/// handler, so routes that read raw bytes (`/a2a`) or no body at all (cancel) are covered alike.
async fn require_json_bodies(req: Request, next: Next) -> Response {
    use axum::http::{Method, header};
    let writes = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if writes {
        let headers = req.headers();
        match headers.get(header::CONTENT_TYPE) {
            Some(v) => {
                let ok = v.to_str().is_ok_and(is_json_media_type);
                if !ok {
                    return ApiError::UnsupportedMediaType(format!(
                        "expected a body with `Content-Type: application/json`, not `{}`",
                        String::from_utf8_lossy(v.as_bytes())
                    ))
                    .into_response();
                }
            }
            None => {
                let has_body = headers
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.trim() != "0")
                    || headers.contains_key(header::TRANSFER_ENCODING);
                if has_body {
                    return ApiError::UnsupportedMediaType(
                        "a body needs `Content-Type: application/json`".into(),
                    )
                    .into_response();
                }
            }
        }
    }
    next.run(req).await
}

/// A thread id from the path; an id that cannot exist is simply not found.
pub fn parse_thread_id(raw: &str) -> Result<ThreadId, ApiError> {
    ThreadId::parse(raw).map_err(|_| ApiError::thread_not_found())
}

/// Opaque page cursor: hex of `<created_at micros>:<id>`.
pub fn encode_cursor(created_at: DateTime<Utc>, id: &str) -> String {
    let raw = format!("{}:{}", created_at.timestamp_micros(), id);
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

/// What the id inside a page cursor must be: the list's own key, checked at the edge so a forged
/// cursor is a 422, never a store error.
#[derive(Debug, Clone, Copy)]
pub enum CursorKey {
    /// A thread id (lists of threads).
    ThreadId,
    /// A UUID (lists of runs and messages).
    Uuid,
    /// An observation seq (a thread's history).
    Seq,
}

/// # Errors
/// 422 when the cursor was not made by [`encode_cursor`] for a list keyed by `key`.
pub fn decode_cursor(cursor: &str, key: CursorKey) -> Result<PageCursor, ApiError> {
    let bad = || ApiError::validation("invalid cursor".into());
    if !cursor.len().is_multiple_of(2) || cursor.len() > 1024 {
        return Err(bad());
    }
    // Work on bytes: a cursor is ASCII hex, and slicing a `str` at odd places would panic on
    // multibyte characters.
    let bytes: Option<Vec<u8>> = cursor
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            u8::try_from(hi * 16 + lo).ok()
        })
        .collect();
    let text = String::from_utf8(bytes.ok_or_else(bad)?).map_err(|_| bad())?;
    let (micros, id) = text.split_once(':').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let created_at = DateTime::from_timestamp_micros(micros).ok_or_else(bad)?;
    let id_ok = match key {
        CursorKey::ThreadId => ThreadId::parse(id).is_ok(),
        CursorKey::Uuid => uuid::Uuid::parse_str(id).is_ok(),
        CursorKey::Seq => id.parse::<i64>().is_ok_and(|s| s >= 0),
    };
    if !id_ok {
        return Err(bad());
    }
    Ok(PageCursor {
        created_at,
        id: id.to_owned(),
    })
}

/// Page size from a `limit` parameter: 1..=200, default 50.
pub fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(50),
        Some(n) if (1..=200).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::validation(
            "limit must be between 1 and 200".into(),
        )),
    }
}

/// The routes behind the API keys outside `/v1`: A2A's JSON-RPC endpoint.
fn guarded_routes() -> OpenApiRouter<AppState> {
    a2a::rpc_router()
}

fn v1_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(threads::router())
        .merge(history::router())
        .merge(runs::router())
        .merge(sse::router())
        .merge(suspensions::router())
        .merge(steering::router())
        .merge(tools::router())
        .merge(flowcharts::router())
        .merge(assistants::router())
        .merge(retention::router())
        .merge(crons::router())
        .merge(webhooks::router())
        .merge(memory::router())
}

/// The OpenAPI document (also committed as `openapi/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut api) = OpenApiRouter::<AppState>::with_openapi(doc::ApiDoc::openapi())
        .merge(v1_routes())
        .merge(admin::router())
        .merge(agui::router())
        .merge(guarded_routes())
        .merge(a2a::card_router())
        .merge(health::router())
        .split_for_parts();
    health::document_extra_routes(&mut api);
    console::document_route(&mut api);
    mcp_server::document_route(&mut api);
    doc::add_shared_parts(&mut api);
    api
}

/// The first segments of the `/v1` routes: a path that starts with one of them but not with
/// `/v1` is most likely a `/v1` route without its prefix.
const V1_RESOURCES: [&str; 11] = [
    "ag-ui",
    "admin",
    "threads",
    "suspensions",
    "tools",
    "flowcharts",
    "runs",
    "assistants",
    "crons",
    "webhook-deliveries",
    "store",
];

async fn not_found(req: Request) -> ApiError {
    let path = req.uri().path();
    let first = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    if V1_RESOURCES.contains(&first) {
        return ApiError::RouteNotFound(format!(
            "{} {path}: the API's routes start with `/v1` (did you mean `/v1{path}`?)",
            req.method()
        ));
    }
    ApiError::RouteNotFound(format!("{} {path}", req.method()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::MethodNotAllowed(format!("{} on {}", req.method(), req.uri().path()))
}

/// A 405 names the methods the route has: axum sets `Allow` on the response of the fallback
/// above; this copies it into the problem's `detail`.
async fn name_allowed_methods(req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    if res.status() != axum::http::StatusCode::METHOD_NOT_ALLOWED {
        return res;
    }
    let Some(allow) = res
        .headers()
        .get(axum::http::header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return res;
    };
    let (parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return Response::from_parts(parts, axum::body::Body::empty());
    };
    let mut problem: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => return Response::from_parts(parts, axum::body::Body::from(bytes)),
    };
    if let Some(detail) = problem.get("detail").and_then(|d| d.as_str()) {
        problem["detail"] = format!("{detail}; allowed: {allow}").into();
    }
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(problem.to_string()))
}

/// The header that carries a request's id, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// The span of one request: its method, matched route and id. When spans are exported it is an
/// HTTP server span (`{method} {route}`) continuing the caller's `traceparent`.
fn request_span(req: &Request) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let request_id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        route = %route,
        request_id,
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        http.request.method = tracing::field::Empty,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    // Only for the collector: the log lines keep their short form.
    if crate::telemetry::otel::active() {
        span.record("otel.name", format!("{} {route}", req.method()));
        span.record("otel.kind", "server");
        span.record("http.request.method", req.method().as_str());
        span.record("http.route", route.as_str());
        crate::telemetry::context::continue_request(&span, req.headers());
    }
    span
}

/// Record the status of a response on its request span (exported spans only), and log it at
/// `debug` as the default handler does.
fn on_response(res: &Response, latency: std::time::Duration, span: &tracing::Span) {
    if crate::telemetry::otel::active() {
        // As i64: unsigned integers are exported as text.
        span.record(
            "http.response.status_code",
            i64::from(res.status().as_u16()),
        );
        if res.status().is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
    tracing::debug!(
        status = res.status().as_u16(),
        ?latency,
        "finished processing request"
    );
}

/// The whole HTTP surface. Pure: builds routes, does no I/O.
pub fn router(state: AppState) -> Router {
    // An AG-UI input carries the client's whole conversation: its own body limit.
    let agui_body = usize::try_from(state.config.agui_max_body_bytes).unwrap_or(usize::MAX);
    let v1 = v1_routes()
        .merge(agui::router().layer(DefaultBodyLimit::max(agui_body)))
        .merge(guarded_routes())
        .layer(axum::middleware::from_fn(require_json_bodies))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ));
    // The operator's routes: their own keys, never a tenant's.
    let admin = admin::router()
        .layer(axum::middleware::from_fn(require_json_bodies))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin::authenticate_operator,
        ));
    let (router, _) = OpenApiRouter::new()
        .merge(v1)
        .merge(admin)
        .merge(a2a::card_router())
        .merge(health::router())
        .split_for_parts();
    // The MCP server reads its own body (and bounds it: `PES_MCP_MAX_BODY_BYTES`).
    let mcp = mcp_server::router(&state)
        .layer(axum::middleware::from_fn(require_json_bodies))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ));
    let api = openapi();
    let max_body = state.config.max_body_bytes;
    let router = router
        .merge(SwaggerUi::new("/docs").url("/openapi.json", api))
        .merge(console::router())
        .merge(mcp)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        // Every door, the console and the documentation included: a request under a host or
        // (a write) from an origin the service does not answer goes no further.
        .layer(axum::middleware::from_fn_with_state(
            state.hosts.clone(),
            hosts::guard,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(on_response),
        )
        // Every request gets an id (the client's `x-request-id`, else a fresh UUID): it is on the
        // request's log lines (the span above) and echoed on the response, errors included, so a
        // problem a client reports can be found in the logs.
        .layer(PropagateRequestIdLayer::new(HeaderName::from_static(
            REQUEST_ID,
        )))
        .layer(SetRequestIdLayer::new(
            HeaderName::from_static(REQUEST_ID),
            MakeRequestUuid,
        ))
        .with_state(state);
    // Outside the routes: `Allow` is set on a 405 after a route's own layers have run.
    Router::new()
        .fallback_service(router)
        .layer(axum::middleware::from_fn(name_allowed_methods))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips() {
        let at = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let id = uuid::Uuid::now_v7().to_string();
        let c = decode_cursor(&encode_cursor(at, &id), CursorKey::Uuid).unwrap();
        assert_eq!((c.created_at, c.id), (at, id));
        let c = decode_cursor(&encode_cursor(at, "t-1"), CursorKey::ThreadId).unwrap();
        assert_eq!(c.id, "t-1");
    }

    #[test]
    fn forged_cursors_are_refused_without_panicking() {
        let at = DateTime::from_timestamp_micros(1).unwrap();
        for bad in [
            "😀".to_owned(),
            "é1".to_owned(),
            "zz".to_owned(),
            "+1".to_owned(),
            "abc".to_owned(),
            "00".to_owned(),
            encode_cursor(at, "not-a-uuid"),
            encode_cursor(at, "a\0b"),
            "3a".repeat(600),
        ] {
            assert!(decode_cursor(&bad, CursorKey::Uuid).is_err(), "{bad}");
        }
        assert!(decode_cursor(&encode_cursor(at, "a b"), CursorKey::ThreadId).is_err());
    }
}
