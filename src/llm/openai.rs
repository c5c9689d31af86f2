//! The `openai` provider: any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama,
//! llama.cpp, LiteLLM, OpenRouter, Groq, DeepSeek… and the test double).
//!
//! It owns the wire format of DESIGN §3 (messages, native tool calling, `response_format`
//! json_schema) and the transport policy: transient failures (429, 500, 502, 503, 504, connection
//! errors, timeouts) are retried with exponential backoff and jitter, honouring `Retry-After`; any
//! other 4xx is a permanent [`LlmError::Rejected`]; a provider that refuses `response_format` is
//! asked once more with the schema in the system prompt instead.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde_json::{Map, Value, json};
use tracing::{debug, warn};

use super::{
    ChatMessage, ChatRequest, ChatResponse, LlmError, LlmProvider, Role, ToolCall, truncate,
};
use crate::model::Usage;

/// Longest error body kept in [`LlmError::Rejected`] and [`LlmError::Unavailable`].
const MAX_ERROR_BODY: usize = 2048;
/// Longest `Retry-After` we honour; a longer one is cut to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Settings of an [`OpenAiProvider`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiConfig {
    /// Base URL; the provider appends `/chat/completions` (a trailing `/` is ignored).
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Model used when a request names none.
    pub default_model: String,
    /// Bound on one HTTP attempt (connect, send and read the reply).
    pub timeout: Duration,
    /// Retries of a transient failure after the first attempt.
    pub max_retries: u32,
    /// First backoff; doubled on each retry, with jitter.
    pub initial_backoff: Duration,
    /// Cap of the computed backoff.
    pub max_backoff: Duration,
    /// Model calls this process has in flight at once, at most; more wait their turn. Each call
    /// holds a socket, and parallel items multiply calls per run: without a cap, thousands of
    /// runs answered at once exhaust file descriptors and fail their calls instead of queueing.
    pub max_in_flight: usize,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            default_model: "gpt-4o-mini".into(),
            timeout: Duration::from_secs(120),
            max_retries: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            max_in_flight: 4096,
        }
    }
}

/// Why an [`OpenAiProvider`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiConfigError {
    /// The base URL is not an http(s) URL.
    #[error("the LLM base URL `{0}` must start with http:// or https://")]
    BadBaseUrl(String),
    /// No default model was given.
    #[error("the default model name is empty")]
    EmptyModel,
    /// The HTTP client could not be built (e.g. no TLS backend).
    #[error("could not build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// An OpenAI-compatible Chat Completions client.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    cfg: OpenAiConfig,
    endpoint: String,
    client: reqwest::Client,
    /// Permits for calls in flight (`OpenAiConfig::max_in_flight`).
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl OpenAiProvider {
    /// Build a provider (no network call is made).
    ///
    /// # Errors
    /// [`OpenAiConfigError`] for a base URL that is not http(s), an empty default model, or an
    /// HTTP client that cannot be built.
    pub fn new(cfg: OpenAiConfig) -> Result<Self, OpenAiConfigError> {
        let base = cfg.base_url.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(OpenAiConfigError::BadBaseUrl(cfg.base_url.clone()));
        }
        if cfg.default_model.trim().is_empty() {
            return Err(OpenAiConfigError::EmptyModel);
        }
        let client = crate::net::client_builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            .build()?;
        Ok(Self {
            endpoint: format!("{base}/chat/completions"),
            in_flight: Arc::new(tokio::sync::Semaphore::new(cfg.max_in_flight.max(1))),
            cfg,
            client,
        })
    }

    /// The URL requests are POSTed to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Backoff before retry number `retry` (0-based): exponential, capped, with "equal jitter"
    /// (half fixed, half random) so synchronized clients spread out.
    fn backoff(&self, retry: u32) -> Duration {
        let base = self
            .cfg
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.min(16)))
            .min(self.cfg.max_backoff);
        let half = base / 2;
        let jitter_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        let extra = if jitter_ms == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(rand::rng().random_range(0..=jitter_ms))
        };
        half + extra
    }
}

