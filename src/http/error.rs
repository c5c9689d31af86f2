//! One error type for every handler, [`ApiError`]: a use case's [`Refusal`], or what only HTTP
//! can go wrong with (a header, a body that is not JSON or too large, a key, a route), mapped once
//! to a status and an RFC 9457 problem+json body with a stable `code`. Internal errors are logged
//! with their cause and answered with a generic body; extractor rejections (bad JSON, wrong
//! content type, oversized body, bad query or path) speak the same shape.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

use super::serve::BodyReadTimeout;
use crate::commands::StoreError;
pub use crate::problem::{FieldError, Refusal};

/// Every way a request can fail over HTTP.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A use case refused it (whatever the door, the same refusal).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// 400 `invalid_header`: a request header that cannot be parsed.
    #[error("{0}")]
    BadHeader(String),
    /// 400 `malformed_json`: the body is not syntactically JSON.
    #[error("{0}")]
    MalformedJson(String),
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
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::Refused(e.into())
    }
}

impl ApiError {
    /// 422 `validation_failed`.
    pub fn validation(detail: String) -> Self {
        Refusal::Validation(detail).into()
    }
    /// 400 `bad_request`.
    pub fn bad_request(detail: String) -> Self {
        Refusal::BadRequest(detail).into()
    }
    /// 503 `unavailable`.
    pub fn unavailable(detail: String) -> Self {
        Refusal::Unavailable(detail).into()
    }
    /// 500, logged with its cause.
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        Refusal::Internal(cause.into()).into()
    }
    pub fn thread_not_found() -> Self {
        Refusal::thread_not_found().into()
    }
    pub fn run_not_found() -> Self {
        Refusal::run_not_found().into()
    }
    pub fn suspension_not_found() -> Self {
        Refusal::suspension_not_found().into()
    }
    /// 403 `operator_only`.
    pub fn operator_only(detail: impl Into<String>) -> Self {
        Refusal::operator_only(detail).into()
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The status, the stable `code` and the title of the problem.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::Refused(r) => refusal_parts(r),
            Self::BadHeader(_) => (StatusCode::BAD_REQUEST, "invalid_header", "Bad request"),
            Self::MalformedJson(_) => (StatusCode::BAD_REQUEST, "malformed_json", "Malformed JSON"),
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
            Self::RouteNotFound(_) => (StatusCode::NOT_FOUND, "route_not_found", "Not found"),
            Self::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
            ),
        }
    }
}

