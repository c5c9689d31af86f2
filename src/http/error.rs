//! One error type for every handler, mapped once to a status and an RFC 9457 problem+json body
//! with a stable `code`. Internal errors are logged with their cause and answered with a generic
//! body; extractor rejections (bad JSON, wrong content type, oversized body, bad query or path)
//! speak the same shape.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

use super::serve::BodyReadTimeout;
pub use crate::problem::{ApiError, FieldError};

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
            Self::Internal(cause) => {
                tracing::error!(cause = format!("{cause:#}"), "internal error");
                "an internal error occurred; it has been logged".to_owned()
            }
            other => other.to_string(),
        };
        let retry_after = match &self {
            Self::QuotaExceeded {
                retry_after_seconds,
                ..
            } => Some(*retry_after_seconds),
            _ => None,
        };
        let errors = match self {
            Self::InvalidFields { errors, .. } => Some(errors),
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
            JsonRejection::JsonDataError(e) => Self::Validation(e.body_text()),
            JsonRejection::JsonSyntaxError(e) => {
                Self::MalformedJson(format!("malformed JSON: {}", e.body_text()))
            }
            JsonRejection::BytesRejection(e) => from_bytes_rejection(e),
            other => Self::BadRequest(other.body_text()),
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
        ApiError::BadRequest(e.body_text())
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
                    return Err(ApiError::Unprocessable {
                        code: "invalid_raise",
                        detail: format!(
                            "a raise must be a finite number, not `{token}` (JSON has no NaN or \
                             infinity)"
                        ),
                    });
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
        return Err(ApiError::Validation(format!(
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
            ApiError::Validation(format!("invalid body: {inner}"))
        } else {
            ApiError::Validation(format!("invalid body: {path}: {inner}"))
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
            ApiError::Validation(format!(
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
        return Err(ApiError::Validation(format!(
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
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(ApiError::Validation(
                format!("invalid query string: {}", e.body_text()),
            )),
            Err(e) => Err(ApiError::BadRequest(e.body_text())),
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
            Err(PathRejection::FailedToDeserializePathParams(e)) => Err(ApiError::NotFound {
                code: "not_found",
                detail: e.body_text(),
            }),
            Err(e) => Err(ApiError::BadRequest(e.body_text())),
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
