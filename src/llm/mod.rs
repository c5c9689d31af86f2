//! Language-model providers behind one trait. `openai` speaks OpenAI-compatible Chat Completions
//! (any such endpoint, including the test double); `anthropic` speaks Anthropic's Messages API;
//! `offline` is deterministic and needs no network, the default when nothing is configured. The
//! agent never sees HTTP: it builds a [`ChatRequest`] and gets a [`ChatResponse`] back. A request
//! may carry a [`TokenSink`] ([`Tokens`]): a provider that streams hands it the reply's text as
//! the model writes it, and still returns the whole reply as if it had not streamed.
//! [`embeddings`] turns text into vectors (an OpenAI-compatible `/embeddings` endpoint) for the
//! memory store's semantic search.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::Usage;

pub mod anthropic;
pub mod embeddings;
pub mod instrumented;
pub mod labels;
pub mod offline;
pub mod openai;
pub mod strict;
pub mod structured;
#[cfg(test)]
mod test_server;
pub mod transport;

pub use strict::strict_mode_violations;

/// Which phase of the agent a request belongs to (for logs, metrics and the offline model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Plan,
    Execute,
    Synthesize,
    Compact,
    /// An `llm` stage of a flowchart.
    Flowchart,
}

/// Role of a chat message on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool call as the model made it. `arguments` is the parsed JSON object (the raw string when it
/// was not valid JSON, so the registry can report the error to the model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: Option<String>,
    /// Assistant messages: the tool calls it made.
    pub tool_calls: Vec<ToolCall>,
    /// Tool messages: the call this answers.
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn system(text: impl Into<String>) -> Self {
        Self {
            role: Role::System,
            content: Some(text.into()),
            tool_calls: vec![],
            tool_call_id: None,
        }
    }
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: Some(text.into()),
            tool_calls: vec![],
            tool_call_id: None,
        }
    }
    pub fn assistant(text: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: text,
            tool_calls,
            tool_call_id: None,
        }
    }
    pub fn tool(tool_call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: Some(text.into()),
            tool_calls: vec![],
            tool_call_id: Some(tool_call_id.into()),
        }
    }
}

/// A function the model may call (a tool's own description, so tools build it without
/// depending on the model layer).
pub use crate::model::ToolSpec;

/// Structured output: the reply must be JSON matching `schema` (sent as
/// `response_format: {type: "json_schema", json_schema: {name, strict: true, schema}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: String,
    pub schema: Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub phase: Phase,
    /// Model name; the provider's default when `None`.
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
    pub response_format: Option<JsonSchemaFormat>,
    /// Where the reply's text goes while it streams (nowhere by default).
    pub tokens: Tokens,
}

/// Where the text of a streamed reply goes as the model writes it. The agent sets one per request
/// (knowing the run, the item and the phase); nothing sent here is stored.
pub trait TokenSink: Send + Sync {
    /// Whether anyone listens now: a provider forwards nothing (and allocates nothing for it)
    /// when not.
    fn listening(&self) -> bool;
    /// The next piece of the reply's text, in order.
    fn delta(&self, text: &str);
}

/// The optional [`TokenSink`] of a [`ChatRequest`]. It is not part of what is asked of the
/// model: requests that differ only in their sinks are equal.
#[derive(Clone, Default)]
pub struct Tokens(Option<Arc<dyn TokenSink>>);

impl Tokens {
    /// A request whose text goes nowhere.
    pub fn none() -> Self {
        Self(None)
    }

    /// A request whose text goes to `sink`.
    pub fn to(sink: Arc<dyn TokenSink>) -> Self {
        Self(Some(sink))
    }

    /// Whether forwarding is worth anything now.
    pub fn listening(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.listening())
    }

    /// Forward a piece of text when someone listens (empty pieces are dropped).
    pub fn send(&self, text: &str) {
        if let Some(sink) = &self.0
            && !text.is_empty()
            && sink.listening()
        {
            sink.delta(text);
        }
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Tokens(sink)"
        } else {
            "Tokens(none)"
        })
    }
}

impl PartialEq for Tokens {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl ChatRequest {
    /// The model the request names, or `default` when it names none (or a blank one).
    pub fn model_or(&self, default: &str) -> String {
        self.model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| default.to_owned())
    }
}

/// The model's reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// Usage of this call (`llm_calls` = HTTP calls that returned a reply, retries included).
    pub usage: Usage,
    pub finish_reason: Option<String>,
    /// The model that answered, as the provider named it (it may be more precise than the one
    /// asked for, e.g. a dated version): for traces.
    pub model: Option<String>,
}

/// Why a model call failed after retries.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// 429/5xx/timeout/connection error still failing after the configured retries.
    #[error("the model provider is unavailable: {0}")]
    Unavailable(String),
    /// A 4xx the provider will keep answering (bad key, unknown model, bad request).
    #[error("the model provider rejected the request ({status}): {body}")]
    Rejected { status: u16, body: String },
    /// The reply could not be understood (not a chat completion or a message).
    #[error("the model's reply could not be read: {0}")]
    BadReply(String),
    /// The reply did not match the requested JSON schema, even after the repair attempt.
    #[error("the model's {schema} reply is not valid: {error}; it returned: {returned}")]
    InvalidStructured {
        schema: String,
        error: String,
        returned: String,
    },
    #[error("cancelled")]
    Cancelled,
}

impl LlmError {
    /// Stable code for `ERROR` observations and run errors.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "llm_unavailable",
            Self::Rejected { .. } => "llm_rejected",
            Self::BadReply(_) => "llm_bad_reply",
            Self::InvalidStructured { .. } => "llm_invalid_output",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A chat-completion backend.
#[async_trait]
pub trait LlmProvider: Send + Sync + 'static {
    /// Provider name (`openai`, `anthropic`, `offline`).
    fn name(&self) -> &'static str;

    /// True for the offline model: every run says it is not a real model.
    fn is_offline(&self) -> bool {
        false
    }

    /// The model a request that names none is sent to, so a run can report the model it
    /// actually uses; `None` when the provider cannot tell.
    fn default_model(&self) -> Option<&str> {
        None
    }

    /// One model call, with transient errors retried inside. A provider that streams sends the
    /// reply's text to `request.tokens` as it arrives; the reply returned is the same either way.
    ///
    /// # Errors
    /// [`LlmError`] after retries are exhausted or for a permanent rejection.
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError>;
}

pub use crate::model::ids::identifier_chars;

pub use crate::text::truncate;
