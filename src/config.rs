//! Every setting of the service: a command-line flag and a `PES_*` environment variable each, with
//! the default and the reason in the doc comment (which is also what `pes-server --help` prints).
//!
//! Trace export is the exception: it is configured by the standard OpenTelemetry variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_TRACES_EXPORTER`,
//! `OTEL_SDK_DISABLED`, `OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`, …), read by
//! [`crate::telemetry::otel`] and the OpenTelemetry crates, so a deployment configures this service
//! as it configures every other one; the configuration chapter of the book (docs/src/operations/configuration.md) lists them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// The settings alone, read from the environment (the command line is [`crate::cli::Cli`]).
#[derive(Parser)]
#[command(name = "pes-server")]
struct EnvOnly {
    #[command(flatten)]
    config: Config,
}

/// Which model provider serves runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// Any OpenAI-compatible Chat Completions endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
    /// Deterministic, no network; not a real model.
    Offline,
}

impl ProviderKind {
    /// The provider's name in thread configs (`provider`) and run observations.
    pub fn name(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
            Self::Offline => "offline",
        }
    }
}

/// Where one HTTP provider is reached and with what, resolved from the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderEndpoint {
    pub base_url: String,
    pub api_key: Option<String>,
    /// The model of requests that name none.
    pub model: String,
}

/// `openai`'s base URL when nothing else is said.
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// `anthropic`'s base URL when nothing else is said.
pub use crate::llm::anthropic::DEFAULT_BASE_URL as ANTHROPIC_DEFAULT_BASE_URL;

pub use crate::telemetry::LogFormat;

