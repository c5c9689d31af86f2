//! The `anthropic` provider: Anthropic's Messages API (`POST {base}/v1/messages`, `x-api-key`,
//! `anthropic-version: 2023-06-01`, a required `max_tokens`).
//!
//! The wire format lives in `wire` (messages and blocks, the forced tool that carries structured
//! output, replies), the streamed reply's assembly in `stream`. This file owns the call: any 4xx
//! other than 429 is a permanent [`LlmError::Rejected`] carrying Anthropic's error message; 429,
//! 5xx, 529 (overloaded), timeouts, connection errors and errors inside a stream are retried by
//! the shared [`super::transport`] policy, honouring `retry-after`. A structured reply goes
//! through [`super::structured::complete_structured`] like any provider's: the forced tool's
//! input is the reply's content, so its repair rule works unchanged.

mod stream;
#[cfg(test)]
mod tests;
mod wire;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::Value;

use super::openai::{OpenAiConfigError, checked_base};
use super::transport::{
    Dialect, MAX_ERROR_BODY, Refusal, StreamedReply, Transport, TransportConfig,
};
use super::{ChatRequest, ChatResponse, LlmError, LlmProvider, truncate};
use stream::EventAssembler;
use wire::{Structured, build_body, error_message, parse_message};

/// The API version every request names.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Settings of an [`AnthropicProvider`].
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicConfig {
    /// Base URL (`https://api.anthropic.com`); the provider appends `/v1/messages` (just
    /// `/messages` to a base that already ends with `/v1`).
    pub base_url: String,
    /// Sent as `x-api-key` when set.
    pub api_key: Option<String>,
    /// Model used when a request names none.
    pub default_model: String,
    /// `max_tokens` of every request: the longest reply the model may write.
    pub max_tokens: u32,
    /// Timeouts, retries, the in-flight cap and streaming.
    pub transport: TransportConfig,
}

/// Anthropic's public API, used unless `ANTHROPIC_BASE_URL` names another.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.into(),
            api_key: None,
            default_model: "claude-sonnet-4-5".into(),
            max_tokens: 8192,
            transport: TransportConfig::default(),
        }
    }
}

/// An Anthropic Messages API client.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    endpoint: String,
    api_key: Option<String>,
    default_model: String,
    max_tokens: u32,
    transport: Transport,
}

impl AnthropicProvider {
    /// Build a provider (no network call is made).
    ///
    /// # Errors
    /// [`OpenAiConfigError`] for a base URL that is not http(s), an empty default model, or an
    /// HTTP client that cannot be built.
    pub fn new(cfg: AnthropicConfig) -> Result<Self, OpenAiConfigError> {
        let base = checked_base(&cfg.base_url)?;
        if cfg.default_model.trim().is_empty() {
            return Err(OpenAiConfigError::EmptyModel);
        }
        let endpoint = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        Ok(Self {
            endpoint,
            api_key: cfg.api_key,
            default_model: cfg.default_model,
            max_tokens: cfg.max_tokens.max(1),
            transport: Transport::new(cfg.transport)?,
        })
    }

    /// The URL requests are POSTed to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// One call's request and what its replies mean.
struct Call<'a> {
    provider: &'a AnthropicProvider,
    request: &'a ChatRequest,
    /// The structured request's forced tool.
    forced: Option<String>,
    body: Value,
}

impl Dialect for Call<'_> {
    fn request(&self) -> reqwest::RequestBuilder {
        let req = self
            .provider
            .transport
            .client
            .post(&self.provider.endpoint)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(&self.body);
        match &self.provider.api_key {
            Some(key) => req.header("x-api-key", key),
            None => req,
        }
    }

    fn reader(&self) -> Box<dyn StreamedReply> {
        Box::new(EventAssembler::new(
            self.request.tokens.clone(),
            self.forced.clone(),
        ))
    }

    fn parse(&self, body: &str) -> Result<ChatResponse, LlmError> {
        let parsed = serde_json::from_str(body).map_err(|e| {
            LlmError::BadReply(format!(
                "not JSON ({e}): {}",
                truncate(body, MAX_ERROR_BODY)
            ))
        })?;
        parse_message(parsed, self.forced.as_deref(), body)
    }

    fn refused(&mut self, status: StatusCode, body: &str) -> Refusal {
        Refusal::Reject(LlmError::Rejected {
            status: status.as_u16(),
            body: error_message(body),
        })
    }

    fn describe(&self, body: &str) -> String {
        error_message(body)
    }
}

#[async_trait]
impl LlmProvider for AnthropicProvider {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn default_model(&self) -> Option<&str> {
        Some(&self.default_model)
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let model = request.model_or(&self.default_model);
        let mut call = Call {
            provider: self,
            request: &request,
            forced: Structured::of(&request).tool().map(str::to_owned),
            body: build_body(&request, &model, self.max_tokens, self.transport.cfg.stream),
        };
        self.transport.call("anthropic", &model, &mut call).await
    }
}
