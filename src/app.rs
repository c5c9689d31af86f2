//! Start-up and shutdown: [`App::build`] refuses an API open to other hosts that nothing says is
//! meant to be open, connects (waiting for a database that is still coming up) and migrates the
//! store, builds the engine, binds the listener (port 0 picks a free one) and prepares the
//! worker; [`App::run_until_stopped`] serves (with the webhook delivery loop and the cron
//! scheduler beside the worker) until the shutdown token fires, then drains: the
//! worker stops claiming, runs in flight get `PES_SHUTDOWN_GRACE_SECONDS` to finish, and whatever
//! is still running is released so another replica resumes it at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::agent::{Engine, EngineSettings};
use crate::commands::RunCommands;
use crate::commands::replicas;
use crate::config::Config;
use crate::events::EventBus;
use crate::http::serve::ServeSettings;
use crate::http::{self, AppState};
use crate::llm::LlmProvider;
use crate::llm::anthropic::{AnthropicConfig, AnthropicProvider};
use crate::llm::instrumented::Instrumented;
use crate::llm::offline::OfflineProvider;
use crate::llm::openai::{OpenAiConfig, OpenAiProvider};
use crate::llm::transport::TransportConfig;
use crate::redact::redact_url;
use crate::store::SqlStore;
use crate::store::postgres::PgStore;
use crate::store::sqlite::SqliteStore;
use crate::telemetry::metrics::Metrics;
use crate::tools::ToolRegistry;
use crate::tools::mcp::McpHub;
use crate::worker::{Stops, Worker, WorkerSettings};

/// Model providers by name.
pub type Providers = HashMap<String, Arc<dyn LlmProvider>>;

/// The first wait between two attempts to reach the database at start-up.
const DB_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two attempts (the wait doubles up to it).
const DB_RETRY_MAX: Duration = Duration::from_secs(5);
/// The longest one connection attempt may take (a host that drops packets never refuses).
const DB_ATTEMPT_MAX: Duration = Duration::from_secs(10);
/// The shortest one attempt is given, even when the wait has run out.
const DB_ATTEMPT_MIN: Duration = Duration::from_secs(1);

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Open the store `url` names: `postgres://…` or `sqlite://…`, in one attempt.
///
/// # Errors
/// An unsupported scheme, or the database cannot be reached or created.
pub async fn connect_store(url: &str, max_connections: u32) -> anyhow::Result<Arc<SqlStore>> {
    if is_postgres(url) {
        Ok(Arc::new(
            PgStore::connect(url, max_connections)
                .await
                .with_context(|| format!("connecting to Postgres at {}", redact_url(url)))?,
        ))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(
            SqliteStore::connect(url)
                .await
                .context("opening the SQLite store")?,
        ))
    } else {
        let scheme = url.split(':').next().unwrap_or_default();
        anyhow::bail!(
            "PES_DATABASE_URL must start with postgres:// or sqlite:// (got a `{scheme}:` URL)"
        )
    }
}

/// Open the store like [`connect_store`], waiting up to `wait` for a Postgres server that does not
/// answer yet: attempts are retried with a backoff from 100 ms doubling to 5 s, each retry logged
/// with the URL's password hidden. Errors that waiting cannot fix (a refused login, a missing
/// database, a bad URL) end the wait at once; SQLite is opened once.
///
/// # Errors
/// Those of [`connect_store`]; or the server still did not answer when `wait` ran out.
pub async fn connect_store_waiting(
    url: &str,
    max_connections: u32,
    wait: Duration,
) -> anyhow::Result<Arc<SqlStore>> {
    if !is_postgres(url) {
        return connect_store(url, max_connections).await;
    }
    let shown = redact_url(url);
    let started = tokio::time::Instant::now();
    let deadline = started + wait;
    let mut delay = DB_RETRY_FIRST;
    let mut attempt: u32 = 1;
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let budget = remaining.clamp(DB_ATTEMPT_MIN, DB_ATTEMPT_MAX);
        let error = match tokio::time::timeout(budget, PgStore::probe(url)).await {
            Ok(Ok(())) => return connect_store(url, max_connections).await,
            Ok(Err(e)) if crate::store::postgres::is_transient_connect_error(&e) => e.to_string(),
            Ok(Err(e)) => {
                return Err(
                    anyhow::Error::new(e).context(format!("connecting to Postgres at {shown}"))
                );
            }
            Err(_) => format!("no answer within {} ms", budget.as_millis()),
        };
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            anyhow::bail!(
                "Postgres at {shown} did not answer within {} s (PES_DB_CONNECT_TIMEOUT_SECONDS; \
                 {attempt} attempts): {error}",
                wait.as_secs()
            );
        }
        let pause = delay.min(remaining);
        warn!(
            database = %shown,
            attempt,
            retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            %error,
            "the database does not answer yet; retrying"
        );
        tokio::time::sleep(pause).await;
        delay = (delay * 2).min(DB_RETRY_MAX);
        attempt += 1;
    }
}