/// Service configuration.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Listen address (`127.0.0.1:0` picks a free port).
    #[arg(long, env = "PES_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,

    /// `postgres://…` selects Postgres; `sqlite://…` the embedded store (file and folder created
    /// when missing).
    #[arg(
        long,
        env = "PES_DATABASE_URL",
        default_value = "sqlite://pes-data/pes.db"
    )]
    pub database_url: String,

    /// Database connections per process (Postgres).
    #[arg(long, env = "PES_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,

    /// How long start-up waits for an unreachable Postgres (seconds): connecting is retried with
    /// backoff (100 ms doubling to 5 s), so a service started with its database (compose,
    /// Kubernetes) comes up once the database does instead of exiting at once; past it the
    /// process exits non-zero. 0 tries once. A refused login or a missing database is not waited
    /// for.
    #[arg(long, env = "PES_DB_CONNECT_TIMEOUT_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub db_connect_timeout_seconds: u64,

    /// The default provider (threads may name another configured one): `openai`, `anthropic`
    /// or `offline`. Default: `openai` when `PES_LLM_BASE_URL`, `PES_LLM_API_KEY`,
    /// `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set, else `anthropic` when `ANTHROPIC_API_KEY` or
    /// `ANTHROPIC_BASE_URL` is, else `offline`.
    #[arg(long, env = "PES_LLM_PROVIDER", value_enum)]
    pub llm_provider: Option<ProviderKind>,

    /// The default provider's base URL: OpenAI-compatible (the service appends
    /// `/chat/completions`) or Anthropic's (it appends `/v1/messages`). Default: the provider's
    /// own variable (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`), else its public API.
    #[arg(long, env = "PES_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,

    /// The default provider's key; default: its own variable (`OPENAI_API_KEY`,
    /// `ANTHROPIC_API_KEY`).
    #[arg(long, env = "PES_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,

    /// The default provider's model; default: its own setting (`PES_OPENAI_MODEL`,
    /// `PES_ANTHROPIC_MODEL`).
    #[arg(long, env = "PES_LLM_MODEL")]
    pub llm_model: Option<String>,

    /// Key of the `openai` provider when it is not the default (and the default provider's key
    /// when it is and `PES_LLM_API_KEY` is unset). Setting it configures `openai` for threads.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub openai_api_key: Option<String>,

    /// Base URL of the `openai` provider when `PES_LLM_BASE_URL` does not apply to it.
    /// Setting it configures `openai` for threads.
    #[arg(long, env = "OPENAI_BASE_URL")]
    pub openai_base_url: Option<String>,

    /// The `openai` provider's model when `PES_LLM_MODEL` does not apply to it.
    #[arg(long, env = "PES_OPENAI_MODEL", default_value = "gpt-4o-mini")]
    pub openai_model: String,

    /// Key of the `anthropic` provider when it is not the default (and the default provider's
    /// key when it is and `PES_LLM_API_KEY` is unset). Setting it configures `anthropic`.
    #[arg(long, env = "ANTHROPIC_API_KEY", hide_env_values = true)]
    pub anthropic_api_key: Option<String>,

    /// Base URL of the `anthropic` provider when `PES_LLM_BASE_URL` does not apply to it (the
    /// service appends `/v1/messages`). Setting it configures `anthropic` for threads.
    #[arg(long, env = "ANTHROPIC_BASE_URL")]
    pub anthropic_base_url: Option<String>,

    /// The `anthropic` provider's model when `PES_LLM_MODEL` does not apply to it.
    #[arg(long, env = "PES_ANTHROPIC_MODEL", default_value = "claude-sonnet-4-5")]
    pub anthropic_model: String,

    /// `max_tokens` of every Anthropic request (the Messages API requires one): the longest
    /// reply, in tokens, the model may write.
    #[arg(long, env = "PES_ANTHROPIC_MAX_TOKENS", default_value_t = 8192,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub anthropic_max_tokens: u32,

    /// Ask providers for streamed replies, so `?tokens=true` clients see the text as the model
    /// writes it (what is committed is the same either way). Turn off for an endpoint that
    /// cannot stream.
    #[arg(long, env = "PES_LLM_STREAM", default_value_t = true, action = clap::ArgAction::Set)]
    pub llm_stream: bool,

    /// Seconds one model call may take before it is retried.
    #[arg(long, env = "PES_LLM_TIMEOUT_SECONDS", default_value_t = 120)]
    pub llm_timeout_seconds: u64,

    /// Retries of a transient provider error (429, 5xx, timeout).
    #[arg(long, env = "PES_LLM_MAX_RETRIES", default_value_t = 3)]
    pub llm_max_retries: u32,

    /// Model calls in flight at once in this process, per provider, at most (more wait their
    /// turn); each holds a socket.
    #[arg(long, env = "PES_LLM_MAX_IN_FLIGHT", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub llm_max_in_flight: u32,

    /// Comma-separated `key` or `key:tenant`; unset means no authentication (warned at start, and
    /// refused on a non-loopback `PES_BIND` unless `PES_ALLOW_UNAUTHENTICATED` is on).
    #[arg(long, env = "PES_API_KEYS", hide_env_values = true)]
    pub api_keys: Option<String>,

    /// Comma-separated keys of the operator (the person who runs the service, above every
    /// tenant): they act on `/v1/admin/*` only (a tenant's spend, raising its daily budget,
    /// deciding a suspension on it), and are refused (401) on the tenant routes. A key must not
    /// also be in `PES_API_KEYS`. Unset: `/v1/admin/*` answers 403 `operator_only` to every
    /// request, except on a service with no keys at all, where the local person is the operator.
    #[arg(long, env = "PES_OPERATOR_KEYS", hide_env_values = true)]
    pub operator_keys: Option<String>,

    /// The most tokens one `approve` of a budget suspension (`raiseBy.tokens`), or one operator
    /// raise of a tenant's day, may add; more is refused with 422 `invalid_raise`.
    #[arg(long, env = "PES_MAX_BUDGET_RAISE_TOKENS", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    pub max_budget_raise_tokens: u64,

    /// The most US dollars one `approve` of a budget suspension (`raiseBy.usd`), or one operator
    /// raise of a tenant's day, may add (more than 0, at most a million); more is refused with
    /// 422 `invalid_raise`.
    #[arg(long, env = "PES_MAX_BUDGET_RAISE_USD", default_value = "1000",
          value_parser = parse_raise_usd)]
    pub max_budget_raise_usd: f64,

    /// Tools every call of which waits for a person's decision, on every thread (comma-separated
    /// names). A floor: thread and run configs add to it, never remove from it.
    #[arg(long, env = "PES_REQUIRE_APPROVAL", value_delimiter = ',')]
    pub require_approval: Vec<String>,

    /// What each model costs, as a JSON object: model name → `{"input", "output",
    /// "cachedInput"?}` in US dollars per million tokens (`*` prices every other model). Unset:
    /// nothing has a price, `costUsd` stays 0 and `maxCostUsd` caps nothing.
    #[arg(long, env = "PES_MODEL_PRICES")]
    pub model_prices: Option<String>,

    /// The models a thread, run or assistant config may name, comma-separated (`*`: any). Unset:
    /// each configured provider's model and every model priced in `PES_MODEL_PRICES`. Another is
    /// refused with 422 `model_not_allowed`: tenants spend the operator's provider keys.
    #[arg(long, env = "PES_ALLOWED_MODELS")]
    pub allowed_models: Option<String>,

    /// What each tenant may spend on its models per UTC day, as a JSON object: tenant →
    /// `{"maxTokens"?, "maxCostUsd"?, "onExceed"?}` (`*` applies to every tenant not named; a
    /// named entry without limits exempts its tenant). The day's spend is read from the store,
    /// so it holds across replicas and restarts. Unset: no daily budget.
    #[arg(long, env = "PES_TENANT_BUDGETS")]
    pub tenant_budgets: Option<String>,

    /// The bearer key `/metrics` needs; unset: `/metrics` is open (its labels hold no tenant
    /// data either way).
    #[arg(long, env = "PES_METRICS_KEY", hide_env_values = true)]
    pub metrics_key: Option<String>,

    /// Queued and running runs one tenant may hold at once; a run past it is refused with 429
    /// `quota_exceeded`.
    #[arg(long, env = "PES_TENANT_MAX_ACTIVE_RUNS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub tenant_max_active_runs: u64,

    /// Event streams (SSE, A2A streams) one tenant may hold open at once in one process; one
    /// past it is refused with 429 `quota_exceeded`.
    #[arg(long, env = "PES_TENANT_MAX_STREAMS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub tenant_max_streams: u64,

    /// Threads one tenant may hold (forks included; deleted and expired ones do not count);
    /// creating or forking one past it is refused with 429 `quota_exceeded`. A fork copies its
    /// source's log and history, so this bounds what a tenant can fill the disk with for free.
    #[arg(long, env = "PES_TENANT_MAX_THREADS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub tenant_max_threads: u64,

    /// Steering messages one run takes (through `…/steer` or a query posted with
    /// `multitaskStrategy: "steer"`); one past it is refused with 429 `quota_exceeded`. A model
    /// call reads the last ten at most.
    #[arg(long, env = "PES_MAX_STEERS_PER_RUN", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_steers_per_run: u64,

    /// Flowcharts one tenant may store; creating one past it is refused with 429
    /// `quota_exceeded`.
    #[arg(long, env = "PES_TENANT_MAX_FLOWCHARTS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub tenant_max_flowcharts: u64,

    /// Assistants one tenant may keep (deleted ones do not count); creating one past it is
    /// refused with 429 `quota_exceeded`.
    #[arg(long, env = "PES_TENANT_MAX_ASSISTANTS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub tenant_max_assistants: u64,

    /// Versions kept per assistant: an update past it deletes the oldest versions, except the
    /// current one and those a queued, running or suspended run uses.
    #[arg(long, env = "PES_ASSISTANT_MAX_VERSIONS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub assistant_max_versions: u64,

    /// The largest assistant `config`, in bytes of JSON; a larger one is refused with 422.
    #[arg(long, env = "PES_ASSISTANT_MAX_CONFIG_BYTES", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(256..=16_777_216))]
    pub assistant_max_config_bytes: u64,

    /// The largest value of a memory store item, in bytes of JSON; a larger one is refused with
    /// 422 `value_too_large`.
    #[arg(long, env = "PES_STORE_MAX_VALUE_BYTES", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(64..=16_777_216))]
    pub store_max_value_bytes: u64,

    /// The most labels of a memory store namespace.
    #[arg(long, env = "PES_STORE_MAX_NAMESPACE_DEPTH", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=100))]
    pub store_max_namespace_depth: u64,

    /// The largest `offset` of a memory store search or namespace listing (a page further on
    /// is refused with 422): deep pages cost the database the rows they skip.
    #[arg(long, env = "PES_STORE_MAX_OFFSET", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub store_max_offset: u64,

    /// Items one tenant may keep in the memory store (expired ones count until the sweeper
    /// deletes them); a new item past it is refused with 429 `quota_exceeded`.
    #[arg(long, env = "PES_TENANT_MAX_STORE_ITEMS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub tenant_max_store_items: u64,

    /// Bytes one tenant may store (its threads' logs, messages, items, runs and history, and
    /// its memory store items, as `GET /v1/threads/{id}/storage` counts them, summed); past it,
    /// anything that grows them (a run, a fork, a steering message, a new thread, a store put) is
    /// refused with 429 `quota_exceeded`. Reads and deletes go on.
    #[arg(long, env = "PES_TENANT_MAX_STORAGE_BYTES", default_value_t = 10 * 1024 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub tenant_max_storage_bytes: u64,

    /// How old a tenant's byte count (`PES_TENANT_MAX_STORAGE_BYTES`) may be before a write
    /// counts it again, in seconds (each replica counts on its own; 0 counts on every write).
    #[arg(long, env = "PES_TENANT_STORAGE_RECOUNT_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=60))]
    pub tenant_storage_recount_seconds: u64,

    /// How often the memory sweeper deletes expired items (milliseconds); each pass deletes at
    /// most `PES_STORE_SWEEP_BATCH`, and several replicas never delete the same rows.
    #[arg(long, env = "PES_STORE_SWEEP_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    pub store_sweep_ms: u64,

    /// The most expired memory items one sweeper pass deletes (the next pass goes on).
    #[arg(long, env = "PES_STORE_SWEEP_BATCH", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub store_sweep_batch: u64,

    /// The embeddings model (e.g. `text-embedding-3-small`): when set, memory items are embedded
    /// when written, through the `openai` provider's base URL and key (`POST …/embeddings`), and a
    /// search's `query` ranks by meaning (cosine similarity); unset, it ranks by full text.
    #[arg(long, env = "PES_EMBEDDINGS_MODEL")]
    pub embeddings_model: Option<String>,

    /// How long one embeddings request may take (seconds); a write that cannot be embedded in
    /// time is stored anyway and embedded later by the background pass.
    #[arg(long, env = "PES_EMBEDDINGS_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub embeddings_timeout_seconds: u64,

    /// How often the background pass embeds items written while the provider was unreachable
    /// (and items written under another model), in milliseconds; 64 items per request.
    #[arg(long, env = "PES_EMBEDDINGS_PASS_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    pub embeddings_pass_ms: u64,

    /// How many items a semantic search ranks by cosine in the service when the database cannot
    /// (SQLite; Postgres without the `vector` extension): the newest this many under the
    /// namespace prefix that match the filter.
    #[arg(long, env = "PES_STORE_SEMANTIC_CANDIDATES", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub store_semantic_candidates: u64,

    /// The most bytes of one tool result that is stored and shown to the model, whatever the
    /// tool (built-in, HTTP, MCP, flowchart, remote agent); the rest is cut with a marker that
    /// says how much was cut.
    #[arg(long, env = "PES_TOOL_RESULT_MAX_BYTES", default_value_t = 262_144,
          value_parser = clap::value_parser!(u64).range(1024..=16_777_216))]
    pub tool_result_max_bytes: u64,

    /// Serve without `PES_API_KEYS` on a non-loopback `PES_BIND` (default false). Without keys
    /// anyone who reaches the port can use every tenant's threads, so start-up refuses that
    /// unless this says it is on purpose (behind an authenticating proxy, on a private network).
    #[arg(long, env = "PES_ALLOW_UNAUTHENTICATED", default_value_t = false)]
    pub allow_unauthenticated: bool,

    /// The URL other agents reach this service at (scheme, host, port, optional path prefix),
    /// for the A2A agent card (`<PES_PUBLIC_URL>/a2a`); default `http://<the bound address>`. Set
    /// it when binding `0.0.0.0` or serving behind a proxy.
    #[arg(long, env = "PES_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Runs one process drives at once (0: serve the API only, run no agents).
    #[arg(long, env = "PES_WORKER_CONCURRENCY", default_value_t = 64)]
    pub worker_concurrency: usize,

    /// Run lease; heartbeats every third of it; an expired lease is re-claimed by any replica.
    #[arg(long, env = "PES_LEASE_SECONDS", default_value_t = 30)]
    pub lease_seconds: u64,

    /// How often a worker renews its lease (milliseconds); default a third of the lease.
    #[arg(long, env = "PES_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,

    /// How often SSE streams check the table for observations of other replicas whose
    /// notification was lost (milliseconds; Postgres only).
    #[arg(long, env = "PES_STREAM_POLL_MS", default_value_t = 1000)]
    pub stream_poll_ms: u64,

    /// Register test-only tools (`debug_sleep`); never in production.
    #[arg(long, env = "PES_DEBUG_TOOLS", default_value_t = false)]
    pub debug_tools: bool,

    /// File `debug_sleep` appends its tag to after each completed call (tests count them).
    #[arg(long, env = "PES_DEBUG_TOOL_LOG")]
    pub debug_tool_log: Option<std::path::PathBuf>,

    /// Register the `http_request` tool, with which the model sends HTTP requests from the
    /// service's network. Off by default; even on, it reaches only public addresses unless
    /// `PES_HTTP_TOOL_ALLOW` says otherwise.
    #[arg(long, env = "PES_HTTP_TOOL", default_value_t = false)]
    pub http_tool: bool,

    /// What the HTTP tool may reach beyond public addresses: comma-separated exact host names
    /// (`localhost`, `api.internal`; any address they resolve to) and CIDRs or addresses
    /// (`10.0.0.0/8`, `127.0.0.1`, `::1/128`). A cloud metadata address needs an entry that is
    /// exactly that address.
    #[arg(long, env = "PES_HTTP_TOOL_ALLOW")]
    pub http_tool_allow: Option<String>,

    /// Response body bytes the HTTP tool reads; the rest is cut off with a marker, never read.
    #[arg(long, env = "PES_HTTP_TOOL_MAX_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=64 * 1024 * 1024))]
    pub http_tool_max_bytes: u64,

    /// Seconds one HTTP tool request may take in all (connecting, redirects, the body); the
    /// tool timeout (`PES_TOOL_TIMEOUT_SECONDS`) bounds it too.
    #[arg(long, env = "PES_HTTP_TOOL_TIMEOUT_SECONDS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_tool_timeout_seconds: u64,

    /// The key webhooks are signed with (Standard Webhooks): `whsec_` followed by base64 of
    /// 24 to 64 random bytes (`whsec_$(head -c 32 /dev/urandom | base64)`). Unset: webhooks are
    /// refused (422) wherever they are set, and nothing is sent.
    #[arg(long, env = "PES_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// What webhook URLs may reach beyond public addresses, in the form of
    /// `PES_HTTP_TOOL_ALLOW` (host names, addresses, CIDRs). Without it a webhook to a loopback,
    /// private, link-local or metadata address is refused (at once for an address in the URL,
    /// when it is resolved for a name).
    #[arg(long, env = "PES_WEBHOOK_ALLOW")]
    pub webhook_allow: Option<String>,

    /// Seconds one webhook attempt may take (connecting, sending, the answer's head); past it
    /// the attempt failed and is retried.
    #[arg(long, env = "PES_WEBHOOK_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=300))]
    pub webhook_timeout_seconds: u64,

    /// Attempts per delivery, the first included; after the last failed one the delivery is
    /// `failed` (`POST /v1/webhook-deliveries/{id}/retry` sends it again).
    #[arg(long, env = "PES_WEBHOOK_MAX_ATTEMPTS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub webhook_max_attempts: u32,

    /// The wait before a delivery's first retry (milliseconds); it doubles after each failed
    /// attempt (with up to a quarter more at random, so receivers are not hit in step), up to an
    /// hour.
    #[arg(long, env = "PES_WEBHOOK_RETRY_BASE_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub webhook_retry_base_ms: u64,

    /// Webhooks one process sends at once, at most.
    #[arg(long, env = "PES_WEBHOOK_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub webhook_concurrency: u32,

    /// How often a process looks for deliveries it was not woken for (another replica's, a
    /// retry that came due), in milliseconds; a run this process ends is sent at once.
    #[arg(long, env = "PES_WEBHOOK_POLL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub webhook_poll_ms: u64,

    /// How often each process looks for cron ticks that are due (milliseconds); a tick runs at
    /// most this late.
    #[arg(long, env = "PES_CRON_POLL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub cron_poll_ms: u64,

    /// A tick found more than this many seconds after its time was missed (no replica ran):
    /// the cron's `onMissed` decides (`run_once`: one catch-up run, `skip`: none).
    #[arg(long, env = "PES_CRON_MISSED_AFTER_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub cron_missed_after_seconds: u64,

    /// Accept a sixth, leading seconds field in cron schedules (`*/10 * * * * *`: every ten
    /// seconds). Off by default: a schedule is the standard 5-field form.
    #[arg(long, env = "PES_CRON_SECONDS", default_value_t = false, action = clap::ArgAction::Set)]
    pub cron_seconds: bool,

    /// Crons one tenant may keep; creating one past it is refused with 429 `quota_exceeded`.
    #[arg(long, env = "PES_TENANT_MAX_CRONS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub tenant_max_crons: u64,

    /// How often an idle worker looks for work it was not woken for (milliseconds).
    #[arg(long, env = "PES_POLL_INTERVAL_MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,

    /// Seconds in-flight work may take to finish after SIGTERM before leases are released.
    #[arg(long, env = "PES_SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    pub shutdown_grace_seconds: u64,

    /// Largest request body in bytes.
    #[arg(long, env = "PES_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Seconds a connection may take to send a complete request head, counted from the accept
    /// or from the first byte of a later request on a kept-alive connection; then it is closed.
    /// Silent and half-sent connections cannot hold a socket longer than this.
    #[arg(long, env = "PES_HEADER_READ_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_seconds: u64,

    /// Seconds a request body may take to arrive in full, counted from its head (a total
    /// deadline, so a byte-by-byte drip cannot stretch it); then the request is answered 408.
    #[arg(long, env = "PES_BODY_READ_TIMEOUT_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout_seconds: u64,

    /// Seconds a kept-alive connection may wait for its next request after a response; then it
    /// is closed. Never applies while a response (an SSE stream, a `runs/wait`) is being sent.
    #[arg(long, env = "PES_IDLE_TIMEOUT_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_seconds: u64,

    /// Open HTTP connections at most. At the cap a new connection closes the oldest connection
    /// that has no request in flight; when every one is busy, new ones wait in the accept
    /// backlog. Keep it below the process's open-file limit (`ulimit -n`).
    #[arg(long, env = "PES_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// Largest request header section in bytes (each field counted as name, `: `, value and
    /// CRLF); above it the answer is 431. At most 256 KiB.
    #[arg(long, env = "PES_MAX_HEADER_BYTES", default_value_t = 32 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=256 * 1024))]
    pub max_header_bytes: u64,

    /// Longest request target (path and query) in bytes; above it the answer is 414. At most
    /// 65534, the HTTP parser's own bound.
    #[arg(long, env = "PES_MAX_URI_BYTES", default_value_t = 8 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=65_534))]
    pub max_uri_bytes: u64,

    /// Largest query in characters.
    #[arg(long, env = "PES_MAX_QUERY_CHARS", default_value_t = 32 * 1024)]
    pub max_query_chars: usize,

    /// Items one run may add to its plan unless the thread's `maxItems` says otherwise (a long
    /// thread's earlier items do not count).
    #[arg(long, env = "PES_MAX_ITEMS", default_value_t = 20)]
    pub max_items: u32,

    /// Model calls per item unless the thread's `maxIterations` says otherwise.
    #[arg(long, env = "PES_MAX_ITERATIONS", default_value_t = 5)]
    pub max_iterations: u32,

    /// Ready items of a run that execute at once unless the thread's `maxParallelItems` says
    /// otherwise (1 = one at a time).
    #[arg(long, env = "PES_MAX_PARALLEL_ITEMS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=32))]
    pub max_parallel_items: u32,

    /// An item result longer than this many characters is compacted by the model before other
    /// items read it, unless the thread's `compactionThresholdChars` says otherwise.
    #[arg(long, env = "PES_COMPACTION_THRESHOLD_CHARS", default_value_t = 1500,
          value_parser = clap::value_parser!(u32).range(100..=1_000_000))]
    pub compaction_threshold_chars: u32,

    /// How deep team items may nest unless the thread's `maxTeamDepth` says otherwise.
    #[arg(long, env = "PES_MAX_TEAM_DEPTH", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(0..=5))]
    pub max_team_depth: u32,

    /// Characters of an item's output passed to later items and to synthesis.
    #[arg(long, env = "PES_STEP_OUTPUT_CHARS", default_value_t = 2000)]
    pub step_output_chars: usize,

    /// Seconds one tool call may take.
    #[arg(long, env = "PES_TOOL_TIMEOUT_SECONDS", default_value_t = 60)]
    pub tool_timeout_seconds: u64,

    /// TAEF strict mode: retries of an item that skipped a required tool, before it fails.
    #[arg(long, env = "PES_STRICT_RETRIES", default_value_t = 2)]
    pub strict_retries: u32,

    /// Seconds between SSE keep-alive comments.
    #[arg(long, env = "PES_SSE_KEEPALIVE_SECONDS", default_value_t = 15)]
    pub sse_keepalive_seconds: u64,

    /// Seconds between checks that return freed heap memory to the system (glibc only; 0 = off).
    #[arg(long, env = "PES_MEMORY_TRIM_SECONDS", default_value_t = 10)]
    pub memory_trim_seconds: u64,

    /// Default suspension expiry in seconds when a thread sets none (0 = never; at most one year).
    #[arg(long, env = "PES_SUSPENSION_TTL_SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=crate::model::MAX_SUSPENSION_TTL_SECONDS))]
    pub suspension_ttl_seconds: u64,

    /// How often expired suspensions are looked for (milliseconds).
    #[arg(long, env = "PES_SUSPENSION_SWEEP_MS", default_value_t = 1000)]
    pub suspension_sweep_ms: u64,

    /// Default time-to-live of a thread, in seconds, when neither its config nor its assistant's
    /// sets `ttlSeconds`: a thread with no run queued, running or suspended whose last activity
    /// is older than this is deleted with everything it owns. 0 = never (at most ten years).
    #[arg(long, env = "PES_THREAD_TTL_SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=crate::model::MAX_THREAD_TTL_SECONDS))]
    pub thread_ttl_seconds: u64,

    /// How often each replica looks for threads whose time-to-live has passed (seconds).
    #[arg(long, env = "PES_RETENTION_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub retention_interval_seconds: u64,

    /// Threads one retention pass deletes at most (a full batch starts the next pass at once).
    #[arg(long, env = "PES_RETENTION_BATCH", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub retention_batch: u32,

    /// Threads one `POST /v1/threads/prune` call deletes (or, with `dryRun`, matches) at most;
    /// the answer says `more: true` when others remain.
    #[arg(long, env = "PES_PRUNE_MAX_THREADS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub prune_max_threads: u32,

    /// How often a run busy with some items re-reads the suspensions its other items wait on
    /// (milliseconds). Decisions reach the run at once (pushed, also across replicas); this slow
    /// look only covers a lost push. At most one day.
    #[arg(long, env = "PES_DECISION_POLL_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    pub decision_poll_ms: u64,

    /// Stages one flowchart call may execute, sub-flows included; a call that reaches it ends
    /// with a tool error naming the stage.
    #[arg(long, env = "PES_FLOWCHART_MAX_STEPS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub flowchart_max_steps: u32,

    /// The largest value a flowchart may compute or keep, in bytes of JSON: what a stage writes,
    /// a call's result, and every value an expression computes on the way (one expression also
    /// works in at most 16 times this much memory). A flowchart that passes it ends with a tool
    /// error naming the stage, so no tenant's expression can fill the process's memory or the
    /// database.
    #[arg(long, env = "PES_FLOWCHART_MAX_VALUE_BYTES", default_value_t = 1_048_576,
          value_parser = clap::value_parser!(u64).range(64..=268_435_456))]
    pub flowchart_max_value_bytes: u64,

    /// How long one flowchart expression may run (milliseconds of its thread's CPU time, so a
    /// busy machine does not fail it); one that runs longer stops with a tool error naming the
    /// stage. Expressions run on threads of their own at a lower priority, never the ones that
    /// serve requests, at most one less than the CPUs at once.
    #[arg(long, env = "PES_FLOWCHART_EXPR_TIMEOUT_MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub flowchart_expr_timeout_ms: u64,

    /// Remote A2A agents runs may delegate to (operator only): inline JSON or the path of a JSON
    /// file, `{"<agent>": {"url": "<agent card URL>", "headers"?, "origins"?}}`. `headers` go only
    /// to the card URL's origin and the `origins` listed (a card cannot redirect them elsewhere).
    #[arg(long, env = "PES_A2A_AGENTS")]
    pub a2a_agents: Option<String>,

    /// How often remote agents' cards are fetched again (seconds).
    #[arg(long, env = "PES_A2A_CARD_REFRESH_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub a2a_card_refresh_seconds: u64,

    /// How long a run may hold a worker slot while every item it has in flight waits on a remote
    /// agent (milliseconds). Past it the run gives the slot back and a light watcher follows the
    /// remote tasks; the run stays `running` and takes a slot again when one settles. 0 hands
    /// over at once.
    #[arg(long, env = "PES_A2A_PARK_AFTER_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub a2a_park_after_ms: u64,

    /// How long a remote agent may stay unreachable (its task can be neither streamed nor
    /// read) before a delegation to it fails with a tool error the model sees, in seconds.
    #[arg(long, env = "PES_A2A_UNREACHABLE_SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub a2a_unreachable_seconds: u64,

    /// What remote A2A agents' endpoints and redirects may reach beyond public addresses, in the
    /// form of `PES_HTTP_TOOL_ALLOW` (host names, addresses, CIDRs). A card names its own endpoint,
    /// so without this a card could send our requests to loopback, private or metadata addresses;
    /// the origin of each agent's configured card URL (and its `origins`) is always allowed.
    /// Allowing a host does not send it the agent's configured headers. Default: nothing.
    #[arg(long, env = "PES_A2A_ALLOW")]
    pub a2a_allow: Option<String>,

    /// The most bytes read of a remote agent's card, of one JSON-RPC reply, and of one stream
    /// event; past it the read stops and the call fails with an error that says so (a remote
    /// never makes us hold more). Remote text placed in a delegation's result or question is cut
    /// to it too. Default 1 MiB.
    #[arg(long, env = "PES_A2A_MAX_BYTES", default_value_t = 1_048_576,
          value_parser = clap::value_parser!(u64).range(1024..=67_108_864))]
    pub a2a_max_bytes: u64,

    /// MCP servers to connect (operator only, never the API): inline JSON or the path of a JSON
    /// file, `{"<server>": {"url", "headers"?} | {"command", "args"?, "env"?}}`. Their tools are
    /// `<server>__<tool>`.
    #[arg(long, env = "PES_MCP_SERVERS")]
    pub mcp_servers: Option<String>,

    /// How long connecting to an MCP server (and its handshake) may take, in seconds; start-up
    /// waits at most this long for the first discovery.
    #[arg(long, env = "PES_MCP_CONNECT_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub mcp_connect_timeout_seconds: u64,

    /// How often an idle MCP connection is pinged, so a dead server shows as unavailable before
    /// a call needs it (milliseconds).
    #[arg(long, env = "PES_MCP_PING_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub mcp_ping_ms: u64,

    /// The longest wait between reconnection attempts to an MCP server (milliseconds); the
    /// wait starts at a twentieth of it (at least 50 ms) and doubles after each failure.
    #[arg(long, env = "PES_MCP_RECONNECT_MAX_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub mcp_reconnect_max_ms: u64,

    /// The most bytes of an MCP tool's output kept and shown to the model; the rest is cut off
    /// with a marker (servers may send up to 16 MiB).
    #[arg(long, env = "PES_MCP_MAX_OUTPUT_BYTES", default_value_t = 1_048_576,
          value_parser = clap::value_parser!(u64).range(1024..=16_777_216))]
    pub mcp_max_output_bytes: u64,

    /// Largest `POST /v1/ag-ui` body in bytes: an AG-UI input carries the whole conversation
    /// the client holds, so it may be larger than other bodies (`PES_MAX_BODY_BYTES`).
    #[arg(long, env = "PES_AGUI_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=268_435_456))]
    pub agui_max_body_bytes: u64,

    /// Largest `POST /mcp` body in bytes (our MCP server); one past it is answered 413.
    #[arg(long, env = "PES_MCP_MAX_BODY_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=268_435_456))]
    pub mcp_max_body_bytes: u64,

    /// `Host` values every door answers (`/v1`, `/mcp`, `/a2a`, `/console`, `/docs`), against DNS
    /// rebinding: comma-separated host names or addresses (any port), `host:port` (that port
    /// only), or `*` (any host). Another `Host` is refused with 403 `host_refused`. Default: while
    /// `PES_BIND` is a loopback address, `localhost`, `127.0.0.1` and `[::1]` (and the host of
    /// `PES_PUBLIC_URL`, when set); otherwise any host. `/healthz`, `/readyz` and `/metrics`
    /// answer any `Host` (a container probe names the pod's address).
    #[arg(long, env = "PES_ALLOWED_HOSTS")]
    pub allowed_hosts: Option<String>,

    /// The former name of `PES_ALLOWED_HOSTS` (when both are set, `PES_ALLOWED_HOSTS` wins).
    #[arg(long, env = "PES_MCP_ALLOWED_HOSTS")]
    pub mcp_allowed_hosts: Option<String>,

    /// Web origins (`scheme://host[:port]`, comma-separated) of other sites whose pages may call
    /// the API from a browser (an AG-UI front end, say): their writes are taken, and their
    /// requests get CORS headers (preflights answered). A write (POST, PUT, PATCH, DELETE) whose
    /// `Origin` is neither one of these nor the service's own is refused with 403
    /// `origin_refused`. Unset: only the service's own pages (the console).
    #[arg(long, env = "PES_ALLOWED_ORIGINS")]
    pub allowed_origins: Option<String>,

    /// How long an MCP tool call (`ask`, `resume`, a flowchart) waits for its run to end or to
    /// need a person, in seconds; then it answers that the run is still going (with its ids).
    #[arg(long, env = "PES_MCP_CALL_TIMEOUT_SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub mcp_call_timeout_seconds: u64,

    /// Log format: `text` or `json`.
    #[arg(long, env = "PES_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter (`RUST_LOG` syntax); `RUST_LOG` is used when this is unset.
    #[arg(long, env = "PES_LOG")]
    pub log: Option<String>,
}