/// The wire form of one message; empty fields are omitted.
fn wire_message(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut o = Map::new();
    o.insert("role".into(), role.into());
    if let Some(c) = &m.content {
        o.insert("content".into(), c.clone().into());
    } else if m.role == Role::Tool {
        // A tool message must carry content.
        o.insert("content".into(), "".into());
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                // A raw (unparseable) argument string goes back exactly as the model wrote it.
                let arguments = match &c.arguments {
                    Value::String(raw) => raw.clone(),
                    other => other.to_string(),
                };
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": arguments},
                })
            })
            .collect();
        o.insert("tool_calls".into(), calls.into());
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), id.clone().into());
    }
    Value::Object(o)
}

/// The text added to the system prompt when a provider refuses `response_format`.
fn schema_instruction(schema: &Value) -> String {
    format!("Reply with only a JSON object that matches this JSON Schema: {schema}")
}

/// The request body. With `inline_schema`, `response_format` is left out and the schema is put
/// in the system prompt instead.
fn build_body(req: &ChatRequest, model: &str, inline_schema: bool) -> Value {
    let mut messages: Vec<ChatMessage> = req.messages.clone();
    if inline_schema && let Some(fmt) = &req.response_format {
        let instruction = schema_instruction(&fmt.schema);
        match messages.first_mut() {
            Some(first) if first.role == Role::System => {
                let text = first.content.take().unwrap_or_default();
                first.content = Some(if text.is_empty() {
                    instruction
                } else {
                    format!("{text}\n\n{instruction}")
                });
            }
            _ => messages.insert(0, ChatMessage::system(instruction)),
        }
    }
    let mut body = json!({
        "model": model,
        "messages": messages.iter().map(wire_message).collect::<Vec<_>>(),
    });
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect::<Vec<_>>()
            .into();
    }
    if !inline_schema && let Some(fmt) = &req.response_format {
        // The service's own schemas meet strict mode's rules (a unit test checks each); a schema
        // an operator wrote (a flowchart's `outputSchema`) may not, and OpenAI refuses such a
        // schema with `strict: true`: it goes without, and the reply is validated here anyway.
        let strict = super::strict::strict_mode_violations(&fmt.schema).is_empty();
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {"name": fmt.name, "strict": strict, "schema": fmt.schema},
        });
    }
    body
}

/// Parse a 2xx reply body into a [`ChatResponse`] (usage without `llm_calls`).
fn parse_reply(body: &str) -> Result<ChatResponse, LlmError> {
    let mut v: Value = serde_json::from_str(body).map_err(|e| {
        LlmError::BadReply(format!(
            "not JSON ({e}): {}",
            truncate(body, MAX_ERROR_BODY)
        ))
    })?;
    // What a model writes is stored: no store may be handed a NUL.
    crate::model::scrub_nul(&mut v);
    let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
        return Err(LlmError::BadReply(format!(
            "no `choices[0]` in the reply: {}",
            truncate(body, MAX_ERROR_BODY)
        )));
    };
    let message = choice.get("message").cloned().unwrap_or(Value::Null);
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, call) in calls.iter().enumerate() {
            let function = call.get("function").cloned().unwrap_or(Value::Null);
            let Some(name) = function.get("name").and_then(Value::as_str) else {
                return Err(LlmError::BadReply(format!(
                    "tool call {i} has no function name"
                )));
            };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{}", i + 1), str::to_owned);
            let mut arguments = match function.get("arguments") {
                Some(Value::String(raw)) if raw.trim().is_empty() => json!({}),
                Some(Value::String(raw)) => {
                    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.clone()))
                }
                // Some servers send the object itself.
                Some(other @ Value::Object(_)) => other.clone(),
                None | Some(Value::Null) => json!({}),
                Some(other) => Value::String(other.to_string()),
            };
            // The arguments were JSON text inside the reply: scrub what parsing it revealed.
            crate::model::scrub_nul(&mut arguments);
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            });
        }
    }
    let finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let u = v.get("usage");
    let count = |key: &str| {
        u.and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (prompt, completion) = (count("prompt_tokens"), count("completion_tokens"));
    let total = match count("total_tokens") {
        0 => prompt + completion,
        t => t,
    };
    Ok(ChatResponse {
        content,
        tool_calls,
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total,
            llm_calls: 0,
        },
        finish_reason,
    })
}

fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504)
}

/// `Retry-After` as a delay: seconds (fractional accepted) or an HTTP date, capped.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = if let Ok(secs) = text.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return None;
        }
        Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64()))
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(text).ok()?;
        let ms = (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_milliseconds();
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// True when a 400 body says the provider does not accept our `response_format`.
fn refuses_response_format(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    b.contains("response_format") || b.contains("json_schema")
}

#[async_trait]
impl LlmProvider for OpenAiProvider {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn default_model(&self) -> Option<&str> {
        Some(&self.cfg.default_model)
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let model = request
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| self.cfg.default_model.clone());
        let mut inline_schema = false;
        let mut body = build_body(&request, &model, inline_schema);
        let mut replies: u64 = 0;
        let mut retries: u32 = 0;
        loop {
            let mut req = self.client.post(&self.endpoint).json(&body);
            if let Some(key) = &self.cfg.api_key {
                req = req.bearer_auth(key);
            }
            // Wait for a turn: a call past the cap queues here, it does not fail.
            let permit = self
                .in_flight
                .acquire()
                .await
                .map_err(|_| LlmError::Unavailable("the model client was shut down".into()))?;
            // Either a reply (status, Retry-After, body) or a transient transport failure.
            let outcome = match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let wait = retry_after(resp.headers());
                    match resp.text().await {
                        Ok(text) => Ok((status, wait, text)),
                        Err(e) => Err(format!("reading the reply failed: {e}")),
                    }
                }
                Err(e) if e.is_timeout() => Err(format!("timed out after {:?}", self.cfg.timeout)),
                Err(e) if e.is_connect() => Err(format!("could not connect: {e}")),
                Err(e) => Err(format!("request failed: {e}")),
            };
            // The turn ends with the reply read; a backoff waits without one.
            drop(permit);
            let (problem, wait) = match outcome {
                Ok((status, wait, text)) => {
                    replies += 1;
                    if status.is_success() {
                        let mut reply = parse_reply(&text)?;
                        reply.usage.llm_calls = replies.max(1);
                        debug!(model, calls = replies, "chat completion");
                        return Ok(reply);
                    }
                    if status == StatusCode::BAD_REQUEST
                        && !inline_schema
                        && request.response_format.is_some()
                        && refuses_response_format(&text)
                    {
                        warn!(
                            model,
                            "the provider refused response_format; retrying once with the schema in the prompt"
                        );
                        inline_schema = true;
                        body = build_body(&request, &model, inline_schema);
                        continue;
                    }
                    if !is_transient(status) {
                        return Err(LlmError::Rejected {
                            status: status.as_u16(),
                            body: truncate(&text, MAX_ERROR_BODY),
                        });
                    }
                    (
                        format!(
                            "HTTP {}: {}",
                            status.as_u16(),
                            truncate(&text, MAX_ERROR_BODY)
                        ),
                        wait,
                    )
                }
                Err(problem) => (problem, None),
            };
            if retries >= self.cfg.max_retries {
                return Err(LlmError::Unavailable(format!(
                    "{problem} (after {} attempts)",
                    retries + 1
                )));
            }
            let delay = wait.unwrap_or_else(|| self.backoff(retries));
            retries += 1;
            warn!(
                model,
                retry = retries,
                max_retries = self.cfg.max_retries,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                %problem,
                "transient LLM provider error; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;

    use super::*;
    use crate::llm::{JsonSchemaFormat, Phase, ToolSpec};

    /// One scripted reply of the fake server.
    struct Scripted {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    }

    fn reply(status: u16, body: Value) -> Scripted {
        Scripted {
            status,
            headers: vec![],
            body: body.to_string(),
        }
    }

    fn ok_text(text: &str) -> Scripted {
        reply(
            200,
            json!({
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
            }),
        )
    }

    type Seen = (Value, Option<String>);

    #[derive(Clone, Default)]
    struct Fake {
        script: Arc<Mutex<VecDeque<Scripted>>>,
        /// Each request's body and `Authorization` header.
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl Fake {
        fn requests(&self) -> Vec<Value> {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .map(|(b, _)| b.clone())
                .collect()
        }
    }

    async fn handler(State(fake): State<Fake>, headers: AxHeaders, body: String) -> Response {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        fake.seen.lock().unwrap().push((parsed, auth));
        let next = fake.script.lock().unwrap().pop_front();
        let Some(s) = next else {
            return (AxStatus::INTERNAL_SERVER_ERROR, "script exhausted").into_response();
        };
        if s.status == 0 {
            // Never answer: the client's timeout must fire.
            std::future::pending::<()>().await;
        }
        let mut resp = (AxStatus::from_u16(s.status).unwrap(), s.body).into_response();
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        for (k, v) in s.headers {
            resp.headers_mut().insert(k, v.parse().unwrap());
        }
        resp
    }

    /// A fake OpenAI-compatible server on 127.0.0.1:0 answering from `script`.
    async fn serve(script: Vec<Scripted>) -> (Fake, String) {
        let fake = Fake::default();
        fake.script.lock().unwrap().extend(script);
        let app = Router::new()
            .route("/v1/chat/completions", post(handler))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        #[allow(clippy::disallowed_methods)] // a test server, for the test's life
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (fake, format!("http://{addr}/v1/"))
    }

    fn provider(base_url: &str, max_retries: u32) -> OpenAiProvider {
        OpenAiProvider::new(OpenAiConfig {
            base_url: base_url.into(),
            api_key: Some("sk-test".into()),
            default_model: "test-model".into(),
            timeout: Duration::from_secs(5),
            max_retries,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            max_in_flight: 8,
        })
        .unwrap()
    }

    fn request() -> ChatRequest {
        ChatRequest {
            phase: Phase::Execute,
            model: None,
            messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
            tools: vec![],
            response_format: None,
        }
    }

    fn plan_schema() -> JsonSchemaFormat {
        JsonSchemaFormat {
            name: "pes_plan".into(),
            schema: json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"], "additionalProperties": false}),
        }
    }

    #[tokio::test]
    async fn a_plain_reply_is_parsed_with_usage_and_auth() {
        let (fake, url) = serve(vec![ok_text("hello")]).await;
        let p = provider(&url, 3);
        assert_eq!(p.endpoint(), format!("{}chat/completions", url));
        let r = p.complete(request()).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("hello"));
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        assert_eq!(
            r.usage,
            Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 15,
                llm_calls: 1
            }
        );
        let seen = fake.seen.lock().unwrap();
        assert_eq!(seen[0].1.as_deref(), Some("Bearer sk-test"));
        assert_eq!(
            seen[0].0,
            json!({
                "model": "test-model",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"}
                ]
            })
        );
    }

    #[tokio::test]
    async fn the_request_body_has_tools_tool_messages_and_response_format_as_designed() {
        let (fake, url) = serve(vec![ok_text("{}")]).await;
        let mut req = request();
        req.model = Some("other-model".into());
        req.tools = vec![ToolSpec {
            name: "calculator".into(),
            description: "math".into(),
            parameters: json!({"type": "object"}),
        }];
        req.response_format = Some(plan_schema());
        req.messages.push(ChatMessage::assistant(
            None,
            vec![
                ToolCall {
                    id: "call_1".into(),
                    name: "calculator".into(),
                    arguments: json!({"expression": "1+1"}),
                },
                ToolCall {
                    id: "call_2".into(),
                    name: "calculator".into(),
                    arguments: Value::String("{bad".into()),
                },
            ],
        ));
        req.messages
            .push(ChatMessage::tool("call_1", "{\"result\":2}"));
        provider(&url, 0).complete(req).await.unwrap();
        let body = &fake.requests()[0];
        assert_eq!(body["model"], "other-model");
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "calculator", "description": "math", "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "pes_plan", "strict": true, "schema": plan_schema().schema}})
        );
        assert_eq!(
            body["messages"][2],
            json!({"role": "assistant", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\":\"1+1\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "calculator", "arguments": "{bad"}}
            ]})
        );
        assert_eq!(
            body["messages"][3],
            json!({"role": "tool", "content": "{\"result\":2}", "tool_call_id": "call_1"})
        );
    }

    #[tokio::test]
    async fn tool_calls_are_parsed_and_bad_arguments_kept_raw() {
        let (_fake, url) = serve(vec![reply(
            200,
            json!({
                "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\":\"2^10\"}"}},
                    {"id": "b", "type": "function", "function": {"name": "current_time", "arguments": "{not json"}},
                    {"id": "c", "type": "function", "function": {"name": "current_time", "arguments": ""}}
                ]}, "finish_reason": "tool_calls"}]
            }),
        )])
        .await;
        let r = provider(&url, 0).complete(request()).await.unwrap();
        assert_eq!(r.content, None);
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            r.tool_calls,
            vec![
                ToolCall {
                    id: "a".into(),
                    name: "calculator".into(),
                    arguments: json!({"expression": "2^10"})
                },
                ToolCall {
                    id: "b".into(),
                    name: "current_time".into(),
                    arguments: Value::String("{not json".into())
                },
                ToolCall {
                    id: "c".into(),
                    name: "current_time".into(),
                    arguments: json!({})
                },
            ]
        );
        // No usage in the reply: zeros, but the call is counted.
        assert_eq!(r.usage.total_tokens, 0);
        assert_eq!(r.usage.llm_calls, 1);
    }

    #[tokio::test]
    async fn a_500_is_retried_and_counted() {
        let (fake, url) = serve(vec![reply(500, json!({"error": "oops"})), ok_text("ok")]).await;
        let r = provider(&url, 3).complete(request()).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("ok"));
        assert_eq!(r.usage.llm_calls, 2);
        assert_eq!(fake.requests().len(), 2);
    }

    #[tokio::test]
    async fn a_429_with_retry_after_is_retried() {
        let mut limited = reply(429, json!({"error": "slow down"}));
        limited.headers.push(("retry-after", "0".into()));
        let (fake, url) = serve(vec![limited, ok_text("ok")]).await;
        let r = provider(&url, 1).complete(request()).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("ok"));
        assert_eq!(fake.requests().len(), 2);
    }

    #[tokio::test]
    async fn a_timed_out_attempt_is_retried() {
        let hang = Scripted {
            status: 0,
            headers: vec![],
            body: String::new(),
        };
        let (fake, url) = serve(vec![hang, ok_text("late but fine")]).await;
        let p = OpenAiProvider::new(OpenAiConfig {
            timeout: Duration::from_millis(300),
            ..provider(&url, 1).cfg
        })
        .unwrap();
        let r = p.complete(request()).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("late but fine"));
        // The timed-out attempt got no reply, so only one call is counted.
        assert_eq!(r.usage.llm_calls, 1);
        assert_eq!(fake.requests().len(), 2);
    }

    #[tokio::test]
    async fn transient_errors_give_up_after_max_retries() {
        let (fake, url) = serve(vec![
            reply(503, json!({})),
            reply(502, json!({})),
            reply(504, json!({"error": "gateway"})),
        ])
        .await;
        let e = provider(&url, 2).complete(request()).await.unwrap_err();
        assert!(
            matches!(&e, LlmError::Unavailable(m) if m.contains("HTTP 504") && m.contains("after 3 attempts")),
            "{e}"
        );
        assert_eq!(fake.requests().len(), 3);
    }

    #[tokio::test]
    async fn a_401_is_rejected_without_retry() {
        let (fake, url) = serve(vec![
            reply(401, json!({"error": {"message": "bad key"}})),
            ok_text("never"),
        ])
        .await;
        let e = provider(&url, 3).complete(request()).await.unwrap_err();
        match e {
            LlmError::Rejected { status, body } => {
                assert_eq!(status, 401);
                assert!(body.contains("bad key"));
            }
            other => panic!("expected Rejected, got {other}"),
        }
        assert_eq!(fake.requests().len(), 1);
    }

    #[tokio::test]
    async fn a_long_error_body_is_truncated() {
        let (_fake, url) = serve(vec![Scripted {
            status: 404,
            headers: vec![],
            body: "x".repeat(10_000),
        }])
        .await;
        let Err(LlmError::Rejected { body, .. }) = provider(&url, 0).complete(request()).await
        else {
            panic!("expected Rejected")
        };
        assert!(body.len() <= MAX_ERROR_BODY + '…'.len_utf8());
    }

    #[tokio::test]
    async fn a_refused_response_format_is_retried_once_with_the_schema_in_the_prompt() {
        let (fake, url) = serve(vec![
            reply(
                400,
                json!({"error": {"message": "response_format json_schema is not supported"}}),
            ),
            ok_text("{\"title\":\"t\"}"),
        ])
        .await;
        let mut req = request();
        req.response_format = Some(plan_schema());
        let r = provider(&url, 0).complete(req).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("{\"title\":\"t\"}"));
        assert_eq!(r.usage.llm_calls, 2);
        let reqs = fake.requests();
        assert!(reqs[0].get("response_format").is_some());
        assert!(reqs[1].get("response_format").is_none());
        let system = reqs[1]["messages"][0]["content"].as_str().unwrap();
        assert!(system.starts_with(
            "be brief\n\nReply with only a JSON object that matches this JSON Schema: "
        ));
        assert!(system.contains(&plan_schema().schema.to_string()));
    }

    #[tokio::test]
    async fn a_second_refusal_is_a_rejection() {
        let refusal = || reply(400, json!({"error": "unsupported response_format"}));
        let (fake, url) = serve(vec![refusal(), refusal(), refusal()]).await;
        let mut req = request();
        req.messages.remove(0);
        req.response_format = Some(plan_schema());
        let e = provider(&url, 3).complete(req).await.unwrap_err();
        assert!(matches!(e, LlmError::Rejected { status: 400, .. }));
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 2);
        // No system message before: one was added.
        assert_eq!(reqs[1]["messages"][0]["role"], "system");
    }

    #[tokio::test]
    async fn connection_errors_are_retried_then_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let e = provider(&format!("http://{addr}/v1"), 1)
            .complete(request())
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LlmError::Unavailable(m) if m.contains("after 2 attempts")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_reply_that_is_not_a_completion_is_a_bad_reply() {
        let (_fake, url) = serve(vec![reply(200, json!({"nope": true}))]).await;
        let e = provider(&url, 0).complete(request()).await.unwrap_err();
        assert!(matches!(e, LlmError::BadReply(_)), "{e}");
    }

    #[test]
    fn config_is_checked_and_backoff_is_bounded() {
        assert!(matches!(
            OpenAiProvider::new(OpenAiConfig {
                base_url: "ftp://x".into(),
                ..Default::default()
            }),
            Err(OpenAiConfigError::BadBaseUrl(_))
        ));
        assert!(matches!(
            OpenAiProvider::new(OpenAiConfig {
                default_model: " ".into(),
                ..Default::default()
            }),
            Err(OpenAiConfigError::EmptyModel)
        ));
        let p = OpenAiProvider::new(OpenAiConfig {
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(1),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.endpoint(), "https://api.openai.com/v1/chat/completions");
        for retry in 0..40 {
            let d = p.backoff(retry);
            assert!(d <= Duration::from_secs(1), "{d:?}");
        }
        assert!(p.backoff(0) >= Duration::from_millis(100));
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "120".parse().unwrap());
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(RETRY_AFTER, "1.5".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        h.insert(
            RETRY_AFTER,
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
    }

    #[test]
    fn an_operators_schema_outside_strict_rules_goes_without_strict() {
        let req = |schema: Value| ChatRequest {
            phase: crate::llm::Phase::Flowchart,
            model: None,
            messages: vec![ChatMessage::user("classify")],
            tools: vec![],
            response_format: Some(crate::llm::JsonSchemaFormat {
                name: "pes_flowchart".into(),
                schema,
            }),
        };
        let loose = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
        let body = build_body(&req(loose.clone()), "m", false);
        assert_eq!(body["response_format"]["json_schema"]["strict"], false);
        assert_eq!(body["response_format"]["json_schema"]["schema"], loose);
        let tight = json!({"type": "object", "properties": {"answer": {"type": "string"}},
                           "required": ["answer"], "additionalProperties": false});
        let body = build_body(&req(tight), "m", false);
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
    }
}
