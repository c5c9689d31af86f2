//! Why a request is refused: [`ApiError`], one variant per kind of refusal, each with its HTTP
//! status and a stable `code`. It is what every use case answers with, whatever door the request
//! came through (the REST API, A2A, and the doors of later waves); each door words it its own way
//! (`crate::http::error` as problem+json, the A2A server as a JSON-RPC error).

use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::StoreError;

/// One invalid field of a request.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FieldError {
    /// JSON Pointer of the field in the request body (e.g. `/flowchart/stages/triage/next`).
    pub path: String,
    pub message: String,
}

/// Every way a request can fail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// 400 `invalid_header`: a request header that cannot be parsed.
    #[error("{0}")]
    BadHeader(String),
    /// 400 `malformed_json`: the body is not syntactically JSON.
    #[error("{0}")]
    MalformedJson(String),
    #[error("{0}")]
    Validation(String),
    /// 422 with a specific code.
    #[error("{detail}")]
    Unprocessable { code: &'static str, detail: String },
    /// 422 `validation_failed` naming every invalid field (also in `detail`).
    #[error("{detail}")]
    InvalidFields {
        detail: String,
        errors: Vec<FieldError>,
    },
    #[error("{detail}")]
    NotFound { code: &'static str, detail: String },
    #[error("{detail}")]
    Conflict { code: &'static str, detail: String },
    #[error("the request body is larger than the limit (PES_MAX_BODY_BYTES)")]
    PayloadTooLarge,
    /// The body did not arrive in full within `PES_BODY_READ_TIMEOUT_SECONDS`.
    #[error("the request body did not arrive within {0} s (PES_BODY_READ_TIMEOUT_SECONDS)")]
    RequestTimeout(u64),
    /// The header section is larger than `PES_MAX_HEADER_BYTES`.
    #[error("the request headers take {size} bytes; the limit is {limit} (PES_MAX_HEADER_BYTES)")]
    HeadersTooLarge { size: usize, limit: usize },
    /// The request target is longer than `PES_MAX_URI_BYTES`.
    #[error("the request URI takes {size} bytes; the limit is {limit} (PES_MAX_URI_BYTES)")]
    UriTooLong { size: usize, limit: usize },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("a valid API key is required: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// 401 `unauthorized`: an operator key (`PES_OPERATOR_KEYS`) on a tenant's route.
    #[error(
        "an operator key acts on `/v1/admin/*` only: a tenant's routes need one of the tenant's \
         keys (`PES_API_KEYS`)"
    )]
    OperatorKeyOnTenantRoute,
    /// 403 with a specific code: the request is understood and refused for who or where it
    /// comes from (`operator_only`, `host_refused`, `origin_refused`).
    #[error("{detail}")]
    Forbidden { code: &'static str, detail: String },
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("the service is not ready: {0}")]
    Unavailable(String),
    /// 429 `quota_exceeded`: the tenant holds as much of something as its quota allows (the
    /// detail names the quota's setting); `Retry-After` says when to try again.
    #[error("{detail}")]
    QuotaExceeded {
        detail: String,
        retry_after_seconds: u64,
    },
    /// Something failed that the client cannot fix; the source error (and its chain) is kept so
    /// it is logged once, whole, in the request's span (which carries the request id).
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn thread_not_found() -> Self {
        Self::NotFound {
            code: "thread_not_found",
            detail: "thread not found".into(),
        }
    }
    pub fn run_not_found() -> Self {
        Self::NotFound {
            code: "run_not_found",
            detail: "run not found".into(),
        }
    }
    pub fn suspension_not_found() -> Self {
        Self::NotFound {
            code: "suspension_not_found",
            detail: "suspension not found".into(),
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The status, the stable `code` and the title of the problem.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request", "Bad request"),
            Self::BadHeader(_) => (StatusCode::BAD_REQUEST, "invalid_header", "Bad request"),
            Self::MalformedJson(_) => (StatusCode::BAD_REQUEST, "malformed_json", "Malformed JSON"),
            Self::Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_failed",
                "Invalid request",
            ),
            Self::Unprocessable { code, .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, code, "Invalid request")
            }
            Self::InvalidFields { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_failed",
                "Invalid request",
            ),
            Self::NotFound { code, .. } => (StatusCode::NOT_FOUND, code, "Not found"),
            Self::Conflict { code, .. } => (StatusCode::CONFLICT, code, "Conflict"),
            Self::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Payload too large",
            ),
            Self::RequestTimeout(_) => (
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "Request timeout",
            ),
            Self::HeadersTooLarge { .. } => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
                "Request header fields too large",
            ),
            Self::UriTooLong { .. } => (StatusCode::URI_TOO_LONG, "uri_too_long", "URI too long"),
            Self::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Unsupported media type",
            ),
            Self::Unauthorized | Self::OperatorKeyOnTenantRoute => {
                (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized")
            }
            Self::Forbidden { code, .. } => (StatusCode::FORBIDDEN, code, "Forbidden"),
            Self::RouteNotFound(_) => (StatusCode::NOT_FOUND, "route_not_found", "Not found"),
            Self::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
            ),
            Self::QuotaExceeded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
                "Quota exceeded",
            ),
            Self::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "Internal server error",
            ),
        }
    }
}