/// The status, code and title a use case's refusal answers with over HTTP.
pub fn refusal_parts(r: &Refusal) -> (StatusCode, &'static str, &'static str) {
    let status = match r {
        Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
        Refusal::Validation(_) | Refusal::Unprocessable { .. } | Refusal::InvalidFields { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Refusal::NotFound { .. } => StatusCode::NOT_FOUND,
        Refusal::Conflict { .. } => StatusCode::CONFLICT,
        Refusal::Forbidden { .. } => StatusCode::FORBIDDEN,
        Refusal::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
        Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        Refusal::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let title = match r {
        Refusal::BadRequest(_) => "Bad request",
        Refusal::Validation(_) | Refusal::Unprocessable { .. } | Refusal::InvalidFields { .. } => {
            "Invalid request"
        }
        Refusal::NotFound { .. } => "Not found",
        Refusal::Conflict { .. } => "Conflict",
        Refusal::Forbidden { .. } => "Forbidden",
        Refusal::QuotaExceeded { .. } => "Quota exceeded",
        Refusal::Unavailable(_) => "Service unavailable",
        Refusal::Internal(_) => "Internal server error",
    };
    (status, r.code(), title)
}

/// An RFC 9457 problem details body.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem type (`urn:pes:problem:<code>`).
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code, e.g. `thread_not_found`.
    pub code: String,
    /// Every invalid field, where a route reports them all at once (`PUT
    /// /v1/flowcharts/{name}`); `detail` lists the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub errors: Option<Vec<FieldError>>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, title) = self.parts();
        let detail = match &self {
            Self::Refused(Refusal::Internal(cause)) => {
                tracing::error!(cause = format!("{cause:#}"), "internal error");
                "an internal error occurred; it has been logged".to_owned()
            }
            other => other.to_string(),
        };
        let retry_after = match &self {
            Self::Refused(Refusal::QuotaExceeded {
                retry_after_seconds,
                ..
            }) => Some(*retry_after_seconds),
            _ => None,
        };
        let errors = match self {
            Self::Refused(Refusal::InvalidFields { errors, .. }) => Some(errors),
            _ => None,
        };
        let body = Problem {
            kind: format!("urn:pes:problem:{code}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            code: code.to_owned(),
            errors,
        };
        let mut resp = (status, axum::Json(body)).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = retry_after {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is left unread, so the connection cannot carry another
            // request: say so, or a client reuses it and its next request fails half-sent.
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => Self::UnsupportedMediaType(
                "expected a body with `Content-Type: application/json`".into(),
            ),
            JsonRejection::JsonDataError(e) => Self::validation(e.body_text()),
            JsonRejection::JsonSyntaxError(e) => {
                Self::MalformedJson(format!("malformed JSON: {}", e.body_text()))
            }
            JsonRejection::BytesRejection(e) => from_bytes_rejection(e),
            other => Self::bad_request(other.body_text()),
        }
    }
}

/// The problem a body that could not be read answers: too large (413), too slow (408), or else
/// a bad request.
pub(crate) fn from_bytes_rejection(e: axum::extract::rejection::BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge
    } else if let Some(t) = body_timeout_in(&e) {
        ApiError::RequestTimeout(t.seconds())
    } else {
        ApiError::bad_request(e.body_text())
    }
}

/// The body-deadline error somewhere in `e`'s cause chain (the body extractors wrap it).
fn body_timeout_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyReadTimeout> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(t) = c.downcast_ref::<BodyReadTimeout>() {
            return Some(t);
        }
        cause = c.source();
    }
    None
}

/// `Json` whose rejections are problem+json, with one rule for every route: a body that is not
/// syntactically JSON is 400 `malformed_json`; JSON that is not an object, holds a NUL character
/// in a string (Postgres `text` cannot store one, so both stores refuse it alike), or does not
/// fit the route's shape is 422 `validation_failed`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppJson<T>(pub T);

impl<S, T> FromRequest<S> for AppJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let value = match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) => v,
            Err(r) => return Err(r.into()),
        };
        from_json_value(value).map(Self)
    }
}

/// A body that carries a budget raise, read as [`AppJson`] reads a body, except that numbers
/// JSON cannot carry (`NaN`, `Infinity`, a literal past the largest double) in a raise are 422
/// `invalid_raise`, as any other number a raise does not take, rather than 400 `malformed_json`:
/// a client whose serializer writes such numbers (Python's `json` does) learns what is wrong with
/// the raise.
#[derive(Debug, Clone, Copy, Default)]
pub struct RaiseJson<T>(pub T);

impl<S, T> FromRequest<S> for RaiseJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(from_bytes_rejection)?;
        let value = match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(v) => v,
            Err(e) => {
                let text = String::from_utf8_lossy(&bytes);
                // A resume body's raise is its `raiseBy`; a body without a decision is a raise.
                let about_a_raise = text.contains("raiseBy") || !text.contains("\"decision\"");
                if about_a_raise && let Some(token) = non_finite_number(&text) {
                    return Err(Refusal::Unprocessable {
                        code: "invalid_raise",
                        detail: format!(
                            "a raise must be a finite number, not `{token}` (JSON has no NaN or \
                             infinity)"
                        ),
                    }
                    .into());
                }
                return Err(ApiError::MalformedJson(format!("malformed JSON: {e}")));
            }
        };
        from_json_value(value).map(Self)
    }
}

