//! The `openai` provider: any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama,
//! llama.cpp, LiteLLM, OpenRouter, Groq, DeepSeek… and the test double).
//!
//! It owns the Chat Completions wire format (messages, native tool calling, `response_format`
//! json_schema, streamed chunks) and what a reply means: any 4xx other than 429 is a permanent
//! [`LlmError::Rejected`]; a provider that refuses `response_format` is asked once more with the
//! schema in the system prompt instead. Retries and the reading of replies are the shared
//! [`super::transport`]'s. A streamed reply (`stream: true` with usage included) is assembled
//! into the reply a non-streamed call returns, and parsed by the same code, so what is committed
//! does not depend on streaming; its text goes to the request's token sink as it arrives.

mod stream;
#[cfg(test)]
mod tests;
mod wire;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::Value;
use tracing::warn;

use super::transport::{
    Dialect, MAX_ERROR_BODY, Refusal, StreamedReply, Transport, TransportConfig,
};
use super::{ChatRequest, ChatResponse, LlmError, LlmProvider, truncate};
use stream::ChunkAssembler;
use wire::{build_body, parse_reply};

pub(crate) use wire::schema_instruction;

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

/// True when a 400 body says the provider does not accept our `response_format`.
fn refuses_response_format(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    b.contains("response_format") || b.contains("json_schema")
}

/// One call's request and what its replies mean.
struct Call<'a> {
    provider: &'a OpenAiProvider,
    request: &'a ChatRequest,
    model: &'a str,
    /// The schema went into the system prompt (the provider refused `response_format`).
    inline_schema: bool,
    body: Value,
}

impl Dialect for Call<'_> {
    fn request(&self) -> reqwest::RequestBuilder {
        let req = self
            .provider
            .transport
            .client
            .post(&self.provider.endpoint)
            .json(&self.body);
        match &self.provider.api_key {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    fn reader(&self) -> Box<dyn StreamedReply> {
        Box::new(ChunkAssembler::new(self.request.tokens.clone()))
    }

    fn parse(&self, body: &str) -> Result<ChatResponse, LlmError> {
        parse_reply(body)
    }

    fn refused(&mut self, status: StatusCode, body: &str) -> Refusal {
        if status == StatusCode::BAD_REQUEST
            && !self.inline_schema
            && self.request.response_format.is_some()
            && refuses_response_format(body)
        {
            warn!(
                model = self.model,
                "the provider refused response_format; retrying once with the schema in the prompt"
            );
            self.inline_schema = true;
            self.body = build_body(
                self.request,
                self.model,
                true,
                self.provider.transport.cfg.stream,
            );
            return Refusal::Again;
        }
        Refusal::Reject(LlmError::Rejected {
            status: status.as_u16(),
            body: truncate(body, MAX_ERROR_BODY),
        })
    }
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
        let model = request.model_or(&self.default_model);
        let mut call = Call {
            provider: self,
            request: &request,
            model: &model,
            inline_schema: false,
            body: build_body(&request, &model, false, self.transport.cfg.stream),
        };
        self.transport.call("openai", &model, &mut call).await
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
