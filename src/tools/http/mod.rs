//! The `http_request` tool: the model sends one HTTP request and reads `{status, headers, body}`.
//!
//! Off unless the operator sets `PES_HTTP_TOOL=true`, because it sends requests from inside the
//! service's network. Every request passes the SSRF guard ([`guard`]): only http and https, and
//! only public addresses unless `PES_HTTP_TOOL_ALLOW` says otherwise, judged on the address the
//! connection really uses (a resolver that filters) and again on every redirect. No proxy is
//! used, so none can route around the guard. The response body is read as a stream and cut at
//! `PES_HTTP_TOOL_MAX_BYTES`; the whole exchange is bounded by `PES_HTTP_TOOL_TIMEOUT_SECONDS`.

pub mod guard;

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url, redirect};
use serde_json::{Map, Value, json};

use self::guard::{AllowList, Guard, GuardError, GuardedResolver};
use super::{Tool, ToolContext, ToolError};

/// Redirects followed at most; each one is checked by the guard.
pub const MAX_REDIRECTS: usize = 5;

/// Largest request body the model may send, in bytes.
const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// Longest URL accepted, in bytes.
const MAX_URL: usize = 8 * 1024;

/// The methods the tool offers.
const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

/// Request headers the model may not set: the client frames the message and the URL names the
/// host, so these would only confuse the exchange (or smuggle a second request).
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
];

/// How the tool is bounded: what it may reach beyond public addresses, how much it reads, how
/// long it waits.
#[derive(Debug, Clone)]
pub struct HttpToolSettings {
    pub allow: AllowList,
    /// Response body bytes kept; the rest is never read.
    pub max_bytes: usize,
    /// The whole exchange: connecting, redirects, reading the body (the call is dropped, and
    /// its connection closed, when it runs out).
    pub timeout: Duration,
}

/// The `http_request` tool. Build it once: it owns the HTTP client (and its connection pool).
pub struct HttpRequestTool {
    client: reqwest::Client,
    guard: Arc<Guard>,
    max_bytes: usize,
    timeout: Duration,
}

impl HttpRequestTool {
    /// A tool with its own guarded client: the guard's resolver, a redirect policy that checks
    /// every hop, no proxy, no `Referer`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(settings: HttpToolSettings) -> Result<Self, reqwest::Error> {
        let guard = Arc::new(Guard::new(settings.allow));
        let policy_guard = guard.clone();
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(GuardError::TooManyRedirects(MAX_REDIRECTS));
            }
            match policy_guard.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => {
                    let url = attempt.url().to_string();
                    attempt.error(RedirectRefused { url, cause: e })
                }
            }
        });
        let client = crate::net::client_builder()
            .no_proxy()
            .dns_resolver(GuardedResolver::new(guard.clone()))
            .redirect(policy)
            .referer(false)
            .build()?;
        Ok(Self {
            client,
            guard,
            max_bytes: settings.max_bytes.max(1),
            timeout: settings.timeout,
        })
    }

    /// What the operator allows beyond public addresses (for the start-up log).
    pub fn allow_list(&self) -> &AllowList {
        self.guard.allow_list()
    }

    async fn exchange(&self, req: Request) -> Result<Value, ToolError> {
        let original = req.url.clone();
        let mut builder = self
            .client
            .request(req.method.clone(), req.url)
            .headers(req.headers);
        if let Some(body) = req.body {
            builder = builder.body(body);
        }
        let mut resp = builder
            .send()
            .await
            .map_err(|e| ToolError::Failed(describe(&e, &original)))?;
        let status = resp.status().as_u16();
        let headers = headers_json(resp.headers());
        let mut body = Vec::new();
        let mut truncated = false;
        if req.method != Method::HEAD {
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| ToolError::Failed(describe(&e, &original)))?
            {
                let room = self.max_bytes - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
        }
        // Dropping the response here closes a connection whose body was not read to the end.
        drop(resp);
        let mut text = body_text(&body, truncated);
        if truncated {
            text.push_str(&format!(
                "\n…[truncated: response exceeded {} bytes]",
                self.max_bytes
            ));
        }
        Ok(json!({"status": status, "headers": headers, "body": text}))
    }
}

#[async_trait]
impl Tool for HttpRequestTool {
    fn name(&self) -> &str {
        "http_request"
    }

