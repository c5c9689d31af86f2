//! One MCP server's connection and the task that keeps it: connect (streamable HTTP or a stdio
//! child process), list its tools into the registry, re-list on `notifications/tools/list_changed`,
//! ping while idle so a dead server is noticed before a call needs it, and reconnect with
//! exponential backoff (and jitter) after any failure, for as long as the service runs. While the
//! server is not connected its tools stay in the catalogue as unavailable, and their calls fail
//! at once with a tool error that says why.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rand::Rng;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ClientRequest, Implementation, PingRequest,
};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::config::{ServerConfig, Transport};
use crate::tools::{Tool, ToolError, ToolRegistry, ToolServer, ToolSource};

/// How connections are kept and what a call may return: settings (`PES_MCP_*`).
#[derive(Debug, Clone, Copy)]
pub struct McpSettings {
    /// How long connecting and the MCP handshake may take.
    pub connect_timeout: Duration,
    /// How often an idle connection is pinged (and how long a ping may take).
    pub ping_interval: Duration,
    /// The first wait before reconnecting; it doubles after each failure.
    pub reconnect_min: Duration,
    /// The longest wait between reconnection attempts.
    pub reconnect_max: Duration,
    /// The most bytes of a tool's output kept (and shown to the model); the rest is cut off
    /// with a marker.
    pub max_output_bytes: usize,
}

impl Default for McpSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(10),
            max_output_bytes: 1024 * 1024,
        }
    }
}

/// Where a connection stands.
#[derive(Debug, Clone)]
enum State {
    /// The first attempt has not finished.
    Starting,
    /// Connected: calls go to this peer.
    Up(Peer<RoleClient>),
    /// Not connected; reconnecting in the background. The last error says why.
    Down(String),
}

/// A server's live connection, shared by its tools and the task that keeps it.
pub struct Connection {
    config: ServerConfig,
    /// The most bytes of a tool's output kept.
    pub(super) max_output_bytes: usize,
    state: RwLock<State>,
    /// Poked by `list_changed` (re-list) and by a call that lost the transport (check now).
    poke: Notify,
    /// Fired once the first connection attempt finished, either way.
    first_attempt: CancellationToken,
    /// The last line a stdio server wrote to stderr: often why it died.
    last_stderr: std::sync::Mutex<Option<String>>,
}

impl Connection {
    pub(super) fn new(config: ServerConfig, max_output_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            config,
            max_output_bytes,
            state: RwLock::new(State::Starting),
            poke: Notify::new(),
            first_attempt: CancellationToken::new(),
            last_stderr: std::sync::Mutex::new(None),
        })
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Resolves once the first connection attempt finished (connected or not).
    pub(super) async fn first_attempt_done(&self) {
        self.first_attempt.cancelled().await;
    }

    fn state(&self) -> State {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, state: State) {
        *self.state.write().unwrap_or_else(PoisonError::into_inner) = state;
    }

    /// Call a tool on the connected server.
    ///
    /// # Errors
    /// [`ToolError::Unavailable`] when not connected; [`ToolError::Failed`] for a protocol error
    /// or a connection lost during the call (which also makes the keeper check the server now).
    pub(super) async fn call_tool(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, ToolError> {
        let peer = match self.state() {
            State::Up(peer) => peer,
            _ => {
                return Err(ToolError::Unavailable(
                    self.unavailable().unwrap_or_default(),
                ));
            }
        };
        let tool = params.name.to_string();
        peer.call_tool(params).await.map_err(|e| match e {
            ServiceError::McpError(e) => ToolError::Failed(format!(
                "the MCP server `{}` refused the call of `{tool}`: {} (code {})",
                self.name(),
                e.message,
                e.code.0
            )),
            other => {
                self.poke.notify_one();
                ToolError::Failed(format!(
                    "the MCP server `{}` failed during the call of `{tool}` (it may or may not \
                     have run): {other}",
                    self.name()
                ))
            }
        })
    }
}

impl ToolServer for Connection {
    fn name(&self) -> &str {
        &self.config.name
    }
    fn source(&self) -> ToolSource {
        ToolSource::Mcp
    }
    fn unavailable(&self) -> Option<String> {
        match self.state() {
            State::Up(_) => None,
            State::Starting => Some(format!(
                "the MCP server `{}` is still connecting",
                self.name()
            )),
            State::Down(error) => Some(format!(
                "the MCP server `{}` is not connected (reconnecting in the background): {error}",
                self.name()
            )),
        }
    }
}

/// What the client tells servers, and where `list_changed` lands.
#[derive(Clone)]
struct Handler {
    connection: Arc<Connection>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        debug!(server = self.connection.name(), "MCP tools/list_changed");
        self.connection.poke.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.client_info = Implementation::new("pes-server", env!("CARGO_PKG_VERSION"));
        info
    }
}

