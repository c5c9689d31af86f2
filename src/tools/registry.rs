//! The live tool catalogue. Built-in tools are registered at start; tools served by outside
//! servers (MCP) come and go while the service runs (discovery, `list_changed`, a server that
//! dies and comes back), so the catalogue is shared by every clone of the registry and swapped
//! a server at a time. Each tool's argument schema is compiled once, when it is registered.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tracing::warn;

use super::{DEFAULT_TOOL_TIMEOUT, Tool, ToolContext, ToolError, ToolOutcome, ToolSource, builtin};
use crate::json::schema::{CompiledSchema, SchemaError};
use crate::model::ToolSpec;

/// A server that serves tools (an MCP server): whether it can take calls now. Declared to the
/// registry before its tools are known, so names under it (`<server>__<tool>`) are accepted in
/// a thread's config while it is down, and a call of one gets the server's reason.
pub trait ToolServer: Send + Sync + 'static {
    /// The server's name: its tools are named `<name>__<tool>`.
    fn name(&self) -> &str;
    /// What kind of source it is.
    fn source(&self) -> ToolSource;
    /// Why it cannot take calls now, or `None` when it can.
    fn unavailable(&self) -> Option<String>;
}

/// One tool as `GET /v1/tools` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolInfo {
    /// The name a thread's `tools` and `requireApproval` use, and the model calls.
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    #[schema(value_type = Object)]
    pub parameters: Value,
    pub source: ToolSource,
    /// The server that serves it (MCP tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// False while its server is down: calls fail with a tool error that says why.
    pub available: bool,
    /// Why it is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
}

/// One declared tool server as `GET /v1/tools` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerInfo {
    pub name: String,
    pub source: ToolSource,
    pub available: bool,
    /// How many tools it serves now.
    pub tools: usize,
    /// Why it is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
}

#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    schema: Arc<CompiledSchema>,
}

#[derive(Default)]
struct Catalogue {
    tools: BTreeMap<String, Entry>,
    servers: BTreeMap<String, Arc<dyn ToolServer>>,
}

