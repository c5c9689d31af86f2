//! The `openai` provider: any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama,
//! llama.cpp, LiteLLM, OpenRouter, Groq, DeepSeek… and the test double).
//!
//! It owns the wire format of DESIGN §3 (messages, native tool calling, `response_format`
//! json_schema, streamed chunks) and what a reply means: any 4xx other than 429 is a permanent
//! [`LlmError::Rejected`]; a provider that refuses `response_format` is asked once more with the
//! schema in the system prompt instead. Retries and the reading of replies are the shared
//! [`super::transport`]'s. A streamed reply (`stream: true` with usage included) is assembled
//! into the reply a non-streamed call returns, and parsed by the same code, so what is committed
//! does not depend on streaming; its text goes to the request's token sink as it arrives.

use std::collections::BTreeMap;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{Map, Value, json};
use tracing::{debug, warn};

use super::transport::{
    Exchange, MAX_ERROR_BODY, Retrier, SseEvent, StreamFault, StreamReader, Transport,
    TransportConfig, is_transient,
};
use super::{
    ChatMessage, ChatRequest, ChatResponse, LlmError, LlmProvider, Role, Tokens, ToolCall, truncate,
};
use crate::model::Usage;

/// Settings of an [`OpenAiProvider`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiConfig {
    /// Base URL; the provider appends `/chat/completions` (a trailing `/` is ignored).
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Model used when a request names none.
    pub default_model: String,
    /// Timeouts, retries, the in-flight cap and streaming.
    pub transport: TransportConfig,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            default_model: "gpt-4o-mini".into(),
            transport: TransportConfig::default(),
        }
    }
}

/// Why a provider (`openai` or `anthropic`) could not be built.
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

/// `base` without white space and trailing `/`, when it is an http(s) URL.
///
/// # Errors
/// [`OpenAiConfigError::BadBaseUrl`] otherwise.
pub(crate) fn checked_base(base: &str) -> Result<String, OpenAiConfigError> {
    let trimmed = base.trim().trim_end_matches('/').to_owned();
    if !(trimmed.starts_with("http://") || trimmed.starts_with("https://")) {
        return Err(OpenAiConfigError::BadBaseUrl(base.to_owned()));
    }
    Ok(trimmed)
}

/// An OpenAI-compatible Chat Completions client.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    base_url: String,
    api_key: Option<String>,
    default_model: String,
    endpoint: String,
    transport: Transport,
}

impl OpenAiProvider {
    /// Build a provider (no network call is made).
    ///
    /// # Errors
    /// [`OpenAiConfigError`] for a base URL that is not http(s), an empty default model, or an
    /// HTTP client that cannot be built.
    pub fn new(cfg: OpenAiConfig) -> Result<Self, OpenAiConfigError> {
        let base = checked_base(&cfg.base_url)?;
        if cfg.default_model.trim().is_empty() {
            return Err(OpenAiConfigError::EmptyModel);
        }
        Ok(Self {
            endpoint: format!("{base}/chat/completions"),
            base_url: base,
            api_key: cfg.api_key,
            default_model: cfg.default_model,
            transport: Transport::new(cfg.transport)?,
        })
    }

