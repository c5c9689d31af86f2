//! Tools the agent can call: the [`Tool`] trait, the [`ToolRegistry`] that validates arguments
//! against each tool's JSON Schema before running it, and the built-in tools. A tool error or bad
//! arguments become a tool result the model sees, never a crash.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tracing::warn;

use crate::llm::ToolSpec;
use crate::model::SuspensionKind;

pub mod builtin;
pub mod debug;
pub mod http;
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
    /// Checks the schema cannot express (e.g. that `ask_user`'s `inputSchema` is itself a usable
    /// schema), run by [`ToolRegistry::validate`] after the schema passed.
    ///
    /// # Errors
    /// A message naming the offending argument (`/inputSchema: …`).
    fn check_arguments(&self, _args: &Value) -> Result<(), String> {
        Ok(())
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

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry (no tools, the default timeout).
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with the built-in tools: `calculator`, `current_time` and `ask_user`.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        r.register(Arc::new(builtin::Calculator));
        r.register(Arc::new(builtin::CurrentTime));
        r.register(Arc::new(builtin::AskUser));
        r
    }

    /// Add a tool; one of the same name is replaced.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> &mut Self {
        self.tools.insert(tool.name().to_owned(), tool);
        self
    }

    /// The same registry with every call bounded by `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long one call may run.
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TOOL_TIMEOUT)
    }

    /// The tool registered under `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// True when a tool of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Whether a call of `name` may have side effects ([`Tool::side_effects`]); true for an
    /// unknown name (nothing is assumed pure that was not declared so).
    pub fn has_side_effects(&self, name: &str) -> bool {
        self.get(name).is_none_or(|t| t.side_effects())
    }

    /// Registered tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// Function specs of the enabled tools, sorted by name: those named in `filter` (a thread's
    /// `tools` config; unknown names are skipped), or every tool when `None`.
    pub fn specs(&self, filter: Option<&[String]>) -> Vec<ToolSpec> {
        self.tools
            .values()
            .filter(|t| filter.is_none_or(|f| f.iter().any(|n| n == t.name())))
            .map(|t| ToolSpec {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// Check a call's arguments against the tool's schema (and its own extra checks).
    ///
    /// # Errors
    /// [`ToolError::Unknown`] for an unregistered tool; [`ToolError::InvalidArguments`] naming
    /// every problem (arguments that are not a JSON object, each schema violation).
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ToolError> {
        let tool = self
            .get(name)
            .ok_or_else(|| ToolError::Unknown(name.to_owned()))?;
        match args {
            Value::Object(_) => {}
            Value::String(raw) => {
                return Err(ToolError::InvalidArguments(format!(
                    "the arguments must be a JSON object; got a string that is not valid JSON: {}",
                    crate::llm::truncate(raw, 200)
                )));
            }
            other => {
                let kind = match other {
                    Value::Null => "null",
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    _ => "an array",
                };
                return Err(ToolError::InvalidArguments(format!(
                    "the arguments must be a JSON object, got {kind}"
                )));
            }
        }
        schema::validate(&tool.parameters(), args)
            .map_err(|errors| ToolError::InvalidArguments(errors.join("; ")))?;
        tool.check_arguments(args)
            .map_err(ToolError::InvalidArguments)
    }

    /// Validate and run one call, bounded by the registry's timeout. Never panics and never
    /// returns an error: an unknown tool, bad arguments, a tool error, a timeout or a panicking
    /// tool all become a failed [`ToolOutcome`] the model can read.
    ///
    /// The caller checks [`Tool::blocking`] first: a blocking tool (`ask_user`) suspends the run
    /// instead of being invoked (invoking it anyway yields an error outcome).
    pub async fn invoke(&self, name: &str, args: Value, ctx: &ToolContext) -> ToolOutcome {
        if let Err(e) = self.validate(name, &args) {
            return ToolOutcome::failure(e);
        }
        let Some(tool) = self.get(name).cloned() else {
            return ToolOutcome::failure(ToolError::Unknown(name.to_owned()));
        };
        let timeout = self.timeout();
        let task_ctx = ctx.clone();
        // A task of its own: a panic in the tool becomes a JoinError, not a crashed worker.
        #[allow(clippy::disallowed_methods)] // short-lived, awaited (or aborted) right here
        let mut handle = tokio::spawn(async move { tool.call(args, &task_ctx).await });
        match tokio::time::timeout(timeout, &mut handle).await {
            Ok(Ok(Ok(output))) => ToolOutcome::success(output),
            Ok(Ok(Err(e))) => ToolOutcome::failure(e),
            Ok(Err(join)) => {
                let detail = if join.is_panic() {
                    let payload = join.into_panic();
                    payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no message".into())
                } else {
                    "cancelled".into()
                };
                warn!(tool = name, thread_id = %ctx.thread_id, %detail, "tool crashed");
                ToolOutcome::failure(ToolError::Failed(format!(
                    "the tool `{name}` crashed: {detail}"
                )))
            }
            Err(_) => {
                handle.abort();
                warn!(tool = name, thread_id = %ctx.thread_id, ?timeout, "tool timed out");
                ToolOutcome::failure(ToolError::TimedOut(timeout))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ToolContext {
        ToolContext {
            tenant: "default".into(),
            thread_id: "t1".into(),
            idempotency_key: "run:call_1".into(),
        }
    }

    struct Panics;
    #[async_trait]
    impl Tool for Panics {
        fn name(&self) -> &str {
            "panics"
        }
        fn description(&self) -> &str {
            "always panics"
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
            panic!("boom")
        }
    }

    struct Slow;
    #[async_trait]
    impl Tool for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn description(&self) -> &str {
            "never finishes"
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
            std::future::pending::<()>().await;
            Ok(Value::Null)
        }
    }

    #[test]
    fn builtins_are_registered_and_filtered_by_config() {
        let r = ToolRegistry::with_builtins();
        assert_eq!(r.names(), vec!["ask_user", "calculator", "current_time"]);
        assert_eq!(r.specs(None).len(), 3);
        let only = r.specs(Some(&["calculator".to_string(), "nope".to_string()]));
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].name, "calculator");
        assert_eq!(only[0].parameters["required"], json!(["expression"]));
        assert!(r.specs(Some(&[])).is_empty());
        assert!(r.get("ask_user").unwrap().blocking().is_some());
        assert!(r.get("calculator").unwrap().blocking().is_none());
        assert!(!r.has_side_effects("calculator"));
        assert!(!r.has_side_effects("current_time"));
        assert!(
            r.has_side_effects("nope"),
            "unknown tools are not assumed pure"
        );
    }

    #[test]
    fn validate_names_every_problem() {
        let r = ToolRegistry::with_builtins();
        assert_eq!(
            r.validate("nope", &json!({})),
            Err(ToolError::Unknown("nope".into()))
        );
        let Err(ToolError::InvalidArguments(msg)) =
            r.validate("calculator", &json!({"expression": 3, "extra": true}))
        else {
            panic!("expected invalid arguments")
        };
        assert!(
            msg.contains("/expression: expected string, got integer"),
            "{msg}"
        );
        assert!(msg.contains("/extra: unknown property"), "{msg}");
        let Err(ToolError::InvalidArguments(msg)) = r.validate("calculator", &json!("{oops"))
        else {
            panic!("expected invalid arguments")
        };
        assert!(msg.contains("not valid JSON: {oops"), "{msg}");
        assert!(matches!(
            r.validate("calculator", &json!([1])),
            Err(ToolError::InvalidArguments(m)) if m == "the arguments must be a JSON object, got an array"
        ));
        assert!(
            r.validate(
                "ask_user",
                &json!({"question": "q", "inputSchema": {"type": "x"}})
            )
            .is_err()
        );
        assert!(
            r.validate("calculator", &json!({"expression": "1"}))
                .is_ok()
        );
    }

    #[tokio::test]
    async fn invoke_runs_a_valid_call() {
        let r = ToolRegistry::with_builtins();
        let out = r
            .invoke("calculator", json!({"expression": "2^10"}), &ctx())
            .await;
        assert!(out.is_success());
        assert_eq!(
            out.to_json(),
            json!({"status": "success", "output": {"expression": "2^10", "result": 1024}})
        );
    }

    #[tokio::test]
    async fn invoke_turns_every_failure_into_an_error_outcome() {
        let mut r = ToolRegistry::with_builtins().with_timeout(Duration::from_millis(50));
        r.register(Arc::new(Panics)).register(Arc::new(Slow));

        let out = r.invoke("missing", json!({}), &ctx()).await;
        assert_eq!(out.error, Some(ToolError::Unknown("missing".into())));
        assert_eq!(out.to_json()["status"], "error");
        assert_eq!(out.to_json()["error"], "unknown tool `missing`");

        let out = r.invoke("calculator", json!({}), &ctx()).await;
        assert_eq!(
            out.error,
            Some(ToolError::InvalidArguments(
                "/expression: required property is missing".into()
            ))
        );

        let out = r
            .invoke("calculator", json!({"expression": "1/0"}), &ctx())
            .await;
        assert_eq!(
            out.error,
            Some(ToolError::Failed("division by zero".into()))
        );
        assert_eq!(out.output, json!({"error": "division by zero"}));

        let out = r.invoke("panics", json!({}), &ctx()).await;
        assert_eq!(
            out.error,
            Some(ToolError::Failed("the tool `panics` crashed: boom".into()))
        );

        let out = r.invoke("slow", json!({}), &ctx()).await;
        assert_eq!(
            out.error,
            Some(ToolError::TimedOut(Duration::from_millis(50)))
        );
    }
}