    fn description(&self) -> &str {
        "Send one HTTP request to a public http:// or https:// URL and read the response \
         {status, headers, body}. Private, loopback and cloud metadata addresses are refused \
         unless the operator allows them; long bodies are truncated."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["method", "url"],
            "properties": {
                "method": {
                    "type": "string",
                    "enum": METHODS,
                    "description": "The HTTP method."
                },
                "url": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_URL,
                    "description": "An absolute http:// or https:// URL."
                },
                "headers": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Request headers, by name."
                },
                "body": {
                    "type": "string",
                    "maxLength": MAX_REQUEST_BODY,
                    "description": "The request body, as text."
                }
            }
        })
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let req = Request::parse(&args)?;
        self.guard
            .check_url(&req.url)
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        let url = req.url.to_string();
        match tokio::time::timeout(self.timeout, self.exchange(req)).await {
            Ok(result) => result,
            Err(_) => Err(ToolError::Failed(timed_out(&url, self.timeout))),
        }
    }
}

/// One call's arguments, parsed.
#[derive(Debug)]
struct Request {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<String>,
}

impl Request {
    /// The registry validated `args` against the schema already; this still never panics on
    /// anything else.
    fn parse(args: &Value) -> Result<Self, ToolError> {
        let invalid = ToolError::InvalidArguments;
        let method = args["method"]
            .as_str()
            .map(str::to_ascii_uppercase)
            .filter(|m| METHODS.contains(&m.as_str()))
            .ok_or_else(|| invalid(format!("/method: expected one of {}", METHODS.join(", "))))?;
        let method =
            Method::from_bytes(method.as_bytes()).map_err(|e| invalid(format!("/method: {e}")))?;
        let raw_url = args["url"]
            .as_str()
            .ok_or_else(|| invalid("/url: expected a string".into()))?;
        if raw_url.len() > MAX_URL {
            return Err(invalid(format!("/url: longer than {MAX_URL} bytes")));
        }
        let url = Url::parse(raw_url).map_err(|e| {
            ToolError::Failed(format!(
                "refused: `{}` is not a valid absolute URL ({e})",
                crate::text::truncate(raw_url, 200)
            ))
        })?;
        let mut headers = HeaderMap::new();
        match &args["headers"] {
            Value::Null => {}
            Value::Object(map) => {
                for (name, value) in map {
                    let value = value
                        .as_str()
                        .ok_or_else(|| invalid(format!("/headers/{name}: expected a string")))?;
                    let (name, value) = header(name, value)?;
                    headers.append(name, value);
                }
            }
            _ => return Err(invalid("/headers: expected an object".into())),
        }
        let body = match &args["body"] {
            Value::Null => None,
            Value::String(s) if s.len() <= MAX_REQUEST_BODY => Some(s.clone()),
            Value::String(_) => {
                return Err(invalid(format!(
                    "/body: longer than {MAX_REQUEST_BODY} bytes"
                )));
            }
            _ => return Err(invalid("/body: expected a string".into())),
        };
        Ok(Self {
            method,
            url,
            headers,
            body,
        })
    }
}

fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), ToolError> {
    let parsed = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        ToolError::InvalidArguments(format!("/headers: `{name}` is not a valid header name"))
    })?;
    if FORBIDDEN_HEADERS.contains(&parsed.as_str()) {
        return Err(ToolError::InvalidArguments(format!(
            "/headers: `{name}` is set by the client and may not be given"
        )));
    }
    let value = HeaderValue::from_str(value).map_err(|_| {
        ToolError::InvalidArguments(format!(
            "/headers/{name}: not a valid header value (no line breaks or control characters)"
        ))
    })?;
    Ok((parsed, value))
}

/// Response headers as an object: lower-case names, repeated fields joined with `, `.
fn headers_json(headers: &HeaderMap) -> Value {
    let mut out = Map::new();
    for name in headers.keys() {
        let joined = headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(", ");
        out.insert(name.as_str().to_owned(), Value::String(joined));
    }
    Value::Object(out)
}

/// The body as text (invalid UTF-8 becomes U+FFFD). A body cut at the byte limit may end inside a
/// character: that partial character is dropped rather than shown as garbage.
fn body_text(body: &[u8], truncated: bool) -> String {
    let body = match std::str::from_utf8(body) {
        Err(e) if truncated && e.error_len().is_none() => &body[..e.valid_up_to()],
        _ => body,
    };
    String::from_utf8_lossy(body).into_owned()
}

fn timed_out(url: &str, timeout: Duration) -> String {
    format!(
        "the request to `{url}` took longer than {} s (PES_HTTP_TOOL_TIMEOUT_SECONDS) and was \
         abandoned",
        timeout.as_secs_f64()
    )
}

/// A redirect the guard refused, naming where it led.
#[derive(Debug, thiserror::Error)]
#[error("the redirect to `{url}` was not followed: {cause}")]
struct RedirectRefused {
    url: String,
    cause: GuardError,
}