/// The first token outside strings of `text` that names a number JSON cannot carry: `NaN`,
/// `Infinity` (signed or not), or a literal too large for a double (`1e400`).
fn non_finite_number(text: &str) -> Option<String> {
    let mut in_string = false;
    let mut escaped = false;
    let mut token = String::new();
    let finish = |token: &mut String| {
        let t = std::mem::take(token);
        let bare = t.trim_start_matches(['-', '+']);
        let bad = matches!(bare, "NaN" | "Infinity" | "inf" | "nan")
            || t.parse::<f64>().is_ok_and(|f| f.is_infinite());
        bad.then_some(t)
    };
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-') {
            token.push(c);
            continue;
        }
        if let Some(t) = finish(&mut token) {
            return Some(t);
        }
        in_string = c == '"';
    }
    finish(&mut token)
}

/// A JSON body as a route's type, with the rules of [`AppJson`].
fn from_json_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::validation(format!(
            "the body must be a JSON object, not {}",
            json_kind(&value)
        )));
    }
    reject_nul(&value)?;
    crate::json::strict::from_value_at(&value).map_err(|e| {
        // Name the field that does not fit (`query: invalid type: …`), so a client sees where
        // to look; a problem with the body as a whole has no path.
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::validation(format!("invalid body: {inner}"))
        } else {
            ApiError::validation(format!("invalid body: {path}: {inner}"))
        }
    })
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// 422 when a string (or an object key) anywhere in `value` holds a NUL character, naming where.
///
/// # Errors
/// [`ApiError::Validation`] with the JSON path of the first offending string.
pub fn reject_nul(value: &serde_json::Value) -> Result<(), ApiError> {
    fn walk(v: &serde_json::Value, path: &mut String) -> Result<(), ApiError> {
        let bad = |path: &str| {
            ApiError::validation(format!(
                "strings may not contain the NUL character (\\u0000): found at {path}"
            ))
        };
        match v {
            serde_json::Value::String(s) if s.contains('\0') => Err(bad(path)),
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    walk(item, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            serde_json::Value::Object(map) => {
                for (k, item) in map {
                    let len = path.len();
                    path.push('.');
                    path.push_str(k);
                    if k.contains('\0') {
                        return Err(bad(path));
                    }
                    walk(item, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    walk(value, &mut "$".to_owned())
}

/// 422 when a request string outside a JSON body (a query parameter, a header) holds a NUL.
///
/// # Errors
/// [`ApiError::Validation`] naming the parameter.
pub fn reject_nul_str(name: &str, value: &str) -> Result<(), ApiError> {
    if value.contains('\0') {
        return Err(ApiError::validation(format!(
            "`{name}` may not contain the NUL character (\\u0000)"
        )));
    }
    Ok(())
}

impl<T: Serialize> IntoResponse for AppJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `Query` whose rejections are problem+json.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for AppQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // Every decoded name and value is checked for NUL first: no store can hold one.
        if let Ok(axum::extract::Query(pairs)) =
            axum::extract::Query::<Vec<(String, String)>>::from_request_parts(parts, state).await
        {
            for (name, value) in &pairs {
                reject_nul_str(name, name)?;
                reject_nul_str(name, value)?;
            }
        }
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Self(v)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(ApiError::validation(
                format!("invalid query string: {}", e.body_text()),
            )),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// `Path` whose rejections are problem+json.
#[derive(Debug, Clone)]
pub struct AppPath<T>(pub T);

impl<S, T> FromRequestParts<S> for AppPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Self(v)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => Err(Refusal::NotFound {
                code: "not_found",
                detail: e.body_text(),
            }
            .into()),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::non_finite_number;

    #[test]
    fn numbers_json_cannot_carry_are_found_outside_strings() {
        assert_eq!(
            non_finite_number(r#"{"raiseBy": {"usd": NaN}}"#).as_deref(),
            Some("NaN")
        );
        assert_eq!(
            non_finite_number(r#"{"tokens":-Infinity}"#).as_deref(),
            Some("-Infinity")
        );
        assert_eq!(
            non_finite_number(r#"{"usd": 1e400}"#).as_deref(),
            Some("1e400")
        );
        assert_eq!(non_finite_number(r#"{"reason": "NaN \" Infinity"}"#), None);
        assert_eq!(non_finite_number(r#"{"usd": 1e300, "tokens": 5}"#), None);
    }
}
