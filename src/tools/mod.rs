//! Tools the agent can call: the [`Tool`] trait, the [`ToolRegistry`] that validates arguments
//! against each tool's JSON Schema before running it, and the built-in tools. A tool error or bad
//! arguments become a tool result the model sees, never a crash.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::model::SuspensionKind;

pub mod builtin;
pub mod schema;

/// What a tool knows about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub tenant: String,
    pub thread_id: String,
    /// Stable across retries of the same call (run id + tool call id): a tool with side effects can
    /// use it to make a repeated call harmless.
    pub idempotency_key: String,
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
    /// Run the tool with arguments already validated against [`Tool::parameters`].
    ///
    /// # Errors
    /// [`ToolError::Failed`] with a message the model can act on.
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError>;
}

/// Registered tools by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    timeout: Option<Duration>,
}