impl Config {
    /// Whether `PES_BIND` is reachable from other hosts: any address but loopback
    /// (`127.0.0.0/8`, `::1`, and `::ffff:127.x.y.z`).
    pub fn binds_beyond_loopback(&self) -> bool {
        !self.bind.ip().to_canonical().is_loopback()
    }

    /// Refuse a non-loopback `PES_BIND` without API keys unless `PES_ALLOW_UNAUTHENTICATED` says
    /// it is on purpose: the one-line error says how to fix it.
    ///
    /// # Errors
    /// The API would be open to other hosts and nothing says that is intended.
    pub fn check_exposure(&self) -> anyhow::Result<()> {
        if self.binds_beyond_loopback()
            && self.parsed_api_keys().is_empty()
            && !self.allow_unauthenticated
        {
            anyhow::bail!(
                "refusing to serve without authentication on {}, which other hosts can reach: \
                 set PES_API_KEYS (comma-separated `key` or `key:tenant`), or \
                 PES_ALLOW_UNAUTHENTICATED=true to run it open on purpose, or bind a loopback \
                 address (PES_BIND=127.0.0.1:8080)",
                self.bind
            );
        }
        Ok(())
    }

    /// Refuse a key that is both an operator's (`PES_OPERATOR_KEYS`) and a tenant's
    /// (`PES_API_KEYS`): a request with it could not say whom it acts for.
    ///
    /// # Errors
    /// A key is in both lists (the error names neither key, only how many).
    pub fn check_keys(&self) -> anyhow::Result<()> {
        let tenants: std::collections::HashSet<String> =
            self.parsed_api_keys().into_iter().map(|(k, _)| k).collect();
        let both = self
            .parsed_operator_keys()
            .iter()
            .filter(|k| tenants.contains(*k))
            .count();
        if both > 0 {
            anyhow::bail!(
                "{both} key(s) of PES_OPERATOR_KEYS are also in PES_API_KEYS: an operator key \
                 must be distinct from every tenant's key"
            );
        }
        Ok(())
    }