/// Makes a tool of the registry from a tool a server lists (`None`: it cannot be one). Given
/// by the module above, so the connection does not depend on what a tool is made of.
pub(super) type Mount = fn(&Arc<Connection>, &rmcp::model::Tool) -> Option<Arc<dyn Tool>>;

/// Keep `connection` connected until `stop` fires, its tools mirrored into `registry`.
pub(super) async fn keep(
    connection: Arc<Connection>,
    registry: ToolRegistry,
    mount: Mount,
    timings: McpSettings,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let name = connection.name().to_owned();
    let mut backoff = timings.reconnect_min;
    let mut failures = 0u32;
    loop {
        let attempt = tokio::select! {
            () = stop.cancelled() => break,
            r = tokio::time::timeout(timings.connect_timeout, connect(&connection, &tracker)) => r,
        };
        let error = match attempt {
            Err(_) => format!("connecting timed out after {:?}", timings.connect_timeout),
            Ok(Err(e)) => e.to_string(),
            Ok(Ok(running)) => {
                match session(&connection, &registry, mount, running, timings, &stop).await {
                    Ended::Stopped => break,
                    Ended::Lost { error, was_up } => {
                        if was_up {
                            backoff = timings.reconnect_min;
                            failures = 0;
                        }
                        error
                    }
                }
            }
        };
        if failures == 0 {
            warn!(server = %name, %error, "MCP server not connected; reconnecting in the background");
        } else {
            debug!(server = %name, %error, failures, "MCP reconnection failed");
        }
        failures += 1;
        connection.set(State::Down(error));
        connection.first_attempt.cancel();
        // Equal jitter: half the wait fixed, half random, so servers restarted together are not
        // hammered in step.
        let half = backoff / 2;
        let wait = half + half.mul_f64(rand::rng().random::<f64>());
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
        backoff = (backoff * 2).min(timings.reconnect_max);
    }
    connection.first_attempt.cancel();
    connection.set(State::Down("the service is shutting down".into()));
}

/// How a session ended.
enum Ended {
    Stopped,
    Lost { error: String, was_up: bool },
}

/// One connected session: list the tools, then serve until the connection is lost or `stop`.
async fn session(
    connection: &Arc<Connection>,
    registry: &ToolRegistry,
    mount: Mount,
    running: RunningService<RoleClient, Handler>,
    timings: McpSettings,
    stop: &CancellationToken,
) -> Ended {
    let peer = running.peer().clone();
    let cancel = running.cancellation_token();
    let ended = running.waiting();
    tokio::pin!(ended);
    let lost = |error: String, was_up: bool| Ended::Lost { error, was_up };
    if let Err(e) = discover(connection, registry, mount, &peer).await {
        cancel.cancel();
        return lost(e.to_string(), false);
    }
    connection.set(State::Up(peer.clone()));
    connection.first_attempt.cancel();
    info!(server = connection.name(), "MCP server connected");
    let mut ping = tokio::time::interval(timings.ping_interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => {
                cancel.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut ended).await;
                return Ended::Stopped;
            }
            quit = &mut ended => {
                let last_words = connection
                    .last_stderr
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .map(|l| format!("; its last stderr line: {l}"))
                    .unwrap_or_default();
                let how = match quit {
                    Ok(rmcp::service::QuitReason::Closed) => "the server closed the connection".to_owned(),
                    Ok(other) => format!("the connection ended ({other:?})"),
                    Err(e) => format!("the connection task failed: {e}"),
                };
                return lost(format!("{how}{last_words}"), true);
            }
            () = connection.poke.notified() => {
                // A `list_changed`, or a call that lost the transport: re-listing checks both.
                if let Err(e) = discover(connection, registry, mount, &peer).await {
                    cancel.cancel();
                    return lost(e.to_string(), true);
                }
            }
            _ = ping.tick() => {
                let pinged = tokio::time::timeout(
                    timings.ping_interval.max(Duration::from_secs(1)),
                    peer.send_request(ClientRequest::PingRequest(PingRequest::default())),
                )
                .await;
                let error = match pinged {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => format!("ping failed: {}", root_cause(&e)),
                    Err(_) => "ping timed out".to_owned(),
                };
                cancel.cancel();
                return lost(error, true);
            }
        }
    }
}

/// List the server's tools and swap them into the registry.
async fn discover(
    connection: &Arc<Connection>,
    registry: &ToolRegistry,
    mount: Mount,
    peer: &Peer<RoleClient>,
) -> Result<(), SessionError> {
    let listed = peer.list_all_tools().await.map_err(SessionError::Listing)?;
    let mut tools: Vec<Arc<dyn Tool>> = Vec::with_capacity(listed.len());
    for t in &listed {
        match mount(connection, t) {
            Some(tool) => tools.push(tool),
            None => warn!(
                server = connection.name(),
                tool = %t.name,
                "MCP tool left out: its name cannot be a function name (1-64 characters)"
            ),
        }
    }
    let count = tools.len();
    for problem in registry.replace_server_tools(connection.name(), tools) {
        warn!(server = connection.name(), %problem, "MCP tool left out");
    }
    info!(
        server = connection.name(),
        tools = count,
        "MCP tools listed"
    );
    Ok(())
}