/// Registered tools by name. Clones share one catalogue: a tool registered (or a server's tools
/// replaced) through any clone is seen by all.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    catalogue: Arc<RwLock<Catalogue>>,
    timeout: Option<Duration>,
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
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
        let r = Self::new();
        r.register(Arc::new(builtin::Calculator))
            .register(Arc::new(builtin::CurrentTime))
            .register(Arc::new(builtin::AskUser));
        r
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Catalogue> {
        // A panic while holding the lock left a consistent map (every write is one insert or
        // one swap), so a poisoned lock is used as is.
        self.catalogue
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Catalogue> {
        self.catalogue
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Add a tool (one of the same name is replaced), compiling its schema.
    ///
    /// # Errors
    /// The tool's `parameters` is not a usable JSON Schema; the tool is not registered.
    pub fn try_register(&self, tool: Arc<dyn Tool>) -> Result<(), SchemaError> {
        let entry = compile(tool)?;
        let name = entry.tool.name().to_owned();
        self.write().tools.insert(name, entry);
        Ok(())
    }

    /// Add a tool; one whose schema does not compile is left out with a warning.
    pub fn register(&self, tool: Arc<dyn Tool>) -> &Self {
        let name = tool.name().to_owned();
        if let Err(e) = self.try_register(tool) {
            warn!(tool = %name, error = %e, "tool left out: its parameters schema is unusable");
        }
        self
    }

    /// Declare a server whose tools are registered (and replaced) with
    /// [`ToolRegistry::replace_server_tools`].
    pub fn declare_server(&self, server: Arc<dyn ToolServer>) {
        let name = server.name().to_owned();
        self.write().servers.insert(name, server);
    }

    /// Swap the tools of `server` for `tools` at once (a discovery or a `list_changed`), and
    /// return the problems: tools left out because their schema does not compile, or whose name
    /// is taken by a tool of another source.
    pub fn replace_server_tools(&self, server: &str, tools: Vec<Arc<dyn Tool>>) -> Vec<String> {
        let mut problems = Vec::new();
        let mut fresh = Vec::with_capacity(tools.len());
        for tool in tools {
            let name = tool.name().to_owned();
            match compile(tool) {
                Ok(entry) => fresh.push((name, entry)),
                Err(e) => problems.push(format!("`{name}` left out: {e}")),
            }
        }
        let mut cat = self.write();
        cat.tools.retain(|_, e| e.tool.server() != Some(server));
        for (name, entry) in fresh {
            if cat.tools.contains_key(&name) {
                problems.push(format!("`{name}` left out: a tool of that name exists"));
                continue;
            }
            cat.tools.insert(name, entry);
        }
        problems
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
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.read().tools.get(name).map(|e| e.tool.clone())
    }

    /// True when a tool of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.read().tools.contains_key(name)
    }

    /// The `tool` label a call of `name` is counted under in `/metrics`: only names the operator
    /// configured, never a tenant's. A built-in (or configured HTTP) tool is its name, an MCP tool
    /// `mcp:<server>`, a delegation `a2a:<agent>` (an agent the tool offers, else `a2a:other`),
    /// anything else (a flowchart is labelled by the caller, a name the model made up) `other`.
    pub fn metric_label(&self, name: &str, args: &Value) -> String {
        let cat = self.read();
        let Some(entry) = cat.tools.get(name) else {
            return "other".into();
        };
        let tool = &entry.tool;
        match tool.source() {
            ToolSource::Builtin => name.to_owned(),
            ToolSource::Mcp => format!("mcp:{}", tool.server().unwrap_or("other")),
            ToolSource::Flowchart => "flowchart".into(),
            ToolSource::A2a => {
                let params = tool.parameters();
                let offered = params["properties"]["agent"]["enum"].as_array();
                match args.get("agent").and_then(Value::as_str) {
                    Some(a) if offered.is_some_and(|l| l.iter().any(|v| v == a)) => {
                        format!("a2a:{a}")
                    }
                    _ => "a2a:other".into(),
                }
            }
        }
    }

    /// True when `name` may be named in a thread's config: a registered tool, or a tool under a
    /// declared server that cannot say what it serves right now (it is down).
    pub fn is_known(&self, name: &str) -> bool {
        let cat = self.read();
        cat.tools.contains_key(name)
            || server_of(&cat, name).is_some_and(|s| s.unavailable().is_some())
    }

    /// Whether a call of `name` may have side effects ([`Tool::side_effects`]); true for an
    /// unknown name (nothing is assumed pure that was not declared so).
    pub fn has_side_effects(&self, name: &str) -> bool {
        self.get(name).is_none_or(|t| t.side_effects())
    }

    /// Registered tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().tools.keys().cloned().collect()
    }

    /// Function specs of the enabled tools, sorted by name: those named in `filter` (a thread's
    /// `tools` config; unknown names are skipped), or every tool when `None`. A tool whose server
    /// is down stays offered: its call explains the outage to the model.
    pub fn specs(&self, filter: Option<&[String]>) -> Vec<ToolSpec> {
        self.read()
            .tools
            .values()
            .filter(|e| filter.is_none_or(|f| f.iter().any(|n| n == e.tool.name())))
            .map(|e| ToolSpec {
                name: e.tool.name().to_owned(),
                description: e.tool.description().to_owned(),
                parameters: e.tool.parameters(),
            })
            .collect()
    }

    /// Every tool, sorted by name, as the catalogue shows it.
    pub fn catalogue(&self) -> Vec<ToolInfo> {
        self.read()
            .tools
            .values()
            .map(|e| {
                let reason = e.tool.unavailable();
                ToolInfo {
                    name: e.tool.name().to_owned(),
                    description: e.tool.description().to_owned(),
                    parameters: e.tool.parameters(),
                    source: e.tool.source(),
                    server: e.tool.server().map(str::to_owned),
                    available: reason.is_none(),
                    unavailable_reason: reason,
                }
            })
            .collect()
    }

    /// Every declared server, sorted by name.
    pub fn servers(&self) -> Vec<ServerInfo> {
        let cat = self.read();
        cat.servers
            .values()
            .map(|s| {
                let reason = s.unavailable();
                ServerInfo {
                    name: s.name().to_owned(),
                    source: s.source(),
                    available: reason.is_none(),
                    tools: cat
                        .tools
                        .values()
                        .filter(|e| e.tool.server() == Some(s.name()))
                        .count(),
                    unavailable_reason: reason,
                }
            })
            .collect()
    }

    /// The registered entry, or why there is none: an unknown name, or a name under a server
    /// that is down (its tools are not known until it answers).
    fn entry(&self, name: &str) -> Result<Entry, ToolError> {
        let cat = self.read();
        if let Some(e) = cat.tools.get(name) {
            return Ok(e.clone());
        }
        match server_of(&cat, name).and_then(|s| s.unavailable()) {
            Some(reason) => Err(ToolError::Unavailable(format!(
                "the tool `{name}` is unavailable: {reason}"
            ))),
            None => Err(ToolError::Unknown(name.to_owned())),
        }
    }

    /// Check a call's arguments against the tool's schema (and its own extra checks).
    ///
    /// # Errors
    /// [`ToolError::Unknown`] for an unregistered tool, [`ToolError::Unavailable`] for one under
    /// a server that is down; [`ToolError::InvalidArguments`] naming every problem (arguments
    /// that are not a JSON object, each schema violation with its JSON path).
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ToolError> {
        let entry = self.entry(name)?;
        check_object(args)?;
        entry
            .schema
            .validate(args)
            .map_err(|errors| ToolError::InvalidArguments(errors.join("; ")))?;
        entry.tool.check_arguments(args)
    }

    /// Validate and run one call, bounded by the registry's timeout. Never panics and never
    /// returns an error: an unknown or unavailable tool, bad arguments, a tool error, a timeout
    /// or a panicking tool all become a failed [`ToolOutcome`] the model can read.
    ///
    /// The caller checks [`Tool::blocking`] first: a blocking tool (`ask_user`) suspends the run
    /// instead of being invoked (invoking it anyway yields an error outcome).
    pub async fn invoke(&self, name: &str, args: Value, ctx: &ToolContext) -> ToolOutcome {
        if let Err(e) = self.validate(name, &args) {
            return ToolOutcome::failure(e);
        }
        let Ok(Entry { tool, .. }) = self.entry(name) else {
            return ToolOutcome::failure(ToolError::Unknown(name.to_owned()));
        };
        if let Some(reason) = tool.unavailable() {
            return ToolOutcome::failure(ToolError::Unavailable(format!(
                "the tool `{name}` is unavailable: {reason}"
            )));
        }
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

/// The tool with its schema compiled.
fn compile(tool: Arc<dyn Tool>) -> Result<Entry, SchemaError> {
    let schema = CompiledSchema::compile(&tool.parameters())?;
    Ok(Entry {
        tool,
        schema: Arc::new(schema),
    })
}

/// The declared server `name` would belong to (`<server>__<tool>`).
fn server_of<'a>(cat: &'a Catalogue, name: &str) -> Option<&'a Arc<dyn ToolServer>> {
    let (server, tool) = name.split_once("__")?;
    if tool.is_empty() {
        return None;
    }
    cat.servers.get(server)
}