    /// The operator's keys (`PES_OPERATOR_KEYS`), blanks left out.
    pub fn parsed_operator_keys(&self) -> Vec<String> {
        split_list(self.operator_keys.as_deref())
    }

    /// `PES_ALLOWED_HOSTS` (else its former name `PES_MCP_ALLOWED_HOSTS`), blanks left out;
    /// `None` when neither is set.
    pub fn allowed_hosts(&self) -> Option<Vec<String>> {
        let set = self
            .allowed_hosts
            .as_deref()
            .or(self.mcp_allowed_hosts.as_deref())?;
        Some(split_list(Some(set)))
    }

    /// `PES_ALLOWED_ORIGINS`, blanks left out.
    pub fn allowed_origins(&self) -> Vec<String> {
        split_list(self.allowed_origins.as_deref())
    }

    /// Parse from the process's environment only (no flags); for tests and embedding.
    pub fn from_env() -> Self {
        EnvOnly::parse_from(["pes-server"]).config.normalized()
    }

    /// Empty optional settings mean "unset".
    pub fn normalized(mut self) -> Self {
        for v in [
            &mut self.llm_base_url,
            &mut self.llm_api_key,
            &mut self.llm_model,
            &mut self.openai_api_key,
            &mut self.openai_base_url,
            &mut self.anthropic_api_key,
            &mut self.anthropic_base_url,
            &mut self.api_keys,
            &mut self.operator_keys,
            &mut self.allowed_hosts,
            &mut self.mcp_allowed_hosts,
            &mut self.allowed_origins,
            &mut self.public_url,
            &mut self.mcp_servers,
            &mut self.a2a_agents,
            &mut self.a2a_allow,
            &mut self.http_tool_allow,
            &mut self.webhook_secret,
            &mut self.webhook_allow,
            &mut self.embeddings_model,
            &mut self.log,
        ] {
            if v.as_deref().is_some_and(|s| s.trim().is_empty()) {
                *v = None;
            }
        }
        self
    }