/// What the model reads when a request failed: the guard's own message when the guard stopped
/// it (from the redirect policy or the resolver, somewhere in the error's causes), else what
/// went wrong, with its causes.
fn describe(err: &reqwest::Error, original: &Url) -> String {
    let at = err.url().filter(|u| *u != original);
    let mut source: Option<&(dyn std::error::Error + 'static)> = err.source();
    while let Some(e) = source {
        if let Some(r) = e.downcast_ref::<RedirectRefused>() {
            return r.to_string();
        }
        if let Some(g) = e.downcast_ref::<GuardError>() {
            return match at {
                Some(u) => format!("the redirect to `{u}` was not followed: {g}"),
                None => g.to_string(),
            };
        }
        source = e.source();
    }
    let url = at.unwrap_or(original);
    if err.is_timeout() {
        return format!("the request to `{url}` timed out");
    }
    let mut msg = if err.is_connect() {
        format!("could not connect to `{url}`")
    } else {
        format!("the request to `{url}` failed")
    };
    let mut source = err.source();
    while let Some(e) = source {
        msg.push_str(": ");
        msg.push_str(&e.to_string());
        source = e.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_closed_and_names_the_methods() {
        let tool = HttpRequestTool::new(HttpToolSettings {
            allow: AllowList::default(),
            max_bytes: 10,
            timeout: Duration::from_secs(1),
        })
        .unwrap();
        let p = tool.parameters();
        assert_eq!(p["additionalProperties"], false);
        assert_eq!(p["required"], json!(["method", "url"]));
        assert_eq!(
            p["properties"]["method"]["enum"].as_array().unwrap().len(),
            7
        );
        assert!(
            jsonschema::draft202012::meta::validate(&p).is_ok(),
            "a valid Draft 2020-12 schema"
        );
        let v = jsonschema::draft202012::new(&p).unwrap();
        assert!(v.is_valid(
            &json!({"method": "GET", "url": "https://example.com/", "headers": {"a": "b"}})
        ));
        assert!(!v.is_valid(&json!({"method": "GET", "url": "https://example.com/", "extra": 1})));
        assert!(!v.is_valid(&json!({"method": "BREW", "url": "https://example.com/"})));
        assert!(!v.is_valid(&json!({"method": "GET", "url": "u", "headers": {"a": 1}})));
        assert!(tool.side_effects());
    }

    #[test]
    fn odd_arguments_are_errors_not_panics() {
        for args in [
            json!({}),
            json!({"method": "BREW", "url": "http://x/"}),
            json!({"method": "GET", "url": 3}),
            json!({"method": "GET", "url": "http://x/", "headers": []}),
            json!({"method": "GET", "url": "http://x/", "headers": {"a": 1}}),
            json!({"method": "GET", "url": "http://x/", "headers": {"bad name": "v"}}),
            json!({"method": "GET", "url": "http://x/", "headers": {"x": "a\nb"}}),
            json!({"method": "GET", "url": "http://x/", "headers": {"Host": "y"}}),
            json!({"method": "GET", "url": "http://x/", "body": {}}),
        ] {
            assert!(
                matches!(Request::parse(&args), Err(ToolError::InvalidArguments(_))),
                "{args}"
            );
        }
        assert!(matches!(
            Request::parse(&json!({"method": "GET", "url": "not a url"})),
            Err(ToolError::Failed(m)) if m.contains("is not a valid absolute URL")
        ));
        let ok = Request::parse(&json!({"method": "post", "url": "https://example.com/a",
            "headers": {"X-A": "1"}, "body": "hi"}))
        .unwrap();
        assert_eq!(ok.method, Method::POST);
        assert_eq!(ok.headers["x-a"], "1");
    }

    #[test]
    fn repeated_headers_are_joined_under_lower_case_names() {
        let mut h = HeaderMap::new();
        h.append("Set-Cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        h.append("X-Bin", HeaderValue::from_bytes(b"\xffok").unwrap());
        assert_eq!(
            headers_json(&h),
            json!({"set-cookie": "a=1, b=2", "x-bin": "\u{fffd}ok"})
        );
    }

    #[test]
    fn a_cut_character_is_dropped_from_a_truncated_body() {
        let bytes = "héllo".as_bytes();
        assert_eq!(body_text(&bytes[..2], true), "h");
        assert_eq!(body_text(&bytes[..2], false), "h\u{fffd}");
        assert_eq!(body_text(b"ok\xff!", true), "ok\u{fffd}!");
    }
}
