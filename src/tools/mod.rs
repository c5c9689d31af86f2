//! Tools the agent can call: the [`Tool`] trait, what a call produces ([`ToolOutcome`]) and the
//! tool sources. The [`ToolRegistry`] (in `registry.rs`) is the live catalogue: built-in tools
//! plus those discovered at run time (MCP servers), each with its argument schema compiled once.
//! A tool error or bad arguments become a tool result the model sees, never a crash.

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{Value, json};

use crate::model::SuspensionKind;

pub mod builtin;
pub mod debug;
pub mod http;
pub mod mcp;
pub mod memory;
mod registry;

pub use registry::{ServerInfo, ToolInfo, ToolRegistry, ToolServer};

/// What a tool knows about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub tenant: String,
    pub thread_id: String,
    /// Stable across retries of the same call (run id + tool call id): a tool with side effects can
    /// use it to make a repeated call harmless.
    pub idempotency_key: String,
    /// The memory namespace of the thread's config (`memoryNamespace`); `None`: the thread's own
    /// (`["threads", <threadId>]`). The memory tools work in it.
    pub memory_namespace: Option<Vec<String>>,
}

/// Why a tool call produced no output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool `{0}`")]
    Unknown(String),
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("{0}")]
    Failed(String),
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    /// The tool exists but cannot be called now (its server is down); the message says why.
    #[error("{0}")]
    Unavailable(String),
}

/// Where a tool comes from, as the catalogue (`GET /v1/tools`) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolSource {
    /// Compiled into the service.
    Builtin,
    /// Discovered on an MCP server the operator configured.
    Mcp,
    /// A registered flowchart mounted as a tool.
    Flowchart,
    /// Delegation to a remote A2A agent.
    A2a,
}

impl ToolSource {
    /// Every source, in declaration order.
    pub const ALL: &'static [ToolSource] = &[Self::Builtin, Self::Mcp, Self::Flowchart, Self::A2a];
}

/// A callable tool.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// JSON Schema of the arguments object.
    fn parameters(&self) -> Value;
    /// A blocking tool never runs by itself: every call suspends for a person (e.g. `ask_user`).
    fn blocking(&self) -> Option<SuspensionKind> {
        None
    }
    /// Whether a call may change something outside the service (send, write, pay). The engine
    /// starts a tool with side effects only once the model turn that asked for the call is
    /// committed, so if a later commit fails the re-claimed run finds that very call (same id,
    /// same [`ToolContext::idempotency_key`]) instead of asking the model again and running it
    /// under a new key. A pure tool (the same call can run twice with no harm) skips that
    /// commit: its turn is committed together with its result. Default: true; only a tool that
    /// is truly pure says false.
    fn side_effects(&self) -> bool {
        true
    }
    /// Where the tool comes from.
    fn source(&self) -> ToolSource {
        ToolSource::Builtin
    }
    /// The server that serves the tool (MCP), when there is one.
    fn server(&self) -> Option<&str> {
        None
    }
    /// Why a call cannot run right now (its server is down), or `None` when it can. The registry
    /// asks before every call, so the model reads the reason as the tool's error instead of
    /// waiting for a timeout.
    fn unavailable(&self) -> Option<String> {
        None
    }
    /// Checks the schema cannot express (e.g. that `ask_user`'s `inputSchema` is itself a usable
    /// schema), run by [`ToolRegistry::validate`] after the schema passed.
    ///
    /// # Errors
    /// [`ToolError::InvalidArguments`] naming the offending argument (`/inputSchema: …`): the
    /// model reads it as the call's error.
    fn check_arguments(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }
    /// Run the tool with arguments already validated against [`Tool::parameters`].
    ///
    /// # Errors
    /// [`ToolError::Failed`] with a message the model can act on.
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError>;
}

/// How long a tool may run when the registry was given no timeout.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// The outcome of one tool invocation, ready to journal as `{status, output, error?}` and to send
/// back to the model as the tool message.
///
/// On success `error` is `None` and `output` is the tool's output. On failure `error` says why and
/// `output` is `{"error": "<message>"}`, so the model always gets a readable tool result.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The tool's output, or `{"error": "<message>"}` when it failed.
    pub output: Value,
    /// Why the call failed; `None` on success.
    pub error: Option<ToolError>,
}

impl ToolOutcome {
    /// A successful call. Any NUL in the output becomes U+FFFD (see [`crate::model::scrub_nul`]).
    pub fn success(mut output: Value) -> Self {
        crate::model::scrub_nul(&mut output);
        Self {
            output,
            error: None,
        }
    }

    /// A failed call; `output` becomes `{"error": "<message>"}`.
    pub fn failure(error: ToolError) -> Self {
        let mut message = error.to_string();
        crate::model::scrub_nul_str(&mut message);
        Self {
            output: json!({ "error": message }),
            error: Some(error),
        }
    }

    /// True when the tool ran and returned an output.
    pub fn is_success(&self) -> bool {
        self.error.is_none()
    }

    /// `success` or `error`, as journaled and shown in `TOOL_EXECUTION`.
    pub fn status(&self) -> &'static str {
        if self.is_success() {
            "success"
        } else {
            "error"
        }
    }

    /// The error message, when the call failed.
    pub fn error_message(&self) -> Option<String> {
        self.error.as_ref().map(ToString::to_string)
    }

    /// `{status, output, error?}`.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "status": self.status(), "output": self.output });
        if let Some(e) = &self.error {
            v["error"] = Value::String(e.to_string());
        }
        v
    }

    /// The text of the `tool` message the model gets back: the output as JSON.
    pub fn to_model_text(&self) -> String {
        self.output.to_string()
    }
}