    /// The provider: `PES_LLM_PROVIDER` when set; else OpenAI-compatible when any of its URL or
    /// key settings is set, else Anthropic when one of its is, else the offline model.
    pub fn provider(&self) -> ProviderKind {
        self.llm_provider.unwrap_or(
            if self.llm_base_url.is_some()
                || self.llm_api_key.is_some()
                || self.openai_api_key.is_some()
                || self.openai_base_url.is_some()
            {
                ProviderKind::Openai
            } else if self.anthropic_api_key.is_some() || self.anthropic_base_url.is_some() {
                ProviderKind::Anthropic
            } else {
                ProviderKind::Offline
            },
        )
    }

    /// Whether the `PES_LLM_*` variables configure `kind`: they configure the default provider
    /// (and `openai` when the default is `offline`, so a thread can still pick it).
    fn llm_vars_apply(&self, kind: ProviderKind) -> bool {
        let default = self.provider();
        default == kind || (default == ProviderKind::Offline && kind == ProviderKind::Openai)
    }

    /// Where `openai` is reached, when it is configured: as the default provider, or by
    /// `OPENAI_API_KEY`/`OPENAI_BASE_URL` (or `PES_LLM_*` beside an `offline` default).
    pub fn openai_endpoint(&self) -> Option<ProviderEndpoint> {
        self.endpoint(
            ProviderKind::Openai,
            self.openai_base_url.as_ref(),
            self.openai_api_key.as_ref(),
            &self.openai_model,
            OPENAI_DEFAULT_BASE_URL,
        )
    }