/// The model providers this configuration makes available, and the default one's name:
/// `offline` always; `openai` and `anthropic` when configured (as the default provider, or by
/// their own variables beside it), so a thread may name any of them.
///
/// # Errors
/// When an HTTP provider cannot be built (a base URL that is not http(s), an empty model).
pub fn build_providers(config: &Config) -> anyhow::Result<(Providers, String)> {
    let mut providers: HashMap<String, Arc<dyn LlmProvider>> = HashMap::new();
    providers.insert("offline".into(), Arc::new(OfflineProvider::new()));
    let transport = TransportConfig {
        timeout: Duration::from_secs(config.llm_timeout_seconds.max(1)),
        max_retries: config.llm_max_retries,
        max_in_flight: config.llm_max_in_flight as usize,
        stream: config.llm_stream,
        ..TransportConfig::default()
    };
    if let Some(ep) = config.openai_endpoint() {
        let cfg = OpenAiConfig {
            base_url: ep.base_url,
            api_key: ep.api_key,
            default_model: ep.model,
            transport: transport.clone(),
        };
        let p = OpenAiProvider::new(cfg).context("configuring the `openai` provider")?;
        providers.insert("openai".into(), Arc::new(p));
    }
    if let Some(ep) = config.anthropic_endpoint() {
        let cfg = AnthropicConfig {
            base_url: ep.base_url,
            api_key: ep.api_key,
            default_model: ep.model,
            max_tokens: config.anthropic_max_tokens,
            transport,
        };
        let p = AnthropicProvider::new(cfg).context("configuring the `anthropic` provider")?;
        providers.insert("anthropic".into(), Arc::new(p));
    }
    let name = config.provider().name();
    let model = providers
        .get(name)
        .and_then(|p| p.default_model())
        .unwrap_or("unknown")
        .to_owned();
    let mut available: Vec<&str> = providers.keys().map(String::as_str).collect();
    available.sort_unstable();
    info!(provider = name, %model, ?available, "default model provider");
    if name == "offline" {
        warn!(
            "no model is configured: runs use the OFFLINE model, a deterministic stand-in that is \
             not a real LLM. Set PES_LLM_BASE_URL and/or PES_LLM_API_KEY to use a real model."
        );
    }
    Ok((providers, name.to_owned()))
}

/// A built, bound, not yet serving service.
pub struct App {
    listener: TcpListener,
    addr: SocketAddr,
    state: AppState,
    /// The process's own handles for its background tasks (the doors reach them only through
    /// the use cases in `state`).
    store: Arc<crate::store::SqlStore>,
    commands: RunCommands,
    tracker: TaskTracker,
    worker: Worker,
    hard_stop: CancellationToken,
    tools_stop: CancellationToken,
    grace: Duration,
    /// This process's name on the leases it takes.
    owner: String,
}