    /// The URL requests are POSTed to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The base URL (for logs).
    pub fn base_url(&self) -> &str {
        &self.base_url
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

/// The text added to the system prompt when a provider refuses `response_format` (or, for
/// Anthropic, when the schema cannot be a tool's input).
pub(crate) fn schema_instruction(schema: &Value) -> String {
    format!("Reply with only a JSON object that matches this JSON Schema: {schema}")
}

/// The request body. With `inline_schema`, `response_format` is left out and the schema is put
/// in the system prompt instead.
fn build_body(req: &ChatRequest, model: &str, inline_schema: bool, stream: bool) -> Value {
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
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
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
    let v: Value = serde_json::from_str(body).map_err(|e| {
        LlmError::BadReply(format!(
            "not JSON ({e}): {}",
            truncate(body, MAX_ERROR_BODY)
        ))
    })?;
    parse_completion(v, body)
}

/// A chat completion (parsed, or assembled from a stream) as a [`ChatResponse`]; `raw` is what
/// an error quotes.
fn parse_completion(mut v: Value, raw: &str) -> Result<ChatResponse, LlmError> {
    // What a model writes is stored: no store may be handed a NUL.
    crate::model::scrub_nul(&mut v);
    let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
        return Err(LlmError::BadReply(format!(
            "no `choices[0]` in the reply: {}",
            truncate(raw, MAX_ERROR_BODY)
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

/// A tool call being assembled from its deltas.
#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Assembles a streamed completion (`chat.completion.chunk`s, then the usage chunk, then
/// `[DONE]`) into the completion a non-streamed call returns, forwarding content deltas to the
/// request's token sink (tool-call arguments are not text the model shows: they are not sent).
struct ChunkAssembler {
    tokens: Tokens,
    content: String,
    saw_content: bool,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    done: bool,
}

impl ChunkAssembler {
    fn new(tokens: Tokens) -> Self {
        Self {
            tokens,
            content: String::new(),
            saw_content: false,
            calls: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            done: false,
        }
    }

    /// The completion the chunks make (the shape of a non-streamed reply).
    fn completion(self) -> Value {
        let tool_calls: Vec<Value> = self
            .calls
            .into_iter()
            .map(|(i, c)| {
                json!({
                    "id": c.id.unwrap_or_else(|| format!("call_{}", i + 1)),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        // A reply that made tool calls and wrote no text has no content, as when not streamed.
        let content = if self.content.is_empty() && (!self.saw_content || !tool_calls.is_empty()) {
            Value::Null
        } else {
            Value::String(self.content)
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !tool_calls.is_empty() {
            message["tool_calls"] = tool_calls.into();
        }
        let mut reply = json!({
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        });
        if let Some(u) = self.usage {
            reply["usage"] = u;
        }
        reply
    }
}

impl StreamReader for ChunkAssembler {
    fn event(&mut self, event: SseEvent) -> Result<(), StreamFault> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() || self.done {
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            StreamFault::Fatal(LlmError::BadReply(format!(
                "a streamed chunk is not JSON ({e}): {}",
                truncate(data, MAX_ERROR_BODY)
            )))
        })?;
        if let Some(err) = chunk.get("error") {
            // A server that fails mid-stream says so in the stream.
            return Err(StreamFault::Transient(format!(
                "error in the stream: {err}"
            )));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return Ok(());
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(());
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.saw_content = true;
            self.content.push_str(text);
            self.tokens.send(text);
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (pos, call) in calls.iter().enumerate() {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(pos as u64);
                let partial = self.calls.entry(index).or_default();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    partial.id = Some(id.to_owned());
                }
                let function = call.get("function");
                if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
                    partial.name.push_str(name);
                }
                match function.and_then(|f| f.get("arguments")) {
                    Some(Value::String(piece)) => partial.arguments.push_str(piece),
                    Some(v @ Value::Object(_)) => partial.arguments.push_str(&v.to_string()),
                    _ => {}
                }
            }
        }
        Ok(())
    }
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
        Some(&self.default_model)
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let model = request
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| self.default_model.clone());
        let stream = self.transport.cfg.stream;
        let mut inline_schema = false;
        let mut body = build_body(&request, &model, inline_schema, stream);
        let mut replies: u64 = 0;
        let mut retrier = Retrier::new(&self.transport.cfg, "openai", &model);
        loop {
            let mut req = self.transport.client.post(&self.endpoint).json(&body);
            if let Some(key) = &self.api_key {
                req = req.bearer_auth(key);
            }
            let mut assembler = stream.then(|| ChunkAssembler::new(request.tokens.clone()));
            let exchange = self
                .transport
                .exchange(req, assembler.as_mut().map(|a| a as &mut dyn StreamReader))
                .await?;
            let (problem, wait) = match exchange {
                Exchange::Streamed => {
                    replies += 1;
                    let completion = assembler.take().map(ChunkAssembler::completion);
                    let completion = completion.unwrap_or(Value::Null);
                    let mut reply = parse_completion(completion.clone(), &completion.to_string())?;
                    reply.usage.llm_calls = replies;
                    debug!(model, calls = replies, "chat completion (streamed)");
                    return Ok(reply);
                }
                Exchange::Reply {
                    status,
                    retry_after,
                    body: text,
                } => {
                    replies += 1;
                    if status.is_success() {
                        let mut reply = parse_reply(&text)?;
                        reply.usage.llm_calls = replies;
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
                        body = build_body(&request, &model, inline_schema, stream);
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
                        retry_after,
                    )
                }
                Exchange::Failed(problem) => (problem, None),
            };
            retrier.transient(problem, wait).await?;
        }
    }
}

/// The transport settings of the unit tests: fast backoff, short timeout.
#[cfg(test)]
pub(crate) fn test_transport(max_retries: u32, stream: bool) -> TransportConfig {
    use std::time::Duration;
    TransportConfig {
        timeout: Duration::from_secs(5),
        max_retries,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        max_in_flight: 8,
        stream,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

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

    fn config(base_url: &str, max_retries: u32) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.into(),
            api_key: Some("sk-test".into()),
            default_model: "test-model".into(),
            transport: test_transport(max_retries, false),
        }
    }

    fn provider(base_url: &str, max_retries: u32) -> OpenAiProvider {
        OpenAiProvider::new(config(base_url, max_retries)).unwrap()
    }

    fn request() -> ChatRequest {
        ChatRequest {
            phase: Phase::Execute,
            model: None,
            messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
            tools: vec![],
            response_format: None,
            tokens: crate::llm::Tokens::none(),
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
        let mut cfg = config(&url, 1);
        cfg.transport.timeout = Duration::from_millis(300);
        let p = OpenAiProvider::new(cfg).unwrap();
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

    /// Records what a provider forwarded.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl crate::llm::TokenSink for Recorder {
        fn listening(&self) -> bool {
            true
        }
        fn delta(&self, text: &str) {
            self.0.lock().unwrap().push(text.to_owned());
        }
    }

    /// A streamed reply of these chunks (each a `data:` event), then `[DONE]`.
    fn sse(chunks: &[Value]) -> Scripted {
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        body.push_str("data: [DONE]\n\n");
        Scripted {
            status: 200,
            headers: vec![("content-type", "text/event-stream".into())],
            body,
        }
    }

    fn streaming(base_url: &str, max_retries: u32) -> OpenAiProvider {
        let mut cfg = config(base_url, max_retries);
        cfg.transport.stream = true;
        OpenAiProvider::new(cfg).unwrap()
    }

    #[tokio::test]
    async fn a_streamed_reply_is_the_reply_a_plain_call_returns_and_its_text_is_forwarded() {
        let delta =
            |d: Value| json!({"choices": [{"index": 0, "delta": d, "finish_reason": null}]});
        let (fake, url) = serve(vec![sse(&[
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "hel"})),
            delta(json!({"content": "lo"})),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
        ])])
        .await;
        let sink = Arc::new(Recorder::default());
        let mut req = request();
        req.tokens = crate::llm::Tokens::to(sink.clone());
        let streamed = streaming(&url, 0).complete(req).await.unwrap();
        // The same reply, not streamed.
        let (_fake2, url2) = serve(vec![ok_text("hello")]).await;
        let plain = provider(&url2, 0).complete(request()).await.unwrap();
        assert_eq!(streamed, plain);
        assert_eq!(*sink.0.lock().unwrap(), vec!["hel", "lo"]);
        let body = &fake.requests()[0];
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[tokio::test]
    async fn streamed_tool_calls_are_assembled_from_their_argument_deltas() {
        let calls = |c: Value| json!({"choices": [{"index": 0, "delta": {"tool_calls": c}}]});
        let (_fake, url) = serve(vec![sse(&[
            calls(json!([{"index": 0, "id": "a", "type": "function", "function": {"name": "calculator", "arguments": ""}}])),
            calls(json!([{"index": 0, "function": {"arguments": "{\"expression\":"}}])),
            calls(json!([{"index": 1, "id": "b", "type": "function", "function": {"name": "current_time", "arguments": "{}"}}])),
            calls(json!([{"index": 0, "function": {"arguments": "\"2^10\"}"}}])),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ])])
        .await;
        let sink = Arc::new(Recorder::default());
        let mut req = request();
        req.tokens = crate::llm::Tokens::to(sink.clone());
        let r = streaming(&url, 0).complete(req).await.unwrap();
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
                    arguments: json!({})
                },
            ]
        );
        // Arguments are not text the model shows.
        assert!(sink.0.lock().unwrap().is_empty());
        // No usage chunk: zeros, but the call is counted.
        assert_eq!(r.usage.llm_calls, 1);
    }

    #[tokio::test]
    async fn an_error_in_the_stream_is_retried_and_a_json_answer_to_a_stream_is_read() {
        let (fake, url) = serve(vec![
            sse(&[json!({"error": {"message": "overloaded"}})]),
            ok_text("plain"),
        ])
        .await;
        let r = streaming(&url, 1).complete(request()).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("plain"));
        assert_eq!(fake.requests().len(), 2);
    }

    #[test]
    fn config_is_checked() {
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
        let p = OpenAiProvider::new(OpenAiConfig::default()).unwrap();
        assert_eq!(p.endpoint(), "https://api.openai.com/v1/chat/completions");
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
            tokens: crate::llm::Tokens::none(),
        };
        let loose = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
        let body = build_body(&req(loose.clone()), "m", false, false);
        assert_eq!(body["response_format"]["json_schema"]["strict"], false);
        assert_eq!(body["response_format"]["json_schema"]["schema"], loose);
        let tight = json!({"type": "object", "properties": {"answer": {"type": "string"}},
                           "required": ["answer"], "additionalProperties": false});
        let body = build_body(&req(tight), "m", false, false);
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
    }
}