    /// Where `anthropic` is reached, when it is configured: as the default provider, or by
    /// `ANTHROPIC_API_KEY`/`ANTHROPIC_BASE_URL`.
    pub fn anthropic_endpoint(&self) -> Option<ProviderEndpoint> {
        self.endpoint(
            ProviderKind::Anthropic,
            self.anthropic_base_url.as_ref(),
            self.anthropic_api_key.as_ref(),
            &self.anthropic_model,
            ANTHROPIC_DEFAULT_BASE_URL,
        )
    }

    fn endpoint(
        &self,
        kind: ProviderKind,
        own_base: Option<&String>,
        own_key: Option<&String>,
        own_model: &str,
        public_base: &str,
    ) -> Option<ProviderEndpoint> {
        let shared = self.llm_vars_apply(kind);
        let (base, key, model) = if shared {
            (
                self.llm_base_url.as_ref().or(own_base),
                self.llm_api_key.as_ref().or(own_key),
                self.llm_model.as_deref().unwrap_or(own_model),
            )
        } else {
            (own_base, own_key, own_model)
        };
        let configured = self.provider() == kind
            || base.is_some()
            || key.is_some()
            || (shared && self.llm_model.is_some());
        configured.then(|| ProviderEndpoint {
            base_url: base.map_or_else(|| public_base.to_owned(), String::clone),
            api_key: key.cloned(),
            model: model.to_owned(),
        })
    }