/// Open a session with the server.
async fn connect(
    connection: &Arc<Connection>,
    tracker: &TaskTracker,
) -> Result<RunningService<RoleClient, Handler>, SessionError> {
    let handler = Handler {
        connection: connection.clone(),
    };
    match &connection.config.transport {
        Transport::Http { url, headers } => {
            let client = crate::net::client_builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .map_err(SessionError::Client)?;
            let mut custom = HashMap::new();
            for (k, v) in headers {
                let (Ok(k), Ok(v)) = (k.parse(), v.parse()) else {
                    return Err(SessionError::Header(k.clone()));
                };
                custom.insert(k, v);
            }
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.clone()).custom_headers(custom);
            let transport = StreamableHttpClientTransport::with_client(client, config);
            handler
                .serve(transport)
                .await
                .map_err(|e| SessionError::Connect {
                    // The URL may carry credentials (user info, a token parameter): never shown.
                    url: crate::redact::redact_url(url.as_ref()),
                    cause: crate::redact::redact_urls_in(&root_cause(&e)),
                })
        }
        Transport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args)
                .env_clear()
                .envs(inherited_env())
                .envs(env)
                .kill_on_drop(true);
            let (process, stderr) = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|source| SessionError::Spawn {
                    command: command.clone(),
                    source,
                })?;
            if let Some(stderr) = stderr {
                // The server's own log lines, in ours at debug level (servers log every
                // request); the last one is kept to say why a server died.
                let connection = connection.clone();
                tracker.spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        debug!(server = connection.name(), "mcp stderr: {line}");
                        if !line.trim().is_empty() {
                            *connection
                                .last_stderr
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner) =
                                Some(crate::text::truncate(line.trim(), 300));
                        }
                    }
                });
            }
            handler.serve(process).await.map_err(|source| {
                let last_words = connection
                    .last_stderr
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .map(|l| format!("; its last stderr line: {l}"))
                    .unwrap_or_default();
                SessionError::Start {
                    command: command.clone(),
                    last_words,
                    source: Box::new(source),
                }
            })
        }
    }
}

/// Why a session could not be opened or its tools listed. The text is what the server's state
/// says (`State::Down`) and the log shows.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("listing tools failed: {}", root_cause(.0))]
    Listing(#[source] ServiceError),
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("the header `{0}` is not a valid HTTP header")]
    Header(String),
    /// Both texts redacted; the SDK's error is not kept, since its text may hold the URL's
    /// credentials.
    #[error("connecting to {url}: {cause}")]
    Connect { url: String, cause: String },
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting `{command}`: {}{last_words}", root_cause(&**source))]
    Start {
        command: String,
        /// `; its last stderr line: …`, when it wrote one.
        last_words: String,
        #[source]
        source: Box<rmcp::service::ClientInitializeError>,
    },
}

/// What went wrong, from an SDK error: the transport errors wrap the cause in several layers
/// whose text names Rust types; the innermost cause (with the one around it when it is terse,
/// like `Connection refused (os error 111)`) is what an operator can act on.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut chain: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        chain.push(s.to_string());
        source = s.source();
    }
    let last = without_type_names(&chain.pop().unwrap_or_default());
    match chain.pop() {
        Some(outer) if last.len() < 40 && outer.len() < 120 && !outer.contains('<') => {
            format!("{outer}: {last}")
        }
        _ => last,
    }
}

/// The text without the bracketed Rust type names some transport errors print
/// (`Transport [rmcp::transport::…<…>] error`).
fn without_type_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|c| open + c) else {
            break;
        };
        out.push_str(&rest[..open]);
        if !rest[open..close].contains("::") {
            out.push_str(&rest[open..=close]);
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a stdio server inherits of our environment: only what a program needs to run (`PATH` to
/// find its interpreter, `HOME`, the locale, the time zone). Everything else we hold (provider
/// keys, `PES_API_KEYS`, the database URL) stays ours; a server that needs a value gets it from
/// its own `env` in `PES_MCP_SERVERS`.
fn inherited_env() -> impl Iterator<Item = (String, String)> {
    const KEPT: [&str; 4] = ["PATH", "HOME", "LANG", "TZ"];
    KEPT.into_iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_owned(), v)))
}

#[cfg(test)]
mod tests {
    use super::without_type_names;

    #[test]
    fn type_names_leave_error_texts() {
        assert_eq!(
            without_type_names(
                "Send message error Transport [rmcp::transport::worker::WorkerTransport<X<Y>>] error: \
                 Client error: refused [code 7]"
            ),
            "Send message error Transport error: Client error: refused [code 7]"
        );
    }
}
