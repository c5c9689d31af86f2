//! Why a use case refuses a request: [`Refusal`], one variant per kind of refusal, each with a
//! stable `code`. It is what every use case answers with, whatever door the request came through,
//! and it knows no transport: each door words it its own way (`crate::http::error` as a status
//! and problem+json, the A2A server as a JSON-RPC error, the MCP server as a tool error).

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

/// Every way a use case can refuse a request.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A request the use case cannot read at all.
    #[error("{0}")]
    BadRequest(String),
    /// `validation_failed`: a field does not fit.
    #[error("{0}")]
    Validation(String),
    /// Understood, and refused with a specific code (`decision_not_allowed`, `invalid_raise`…).
    #[error("{detail}")]
    Unprocessable { code: &'static str, detail: String },
    /// `validation_failed` naming every invalid field (also in `detail`).
    #[error("{detail}")]
    InvalidFields {
        detail: String,
        errors: Vec<FieldError>,
    },
    #[error("{detail}")]
    NotFound { code: &'static str, detail: String },
    #[error("{detail}")]
    Conflict { code: &'static str, detail: String },
    /// Understood and refused for who or where it comes from (`operator_only`, `host_refused`,
    /// `origin_refused`).
    #[error("{detail}")]
    Forbidden { code: &'static str, detail: String },
    /// `quota_exceeded`: the tenant holds as much of something as its quota allows (the detail
    /// names the quota's setting); try again after `retry_after_seconds`.
    #[error("{detail}")]
    QuotaExceeded {
        detail: String,
        retry_after_seconds: u64,
    },
    /// The service cannot take the request now.
    #[error("the service is not ready: {0}")]
    Unavailable(String),
    /// Something failed that the client cannot fix; the source error (and its chain) is kept so
    /// a door logs it once, whole.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl Refusal {
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

    /// The stable code a door shows for this refusal.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Validation(_) | Self::InvalidFields { .. } => "validation_failed",
            Self::Unprocessable { code, .. }
            | Self::NotFound { code, .. }
            | Self::Conflict { code, .. }
            | Self::Forbidden { code, .. } => code,
            Self::QuotaExceeded { .. } => "quota_exceeded",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal_error",
        }
    }
}

impl Refusal {
    /// 403 `operator_only`: what only the operator may do (`detail` says what and how).
    pub fn operator_only(detail: impl Into<String>) -> Self {
        Self::Forbidden {
            code: "operator_only",
            detail: detail.into(),
        }
    }
}

impl From<crate::model::InvalidRaise> for Refusal {
    fn from(e: crate::model::InvalidRaise) -> Self {
        Self::Unprocessable {
            code: "invalid_raise",
            detail: e.0,
        }
    }
}

impl From<StoreError> for Refusal {
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

/// The name the use cases' refusal had before the doors' transport errors moved to the doors;
/// kept while the policy checks are reworked.
pub type ApiError = Refusal;