/// Arguments must be a JSON object; say plainly what they were instead.
fn check_object(args: &Value) -> Result<(), ToolError> {
    let kind = match args {
        Value::Object(_) => return Ok(()),
        Value::String(raw) => {
            return Err(ToolError::InvalidArguments(format!(
                "the arguments must be a JSON object; got a string that is not valid JSON: {}",
                crate::text::truncate(raw, 200)
            )));
        }
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::Array(_) => "an array",
    };
    Err(ToolError::InvalidArguments(format!(
        "the arguments must be a JSON object, got {kind}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolSource;
    use async_trait::async_trait;
    use serde_json::json;

    fn ctx() -> ToolContext {
        ToolContext {
            tenant: "default".into(),
            thread_id: "t1".into(),
            idempotency_key: "run:call_1".into(),
            memory_namespace: None,
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
            msg.contains("/expression: 3 is not of type \"string\""),
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
        let r = ToolRegistry::with_builtins().with_timeout(Duration::from_millis(50));
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

    /// A served tool whose server's state the test flips.
    struct Served {
        name: String,
        down: Arc<std::sync::atomic::AtomicBool>,
        schema: Value,
    }
    #[async_trait]
    impl Tool for Served {
        fn name(&self) -> &str {
            &self.name
        }
        fn description(&self) -> &str {
            "served"
        }
        fn parameters(&self) -> Value {
            self.schema.clone()
        }
        fn source(&self) -> ToolSource {
            ToolSource::Mcp
        }
        fn server(&self) -> Option<&str> {
            Some("srv")
        }
        fn unavailable(&self) -> Option<String> {
            self.down
                .load(std::sync::atomic::Ordering::SeqCst)
                .then(|| "the server `srv` is down".to_owned())
        }
        async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
            Ok(json!("ran"))
        }
    }
    struct Srv(Arc<std::sync::atomic::AtomicBool>);
    impl ToolServer for Srv {
        fn name(&self) -> &str {
            "srv"
        }
        fn source(&self) -> ToolSource {
            ToolSource::Mcp
        }
        fn unavailable(&self) -> Option<String> {
            self.0
                .load(std::sync::atomic::Ordering::SeqCst)
                .then(|| "the server `srv` is down".to_owned())
        }
    }

    #[tokio::test]
    async fn a_servers_tools_are_swapped_at_once_and_follow_its_state() {
        let r = ToolRegistry::with_builtins();
        let clone = r.clone();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
        r.declare_server(Arc::new(Srv(down.clone())));
        // Down before discovery: its names are accepted in a config, calls say why they fail.
        assert!(r.is_known("srv__anything"));
        assert!(!r.is_known("other__anything"));
        let out = r.invoke("srv__echo", json!({}), &ctx()).await;
        assert_eq!(
            out.error,
            Some(ToolError::Unavailable(
                "the tool `srv__echo` is unavailable: the server `srv` is down".into()
            ))
        );
        let served = |name: &str, schema: Value| -> Arc<dyn Tool> {
            Arc::new(Served {
                name: name.into(),
                down: down.clone(),
                schema,
            })
        };
        let problems = r.replace_server_tools(
            "srv",
            vec![
                served("srv__echo", json!({"type": "object"})),
                served("srv__bad", json!({"type": 7})),
                served("calculator", json!({"type": "object"})),
            ],
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("`srv__bad` left out: schema at /type"),
            "{problems:?}"
        );
        assert!(problems[1].contains("`calculator` left out: a tool of that name exists"));
        assert!(clone.contains("srv__echo"), "clones share the catalogue");
        down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(
            !r.is_known("srv__anything"),
            "an answering server says what it serves"
        );
        let out = r.invoke("srv__echo", json!({}), &ctx()).await;
        assert_eq!(out.output, json!("ran"));
        let info = r.catalogue();
        let echo = info.iter().find(|t| t.name == "srv__echo").unwrap();
        assert_eq!(
            (echo.source, echo.server.as_deref(), echo.available),
            (ToolSource::Mcp, Some("srv"), true)
        );
        assert_eq!(r.servers()[0].tools, 1);
        down.store(true, std::sync::atomic::Ordering::SeqCst);
        let out = r.invoke("srv__echo", json!({}), &ctx()).await;
        assert!(
            matches!(out.error, Some(ToolError::Unavailable(_))),
            "{out:?}"
        );
        assert!(
            !r.catalogue()
                .iter()
                .find(|t| t.name == "srv__echo")
                .unwrap()
                .available
        );
        // A new discovery replaces the server's tools and leaves the others alone.
        r.replace_server_tools("srv", vec![served("srv__other", json!({"type": "object"}))]);
        assert!(!r.contains("srv__echo") && r.contains("srv__other") && r.contains("calculator"));
    }
}