impl App {
    /// Connect, migrate, build the engine and bind.
    ///
    /// # Errors
    /// The store cannot be opened or migrated, a provider cannot be built, or the address cannot
    /// be bound.
    pub async fn build(config: Config) -> anyhow::Result<App> {
        config.check_exposure()?;
        config.check_keys()?;
        let store = connect_store_waiting(
            &config.database_url,
            config.database_max_connections,
            Duration::from_secs(config.db_connect_timeout_seconds),
        )
        .await?;
        store.migrate().await.context("applying migrations")?;
        let store = Arc::new(
            Arc::unwrap_or_clone(store)
                .with_max_threads(config.tenant_max_threads)
                .with_max_steers(config.max_steers_per_run)
                .with_tenant_quotas(config.tenant_max_active_runs, config.tenant_max_flowcharts),
        );
        let metrics = Metrics::new();
        let (providers, default_provider) = build_providers(&config)?;
        metrics.configure_models(providers.values().filter_map(|p| p.default_model()));
        // Every model call is traced and counted, whatever the provider.
        let providers: Providers = providers
            .into_iter()
            .map(|(name, p)| (name, Instrumented::wrap(p, metrics.clone())))
            .collect();
        let mcp_servers =
            crate::tools::mcp::parse_servers(config.mcp_servers.as_deref().unwrap_or(""))?;
        let tools = ToolRegistry::with_builtins()
            .with_timeout(Duration::from_secs(config.tool_timeout_seconds.max(1)));
        let memory = build_memory(&config, &store)?;
        let access: Arc<dyn crate::tools::memory::MemoryAccess> = Arc::new(memory.clone());
        tools.register(Arc::new(crate::tools::memory::MemorySearchTool::new(
            access.clone(),
        )));
        tools.register(Arc::new(crate::tools::memory::MemoryPutTool::new(access)));
        if config.debug_tools {
            warn!("PES_DEBUG_TOOLS is on: the test-only `debug_sleep` tool is registered");
            tools.register(Arc::new(crate::tools::debug::DebugSleep::new(
                config.debug_tool_log.clone(),
            )));
        }
        register_http_tool(&config, &tools)?;
        let tracker = TaskTracker::new();
        // MCP connections outlive the drain (runs in flight may still call their tools) and end
        // once the worker has stopped.
        let tools_stop = CancellationToken::new();
        if !mcp_servers.is_empty() {
            let hub = McpHub::start(
                mcp_servers,
                &tools,
                config.mcp_settings(),
                &tracker,
                &tools_stop,
            );
            hub.wait_first_attempts(config.mcp_settings().connect_timeout)
                .await;
            info!(
                servers = hub.len(),
                tools = tools
                    .catalogue()
                    .iter()
                    .filter(|t| t.server.is_some())
                    .count(),
                "MCP servers configured"
            );
        }
        let a2a_agents =
            crate::a2a::client::config::parse(config.a2a_agents.as_deref().unwrap_or(""))?;
        // Read either way, so a bad PES_A2A_ALLOW stops the start before an agent is added.
        let a2a_net = crate::a2a::client::net::NetSettings::new(
            config.a2a_allow.as_deref(),
            config.a2a_max_bytes,
        )?;
        let remote_agents = if a2a_agents.is_empty() {
            None
        } else {
            let agents = crate::a2a::client::agents::RemoteAgents::start(
                a2a_agents,
                a2a_net,
                Duration::from_secs(config.a2a_card_refresh_seconds),
                &tracker,
                &tools_stop,
            )
            .await?;
            Some(agents)
        };
        let prices = crate::model::Prices::parse(config.model_prices.as_deref().unwrap_or(""))?;
        let allowed_models = crate::model::AllowedModels::new(
            config.allowed_models.as_deref(),
            providers.values().filter_map(|p| p.default_model()),
            &prices,
        );
        let tenant_budgets =
            crate::model::TenantBudgets::parse(config.tenant_budgets.as_deref().unwrap_or(""))?;
        let engine = Engine::new(
            providers,
            tools,
            EngineSettings {
                default_provider,
                max_items: config.max_items.max(1),
                max_iterations: config.max_iterations.max(1),
                step_output_chars: config.step_output_chars,
                strict_retries: config.strict_retries,
                suspension_ttl_seconds: config.suspension_ttl_seconds,
                max_parallel_items: config.max_parallel_items,
                compaction_threshold_chars: config.compaction_threshold_chars,
                max_team_depth: config.max_team_depth,
                decision_poll: Duration::from_millis(config.decision_poll_ms.max(10)),
                flowchart_max_steps: config.flowchart_max_steps,
                flowchart_expr: crate::flowchart::expr::Evaluator::new(
                    crate::flowchart::expr::ExprLimits {
                        max_value_bytes: usize::try_from(config.flowchart_max_value_bytes)
                            .unwrap_or(usize::MAX),
                        timeout: Duration::from_millis(config.flowchart_expr_timeout_ms),
                    },
                ),
                a2a_park_after: Duration::from_millis(config.a2a_park_after_ms),
                a2a_unreachable_for: Duration::from_secs(config.a2a_unreachable_seconds),
                tool_result_max_bytes: usize::try_from(config.tool_result_max_bytes)
                    .unwrap_or(usize::MAX),
                prices: Arc::new(prices),
                allowed_models: Arc::new(allowed_models),
                tenant_budgets: Arc::new(tenant_budgets),
                require_approval: config
                    .require_approval
                    .iter()
                    .map(|n| n.trim().to_owned())
                    .filter(|n| !n.is_empty())
                    .collect(),
                ..EngineSettings::default()
            },
        );
        let engine = engine.with_metrics(metrics.clone());
        let engine = Arc::new(match remote_agents {
            Some(agents) => engine.with_remote_agents(agents),
            None => engine,
        });
        let api_keys: HashMap<String, String> = config.parsed_api_keys().into_iter().collect();
        if api_keys.is_empty() && config.binds_beyond_loopback() {
            // Only reached with PES_ALLOW_UNAUTHENTICATED (check_exposure refused otherwise).
            warn!(
                bind = %config.bind,
                "PES_ALLOW_UNAUTHENTICATED is on and PES_API_KEYS is not set: ANYONE who can \
                 reach {} can use the API, every tenant's threads included, without a key",
                config.bind
            );
        } else if api_keys.is_empty() {
            warn!("PES_API_KEYS is not set: the API accepts requests without authentication");
        }
        warn_if_fd_limit_is_low(config.max_connections, u64::from(config.llm_max_in_flight));
        let listener = TcpListener::bind(config.bind)
            .await
            .with_context(|| format!("binding {}", config.bind))?;
        let addr = listener.local_addr()?;
        let mut config = config;
        match config.public_url.as_deref().map(str::trim) {
            // The card names the address actually bound (port 0 picks one).
            None => config.public_url = Some(format!("http://{addr}")),
            Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                anyhow::bail!("PES_PUBLIC_URL must be an http:// or https:// URL (got `{u}`)")
            }
            Some(_) => {}
        }
        // After the bind: the default hosts name the address bound and the public URL.
        let hosts = crate::http::hosts::HostPolicy::from_config(&config)?;
        // Read either way, so a bad PES_WEBHOOK_SECRET or PES_WEBHOOK_ALLOW stops the start.
        let webhooks = crate::webhooks::WebhookSettings::from_config(&config)?;
        let bus = EventBus::new();
        let commands = RunCommands::new(store.clone(), bus.clone());
        let hard_stop = CancellationToken::new();
        let shutdown = CancellationToken::new();
        // This process, as its leases name it (runs, webhook deliveries, cron ticks).
        let owner = format!("{}-{}", hostname(), crate::model::new_id());
        let worker = Worker::new(
            commands.clone(),
            engine.clone(),
            WorkerSettings {
                owner: owner.clone(),
                lease: config.lease(),
                concurrency: config.worker_concurrency,
                poll_interval: Duration::from_millis(config.poll_interval_ms.max(10)),
                heartbeat: config.heartbeat(),
            },
            Stops {
                drain: shutdown.clone(),
                hard_stop: hard_stop.clone(),
            },
        )
        .with_metrics(metrics.clone());
        let grace = Duration::from_secs(config.shutdown_grace_seconds);
        let config = Arc::new(config);
        let cases = crate::commands::UseCases::new(crate::commands::Handles {
            store: store.clone(),
            engine,
            config: config.clone(),
            commands: commands.clone(),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
            webhooks,
            memory,
        });
        let state = AppState {
            shutdown,
            metrics,
            api_keys: Arc::new(api_keys),
            operator_keys: Arc::new(config.parsed_operator_keys().into_iter().collect()),
            hosts: Arc::new(hosts),
            streams: crate::http::quota::StreamSlots::new(config.tenant_max_streams),
            config,
            cases,
        };
        Ok(App {
            listener,
            addr,
            state,
            store,
            commands,
            tracker,
            worker,
            hard_stop,
            tools_stop,
            grace,
            owner,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cancel it to shut the service down gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.state.shutdown.clone()
    }

    /// Serve and run agents until the shutdown token fires, then drain.
    ///
    /// # Errors
    /// The server failed.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let App {
            listener,
            addr,
            state,
            store,
            commands,
            tracker,
            worker,
            hard_stop,
            tools_stop,
            grace,
            owner,
        } = self;
        let console = format!(
            "{}/console",
            state
                .config
                .public_url
                .as_deref()
                .unwrap_or_default()
                .trim_end_matches('/')
        );
        info!(%addr, store = store.backend(), %console, "pes-server listening");
        info!("the web console is at {console}");
        let shutdown = state.shutdown.clone();
        tracker.spawn(crate::worker::sweep_suspensions(
            commands.clone(),
            Duration::from_millis(state.config.suspension_sweep_ms.max(10)),
            shutdown.clone(),
        ));
        replicas::spawn(
            &tracker,
            &commands,
            Duration::from_millis(state.config.stream_poll_ms.max(10)),
            &state.metrics,
            &shutdown,
        )
        .await?;
        tracker.spawn(crate::commands::retention::sweep_expired_threads(
            commands.clone(),
            crate::commands::retention::SweepSettings {
                default_ttl: state.config.thread_ttl_seconds,
                every: Duration::from_secs(state.config.retention_interval_seconds.max(1)),
                batch: state.config.retention_batch.max(1),
            },
            state.metrics.clone(),
            shutdown.clone(),
        ));
        tracker.spawn(crate::heap::trim_periodically(
            Duration::from_secs(state.config.memory_trim_seconds),
            shutdown.clone(),
        ));
        tracker.spawn(metrics_upkeep(state.metrics.clone(), shutdown.clone()));
        // Webhooks of runs that end here are sent at once, those of other replicas (and
        // retries) at the next look; they stop with the shutdown token, a delivery in flight
        // being sent again by whoever claims it next.
        tracker.spawn(crate::webhooks::deliver_until_stopped(
            store.clone(),
            state.cases.webhooks.clone(),
            owner.clone(),
            shutdown.clone(),
        ));
        if state.cases.webhooks.enabled() {
            info!("webhooks are on (PES_WEBHOOK_SECRET is set)");
        }
        tracker.spawn(crate::commands::crons::run_scheduler(
            state.cases.clone(),
            owner,
            Duration::from_millis(state.config.cron_poll_ms.max(10)),
            shutdown.clone(),
        ));
        tracker.spawn(crate::commands::memory::sweep_periodically(
            store.clone(),
            Duration::from_millis(state.config.store_sweep_ms),
            state.config.store_sweep_batch,
            shutdown.clone(),
        ));
        tracker.spawn(crate::commands::memory::embed_periodically(
            state.cases.memory.clone(),
            Duration::from_millis(state.config.embeddings_pass_ms),
            shutdown.clone(),
        ));
        let worker_task = tracker.spawn(worker.run(shutdown.clone()));
        let settings = ServeSettings::from_config(&state.config);
        let router = http::router(state);
        http::serve::serve(listener, router, settings, shutdown.clone()).await;
        info!("shutting down: no new runs are claimed");
        let mut worker_task = worker_task;
        if tokio::time::timeout(grace, &mut worker_task).await.is_err() {
            warn!(
                ?grace,
                "runs still in flight after the grace period: releasing them"
            );
            hard_stop.cancel();
            let _ = worker_task.await;
        }
        // The sweepers and the replica tasks end with the shutdown token; tool servers now.
        tools_stop.cancel();
        tracker.close();
        tracker.wait().await;
        info!("stopped");
        Ok(())
    }
}