    /// The timing of MCP connections.
    pub fn mcp_settings(&self) -> crate::tools::mcp::McpSettings {
        let max = Duration::from_millis(self.mcp_reconnect_max_ms);
        crate::tools::mcp::McpSettings {
            connect_timeout: Duration::from_secs(self.mcp_connect_timeout_seconds),
            ping_interval: Duration::from_millis(self.mcp_ping_ms),
            reconnect_min: (max / 20).max(Duration::from_millis(50)),
            reconnect_max: max,
            max_output_bytes: usize::try_from(self.mcp_max_output_bytes).unwrap_or(usize::MAX),
        }
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds.max(1))
    }

    /// The heartbeat period: `PES_HEARTBEAT_MS`, else a third of the lease (never longer than
    /// half of it, so one late beat does not lose the lease).
    pub fn heartbeat(&self) -> Duration {
        let lease = self.lease();
        match self.heartbeat_ms {
            Some(ms) => Duration::from_millis(ms.max(10)).min(lease / 2),
            None => lease / 3,
        }
    }

    /// The public base URL without a trailing slash (`PES_PUBLIC_URL`, else `http://<PES_BIND>`).
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(u) => u.trim().trim_end_matches('/').to_owned(),
            None => format!("http://{}", self.bind),
        }
    }

    /// API keys as `(key, tenant)`; a key without a tenant belongs to the default tenant.
    pub fn parsed_api_keys(&self) -> Vec<(String, String)> {
        self.api_keys
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|entry| match entry.split_once(':') {
                Some((k, t)) if !t.is_empty() => (k.to_owned(), t.to_owned()),
                _ => (
                    entry.trim_end_matches(':').to_owned(),
                    crate::model::DEFAULT_TENANT.to_owned(),
                ),
            })
            .collect()
    }
}