impl ApiError {
    /// 403 `operator_only`: what only the operator may do (`detail` says what and how).
    pub fn operator_only(detail: impl Into<String>) -> Self {
        Self::Forbidden {
            code: "operator_only",
            detail: detail.into(),
        }
    }
}

impl From<crate::model::InvalidRaise> for ApiError {
    fn from(e: crate::model::InvalidRaise) -> Self {
        Self::Unprocessable {
            code: "invalid_raise",
            detail: e.0,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::ThreadExists => Self::Conflict {
                code: "thread_exists",
                detail: "a thread with this id already exists".into(),
            },
            StoreError::ThreadNotFound => Self::thread_not_found(),
            StoreError::OverQuota {
                what,
                setting,
                max,
                hint,
                retry_after_seconds,
            } => Self::QuotaExceeded {
                detail: format!("the tenant has {max} {what}, its quota ({setting}): {hint}"),
                retry_after_seconds,
            },
            StoreError::SteeringQuota { max } => Self::QuotaExceeded {
                detail: format!(
                    "the run has {max} steering messages, the most one run takes \
                     (PES_MAX_STEERS_PER_RUN): post a new run instead"
                ),
                retry_after_seconds: 60,
            },
            StoreError::RunNotFound => Self::run_not_found(),
            StoreError::SuspensionNotFound => Self::suspension_not_found(),
            StoreError::AssistantExists => Self::Conflict {
                code: "assistant_exists",
                detail: "an assistant with this id already exists: `PUT \
                         /v1/assistants/{assistantId}` adds a version to it"
                    .into(),
            },
            StoreError::AssistantNotFound(id) => Self::NotFound {
                code: "assistant_not_found",
                detail: format!("assistant `{id}` not found"),
            },
            StoreError::AssistantVersionNotFound {
                assistant_id,
                version,
            } => Self::NotFound {
                code: "assistant_version_not_found",
                detail: format!(
                    "assistant `{assistant_id}` has no version {version} (never made, or pruned \
                     past PES_ASSISTANT_MAX_VERSIONS): `GET /v1/assistants/{assistant_id}/versions` \
                     lists those kept"
                ),
            },
            StoreError::ThreadBusy { active_run } => Self::Conflict {
                code: "thread_busy",
                detail: format!(
                    "the thread has an active run ({active_run}) and multitaskStrategy is `reject`"
                ),
            },
            StoreError::Conflict(detail) => Self::Conflict {
                code: "conflict",
                detail,
            },
            other => Self::Internal(anyhow::Error::new(other)),
        }
    }
}