/// How often histogram samples are folded into their buckets (the exporter's own default).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Keep the metrics' memory flat between scrapes, until `stop` fires.
async fn metrics_upkeep(metrics: Metrics, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(METRICS_UPKEEP) => metrics.upkeep(),
        }
    }
}

/// The memory store's use cases: with an embedder of `PES_EMBEDDINGS_MODEL` when it is set,
/// reached through the `openai` provider's base URL and key.
///
/// # Errors
/// An embeddings base URL that is not http(s), or an HTTP client that cannot be built.
fn build_memory(
    config: &Config,
    store: &Arc<SqlStore>,
) -> anyhow::Result<crate::commands::memory::Memory> {
    use crate::commands::memory::{Memory, MemorySettings};
    use crate::llm::embeddings::{Embedder, OpenAiEmbedder};
    let embedder: Option<Arc<dyn Embedder>> = match config.embeddings_model.as_deref() {
        None => None,
        Some(model) => {
            let ep = config.openai_endpoint();
            if ep.is_none() {
                warn!(
                    "PES_EMBEDDINGS_MODEL is set but no OpenAI-compatible provider is: embeddings \
                     go to the public OpenAI API without a key (set PES_LLM_BASE_URL, \
                     OPENAI_BASE_URL or OPENAI_API_KEY)"
                );
            }
            let (base, key) = match ep {
                Some(e) => (e.base_url, e.api_key),
                None => (crate::config::OPENAI_DEFAULT_BASE_URL.to_owned(), None),
            };
            let transport = TransportConfig {
                timeout: Duration::from_secs(config.embeddings_timeout_seconds),
                max_retries: 1,
                max_in_flight: config.llm_max_in_flight as usize,
                stream: false,
                ..TransportConfig::default()
            };
            let e = OpenAiEmbedder::new(&base, key, model, transport)
                .context("configuring the embeddings (PES_EMBEDDINGS_MODEL)")?;
            info!(model, endpoint = %redact_url(e.endpoint()), "memory search ranks by meaning");
            Some(Arc::new(e))
        }
    };
    Ok(Memory::new(
        store.clone(),
        embedder,
        MemorySettings {
            max_value_bytes: config.store_max_value_bytes,
            max_depth: usize::try_from(config.store_max_namespace_depth).unwrap_or(usize::MAX),
            max_offset: config.store_max_offset,
            max_items: config.tenant_max_store_items,
            semantic_candidates: u32::try_from(config.store_semantic_candidates)
                .unwrap_or(u32::MAX),
        },
    ))
}