/// The entries of a comma-separated setting, trimmed, blanks left out.
fn split_list(text: Option<&str>) -> Vec<String> {
    text.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `PES_MAX_BUDGET_RAISE_USD`: a finite number of dollars, more than 0 and at most a million.
fn parse_raise_usd(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if crate::model::usd_in_range(v) {
        Ok(v)
    } else {
        Err(format!(
            "must be more than 0 and at most {}",
            crate::model::MAX_USD
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_api_on_a_non_loopback_address_needs_a_decision() {
        let mut c = EnvOnly::parse_from(["pes-server"]).config;
        c.api_keys = None;
        c.allow_unauthenticated = false;
        for loopback in [
            "127.0.0.1:8080",
            "127.1.2.3:0",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:1",
        ] {
            c.bind = loopback.parse().unwrap();
            c.check_exposure().unwrap();
        }
        for open in [
            "0.0.0.0:8080",
            "[::]:8080",
            "10.1.2.3:80",
            "[::ffff:10.0.0.1]:1",
        ] {
            c.bind = open.parse().unwrap();
            let e = c.check_exposure().unwrap_err().to_string();
            assert!(
                e.contains("PES_API_KEYS") && e.contains("PES_ALLOW_UNAUTHENTICATED=true"),
                "{e}"
            );
            assert!(!e.contains('\n'), "one line: {e}");
        }
        c.api_keys = Some(" , ".into());
        assert!(c.check_exposure().is_err(), "no usable key is no key");
        c.api_keys = Some("k1".into());
        c.check_exposure().unwrap();
        c.api_keys = None;
        c.allow_unauthenticated = true;
        c.check_exposure().unwrap();
    }

    /// The settings with no variable of the environment (so a developer's keys change nothing).
    fn bare() -> Config {
        let mut c = EnvOnly::parse_from(["pes-server"]).config;
        c.llm_provider = None;
        c.llm_base_url = None;
        c.llm_api_key = None;
        c.llm_model = None;
        c.openai_api_key = None;
        c.openai_base_url = None;
        c.anthropic_api_key = None;
        c.anthropic_base_url = None;
        c
    }

    #[test]
    fn pes_llm_variables_configure_the_default_provider_and_the_others_their_own() {
        let c = bare();
        assert_eq!(c.provider(), ProviderKind::Offline);
        assert_eq!(c.openai_endpoint(), None);
        assert_eq!(c.anthropic_endpoint(), None);

        // Anthropic as the default, from its own key alone.
        let mut c = bare();
        c.anthropic_api_key = Some("ak".into());
        assert_eq!(c.provider(), ProviderKind::Anthropic);
        let a = c.anthropic_endpoint().unwrap();
        assert_eq!(a.base_url, ANTHROPIC_DEFAULT_BASE_URL);
        assert_eq!(a.api_key.as_deref(), Some("ak"));
        assert_eq!(a.model, "claude-sonnet-4-5");
        assert_eq!(c.openai_endpoint(), None);

        // Default openai from PES_LLM_*, anthropic beside it from ANTHROPIC_*.
        let mut c = bare();
        c.llm_base_url = Some("http://127.0.0.1:1/v1".into());
        c.llm_api_key = Some("pk".into());
        c.llm_model = Some("m1".into());
        c.anthropic_api_key = Some("ak".into());
        c.anthropic_base_url = Some("http://127.0.0.1:2".into());
        assert_eq!(c.provider(), ProviderKind::Openai);
        let o = c.openai_endpoint().unwrap();
        assert_eq!(
            (o.base_url.as_str(), o.api_key.as_deref(), o.model.as_str()),
            ("http://127.0.0.1:1/v1", Some("pk"), "m1")
        );
        let a = c.anthropic_endpoint().unwrap();
        assert_eq!(
            (a.base_url.as_str(), a.api_key.as_deref(), a.model.as_str()),
            ("http://127.0.0.1:2", Some("ak"), "claude-sonnet-4-5")
        );

        // PES_LLM_PROVIDER=anthropic: PES_LLM_* go to anthropic; OPENAI_* configure openai.
        let mut c = bare();
        c.llm_provider = Some(ProviderKind::Anthropic);
        c.llm_api_key = Some("pk".into());
        c.openai_api_key = Some("ok".into());
        let a = c.anthropic_endpoint().unwrap();
        assert_eq!(a.api_key.as_deref(), Some("pk"));
        let o = c.openai_endpoint().unwrap();
        assert_eq!(
            (o.base_url.as_str(), o.api_key.as_deref(), o.model.as_str()),
            (OPENAI_DEFAULT_BASE_URL, Some("ok"), "gpt-4o-mini")
        );
    }

    #[test]
    fn api_keys_parse_with_and_without_tenant() {
        let mut c = EnvOnly::parse_from(["pes-server"]).config;
        c.api_keys = Some("k1, k2:acme,".into());
        assert_eq!(
            c.parsed_api_keys(),
            vec![
                ("k1".to_owned(), "default".to_owned()),
                ("k2".to_owned(), "acme".to_owned())
            ]
        );
    }

    #[test]
    fn an_operator_key_must_not_be_a_tenants() {
        let mut c = EnvOnly::parse_from(["pes-server"]).config;
        c.api_keys = Some("k1:acme, k2".into());
        c.operator_keys = Some("op1, op2".into());
        c.check_keys().unwrap();
        assert_eq!(c.parsed_operator_keys(), vec!["op1", "op2"]);
        c.operator_keys = Some("op1, k2".into());
        let e = c.check_keys().unwrap_err().to_string();
        assert!(e.contains("PES_OPERATOR_KEYS") && !e.contains("k2"), "{e}");
    }

    #[test]
    fn allowed_hosts_take_the_former_name_too() {
        let mut c = EnvOnly::parse_from(["pes-server"]).config;
        c.allowed_hosts = None;
        c.mcp_allowed_hosts = None;
        assert_eq!(c.allowed_hosts(), None);
        c.mcp_allowed_hosts = Some("a.example, ".into());
        assert_eq!(c.allowed_hosts(), Some(vec!["a.example".to_owned()]));
        c.allowed_hosts = Some("b.example:8080".into());
        assert_eq!(c.allowed_hosts(), Some(vec!["b.example:8080".to_owned()]));
    }

    #[test]
    fn the_largest_dollar_raise_is_a_finite_positive_number() {
        assert_eq!(parse_raise_usd("12.5"), Ok(12.5));
        for bad in ["0", "-1", "NaN", "inf", "1e300", "x"] {
            assert!(parse_raise_usd(bad).is_err(), "{bad}");
        }
    }
}
