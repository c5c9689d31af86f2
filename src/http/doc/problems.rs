//! The problem+json answers every operation shares (of the body parser, authentication, the query
//! parser, the connection layer and the tenant quotas): one component each, referenced from every
//! operation they apply to unless the route documents that status itself.

use serde_json::json;
use utoipa::openapi::path::Operation;
use utoipa::openapi::{Ref, RefOr, Response};

use super::PROBLEM_JSON;

/// A shared problem+json response: (component name, status, description).
pub(super) type Shared = (&'static str, &'static str, &'static str);

pub(super) const MALFORMED_JSON: Shared = (
    "MalformedJson",
    "400",
    "The body is not syntactically valid JSON (`malformed_json`).",
);
pub(super) const UNAUTHORIZED: Shared = (
    "Unauthorized",
    "401",
    "The server has API keys (`PES_API_KEYS`) and the request carries no valid \
     `Authorization: Bearer <key>` (`unauthorized`).",
);
pub(super) const FORBIDDEN: Shared = (
    "Forbidden",
    "403",
    "The request names a `Host` the service does not answer (`host_refused`: \
     `PES_ALLOWED_HOSTS`; while bound to loopback, only `localhost`, `127.0.0.1` and `[::1]`), \
     or is a write from an `Origin` other than the service's own and those of \
     `PES_ALLOWED_ORIGINS` (`origin_refused`).",
);
pub(super) const URI_TOO_LONG: Shared = (
    "UriTooLong",
    "414",
    "The request target is longer than the server reads.",
);
pub(super) const PAYLOAD_TOO_LARGE: Shared = (
    "PayloadTooLarge",
    "413",
    "The body is larger than `PES_MAX_BODY_BYTES` (`payload_too_large`).",
);
pub(super) const REQUEST_TIMEOUT: Shared = (
    "RequestTimeout",
    "408",
    "The body did not arrive within `PES_BODY_READ_TIMEOUT_SECONDS` (`request_timeout`).",
);
pub(super) const UNSUPPORTED_MEDIA_TYPE: Shared = (
    "UnsupportedMediaType",
    "415",
    "The body is not sent as JSON (`Content-Type: application/json`, or another \
     `application/*+json` type such as `application/a2a+json`): refused before it is read, so a \
     cross-site form or `text/plain` request cannot start work (`unsupported_media_type`).",
);
pub(super) const INVALID_BODY: Shared = (
    "InvalidBody",
    "422",
    "Valid JSON that the route does not take: not an object, an unknown or missing field, a \
     value of the wrong type or out of range (`validation_failed`, or a more specific code).",
);
pub(super) const INVALID_QUERY: Shared = (
    "InvalidQuery",
    "422",
    "A query parameter that is unknown, of the wrong type or out of range, or a cursor this API \
     did not make (`validation_failed`).",
);
pub(super) const HEADERS_TOO_LARGE: Shared = (
    "HeadersTooLarge",
    "431",
    "The request headers are larger than the server reads.",
);

pub(super) const QUOTA_EXCEEDED: Shared = (
    "QuotaExceeded",
    "429",
    "The tenant holds as much as its quota allows: queued and running runs \
     (`PES_TENANT_MAX_ACTIVE_RUNS`), threads, forks included (`PES_TENANT_MAX_THREADS`), open \
     event streams (`PES_TENANT_MAX_STREAMS`), flowcharts \
     (`PES_TENANT_MAX_FLOWCHARTS`), assistants (`PES_TENANT_MAX_ASSISTANTS`) or memory store \
     items (`PES_TENANT_MAX_STORE_ITEMS`), steering messages of a run \
     (`PES_MAX_STEERS_PER_RUN`), or bytes stored (`PES_TENANT_MAX_STORAGE_BYTES`: anything that \
     grows them is refused, reads and deletes go on); `detail` names \
     which (`quota_exceeded`). `Retry-After` says when to try again.",
);

/// The routes that start something a tenant quota counts (method, path).
pub(super) const QUOTA_ROUTES: [(&str, &str); 13] = [
    ("post", "/v1/threads"),
    ("post", "/v1/threads/{threadId}/runs"),
    ("post", "/v1/threads/{threadId}/fork"),
    ("post", "/v1/ag-ui"),
    ("post", "/v1/threads/{threadId}/runs/wait"),
    ("get", "/v1/threads/{threadId}/events"),
    ("post", "/v1/suspensions/{suspensionId}/resume"),
    ("put", "/v1/flowcharts/{name}"),
    ("post", "/v1/flowcharts/{name}/runs"),
    ("post", "/v1/assistants"),
    ("post", "/v1/crons"),
    ("put", "/v1/store/items"),
    ("post", "/v1/threads/{threadId}/runs/{runId}/steer"),
];

/// Every shared response, for the components section.
pub(super) const SHARED: [Shared; 11] = [
    QUOTA_EXCEEDED,
    FORBIDDEN,
    MALFORMED_JSON,
    REQUEST_TIMEOUT,
    UNAUTHORIZED,
    URI_TOO_LONG,
    PAYLOAD_TOO_LARGE,
    UNSUPPORTED_MEDIA_TYPE,
    INVALID_BODY,
    INVALID_QUERY,
    HEADERS_TOO_LARGE,
];

pub(super) fn shared_response((name, status, description): Shared) -> Response {
    let mut response = json!({
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    });
    if status == "401" && name == "Unauthorized" {
        response["headers"] = json!({"WWW-Authenticate": {
            "description": "Always `Bearer`.",
            "schema": {"type": "string"},
        }});
    }
    if status == "429" {
        response["headers"] = json!({"Retry-After": {
            "description": "Seconds to wait before trying again.",
            "schema": {"type": "integer", "minimum": 1},
        }});
    }
    serde_json::from_value(response).expect("a response object")
}

/// Add `shared` to `op` unless the route documents that status itself.
pub(super) fn add(op: &mut Operation, (name, status, _): Shared) {
    op.responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))));
}