/// Register `http_request` when `PES_HTTP_TOOL` is on. `PES_HTTP_TOOL_ALLOW` is parsed either
/// way, so a bad entry stops the start instead of surfacing when the tool is turned on.
fn register_http_tool(config: &Config, tools: &ToolRegistry) -> anyhow::Result<()> {
    use crate::tools::http::guard::AllowList;
    use crate::tools::http::{HttpRequestTool, HttpToolSettings};
    let allow = AllowList::parse(config.http_tool_allow.as_deref().unwrap_or(""))?;
    if !config.http_tool {
        if !allow.is_empty() {
            warn!(
                "PES_HTTP_TOOL_ALLOW is set but PES_HTTP_TOOL is off: no HTTP tool is registered"
            );
        }
        return Ok(());
    }
    let settings = HttpToolSettings {
        allow,
        max_bytes: usize::try_from(config.http_tool_max_bytes).unwrap_or(usize::MAX),
        timeout: Duration::from_secs(config.http_tool_timeout_seconds.max(1)),
    };
    let tool = HttpRequestTool::new(settings.clone()).context("building the HTTP tool's client")?;
    info!(
        allowed = %settings.allow,
        max_bytes = settings.max_bytes,
        timeout_seconds = settings.timeout.as_secs(),
        "PES_HTTP_TOOL is on: the `http_request` tool is registered; it reaches public \
         addresses, and beyond them only what PES_HTTP_TOOL_ALLOW allows"
    );
    if config.http_tool_timeout_seconds > config.tool_timeout_seconds {
        warn!(
            "PES_HTTP_TOOL_TIMEOUT_SECONDS is above PES_TOOL_TIMEOUT_SECONDS: the tool timeout \
             ends slow HTTP requests first"
        );
    }
    tools.register(Arc::new(tool));
    Ok(())
}

/// File descriptors kept for everything but client connections (database pool, SQLite files,
/// the model client, logs).
const FD_RESERVE: u64 = 256;

/// `PES_MAX_CONNECTIONS` and `PES_LLM_MAX_IN_FLIGHT` only protect the process if it can actually
/// open that many sockets: say so at start when the open-file limit is below them (Linux;
/// elsewhere nothing is checked).
fn warn_if_fd_limit_is_low(max_connections: u64, max_model_calls: u64) {
    let Some(limit) = open_file_limit() else {
        return;
    };
    if limit < max_connections + max_model_calls + FD_RESERVE {
        warn!(
            open_file_limit = limit,
            max_connections,
            max_model_calls,
            "the open-file limit (ulimit -n) is below PES_MAX_CONNECTIONS + PES_LLM_MAX_IN_FLIGHT \
             + {FD_RESERVE}: a flood of connections or of model calls can exhaust file \
             descriptors; raise the limit or lower those settings"
        );
    }
}

/// The soft `nofile` limit, from `/proc/self/limits`.
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "pes".into())
}
