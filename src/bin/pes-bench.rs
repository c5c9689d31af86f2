//! `pes-bench`: load the real `pes-server` binary over HTTP and print what it costs.
//!
//! The bench starts `pes-server` (the release binary next to its own executable) as a child
//! process on a free loopback port, pointed at an instant fake OpenAI-compatible model that the
//! bench serves in-process, on a fresh store: a new Postgres database `pes_bench_<uuid>` (dropped
//! at the end) or a new SQLite file in a temporary folder.
//!
//! The workload is the peers' one: every query gets a 3-item plan, every item makes one
//! `calculator` call and then answers, then the run synthesizes; that is 8 model calls and 3
//! tool executions per run, every step durable.
//!
//! - `--mode runs`: create N threads, then post one query on each through
//!   `POST /v1/threads/{id}/runs/wait` with C requests in flight. Prints runs/s, items/s, run
//!   latency percentiles (request sent to completed run received), transactions per run
//!   (Postgres `pg_stat_database.xact_commit` and the service's `pes_commits_total`), service CPU
//!   per item (`/proc/<pid>/stat` utime+stime), the service's peak RSS (`VmHWM`), and how busy the
//!   machine, the service, Postgres and the bench itself were while it ran.
//! - `--mode sse`: open S subscribers on the `events` streams of a set of threads, measure the
//!   service's RSS before and after (KiB per idle subscriber), then post runs on those threads at
//!   a pace that makes about R observations per second for `--duration` seconds. Every
//!   subscriber parses its frames and records commit-to-delivery latency: receive time minus the
//!   observation's `createdAt` (stamped inside the committing transaction; the bench and the
//!   service share the clock).
//!
//! Every phase has a deadline (`--phase-timeout`); the bench fails with a clear message when one
//! passes, and always stops the service and removes the store it made.
// A load generator: its fake model and readers are tasks of the bench run itself.
#![allow(clippy::disallowed_methods)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::{Parser, ValueEnum};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::process::{Child, Command};
use tokio::sync::{Semaphore, watch};

/// Load the real pes-server over loopback HTTP and print throughput, latency and cost figures.
#[derive(Debug, Clone, Parser)]
#[command(name = "pes-bench", version, about)]
struct Args {
    /// Store behind the service.
    #[arg(long, value_enum, default_value = "postgres")]
    store: StoreKind,
    /// Admin URL of a Postgres server; the bench creates (and drops) a fresh database there.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// `PES_DATABASE_MAX_CONNECTIONS` of the service.
    #[arg(long, default_value_t = 16)]
    database_max_connections: u32,
    /// What to measure.
    #[arg(long, value_enum, default_value = "runs")]
    mode: Mode,
    /// Runs mode: runs (one per fresh thread).
    #[arg(long, default_value_t = 500)]
    runs: usize,
    /// Runs mode: requests in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// SSE mode: subscribers.
    #[arg(long, default_value_t = 1000)]
    subscribers: usize,
    /// SSE mode: threads the subscribers are spread over (each run adds 3 items to its
    /// thread's plan, so few threads mean long plans and large PLAN_UPDATE observations).
    #[arg(long, default_value_t = 100)]
    sse_threads: usize,
    /// SSE mode: observations per second to generate (about).
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// SSE mode: seconds to generate observations.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Deadline of every phase, in seconds.
    #[arg(long, default_value_t = 300)]
    phase_timeout: u64,
    /// Also print one JSON line with the results.
    #[arg(long)]
    json: bool,
    /// How long the fake model takes to answer each request, in milliseconds (0: at once). With
    /// a latency, the effect of parallel items on run latency shows: the plan's 3 items are
    /// independent.
    #[arg(long, default_value_t = 0)]
    model_latency_ms: u64,
    /// `PES_MAX_PARALLEL_ITEMS` of the service (1 runs the items one at a time).
    #[arg(long, default_value_t = 4)]
    max_parallel_items: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Postgres,
    Sqlite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Runs,
    Sse,
    Both,
}

impl Args {
    fn validate(&self) -> Result<()> {
        ensure!(self.runs > 0, "--runs must be at least 1");
        ensure!(self.concurrency > 0, "--concurrency must be at least 1");
        ensure!(self.subscribers > 0, "--subscribers must be at least 1");
        ensure!(self.sse_threads > 0, "--sse-threads must be at least 1");
        ensure!(self.rate > 0, "--rate must be at least 1");
        ensure!(self.duration > 0, "--duration must be at least 1");
        ensure!(self.phase_timeout > 0, "--phase-timeout must be at least 1");
        ensure!(
            self.database_max_connections > 0,
            "--database-max-connections must be at least 1"
        );
        Ok(())
    }

    fn phase_deadline(&self) -> Duration {
        Duration::from_secs(self.phase_timeout)
    }

    fn wants_runs(&self) -> bool {
        matches!(self.mode, Mode::Runs | Mode::Both)
    }

    fn wants_sse(&self) -> bool {
        matches!(self.mode, Mode::Sse | Mode::Both)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pes-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    args.validate()?;
    if args.wants_sse() {
        check_open_files(args.subscribers)?;
    }
    let server_bin = server_binary()?;
    let fake = FakeLlm::start(args.model_latency_ms).await?;
    let db = Database::create(&args).await?;
    let outcome = bench_on(&args, &db, &fake, &server_bin).await;
    if let Err(e) = db.remove().await {
        eprintln!("pes-bench: could not remove the bench store: {e:#}");
    }
    outcome
}

async fn bench_on(args: &Args, db: &Database, fake: &FakeLlm, bin: &Path) -> Result<()> {
    let worker_concurrency = args.concurrency.max(64);
    let server = Server::spawn(bin, args, db.url(), &fake.url, worker_concurrency).await?;
    let machine = Machine::read();
    let outcome = measure(args, db, &server, &machine, fake).await;
    server.stop().await;
    outcome
}

async fn measure(
    args: &Args,
    db: &Database,
    server: &Server,
    machine: &Machine,
    fake: &FakeLlm,
) -> Result<()> {
    let mut report = json!({
        "store": db.kind_name(),
        "machine": {"cores": machine.cores, "cpu": machine.model},
    });
    if args.wants_runs() {
        let r = runs_mode(args, db, server, fake, machine).await?;
        r.print(args, db, machine);
        report["runs"] = r.to_json(args);
    }
    if args.wants_sse() {
        let s = sse_mode(args, server, machine).await?;
        s.print(args, db, machine);
        report["sse"] = s.to_json(args);
    }
    if args.json {
        println!("{report}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Environment: the server binary, open-file limits, the machine, /proc readings.
// ---------------------------------------------------------------------------------------------

fn server_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the bench's own executable")?;
    let bin = exe.with_file_name("pes-server");
    ensure!(
        bin.is_file(),
        "{} not found: build it with `cargo build --release` (same target dir as pes-bench)",
        bin.display()
    );
    Ok(bin)
}

/// The bench holds one socket per subscriber; fail early when the soft limit cannot hold them.
fn check_open_files(subscribers: usize) -> Result<()> {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(soft) = soft {
        let needed = subscribers + 256;
        ensure!(
            soft >= needed,
            "--subscribers {subscribers} needs about {needed} open files but the soft limit is \
             {soft}: raise it (`ulimit -n {needed}`) or use fewer subscribers"
        );
    }
    Ok(())
}

/// What the figures were measured on.
struct Machine {
    cores: usize,
    model: String,
    clock_ticks: u64,
    ticks_assumed: bool,
}

impl Machine {
    fn read() -> Machine {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown cpu".into());
        let ticks = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|t| *t > 0);
        Machine {
            cores,
            model,
            clock_ticks: ticks.unwrap_or(100),
            ticks_assumed: ticks.is_none(),
        }
    }

    fn ticks_to_secs(&self, ticks: u64) -> f64 {
        ticks as f64 / self.clock_ticks as f64
    }

    fn header(&self, db: &Database, what: &str) -> String {
        format!(
            "pes-bench  store={}  {what}  machine: {} cores, {}{}",
            db.kind_name(),
            self.cores,
            self.model,
            if self.ticks_assumed {
                " (CLK_TCK assumed 100)"
            } else {
                ""
            }
        )
    }
}

/// utime + stime of a process, in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn proc_cpu_ticks(pid: &str) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let after_comm = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // after the comm, field 3 (state) is index 0, so field 14 is index 11.
    let get = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat"))
    };
    Ok(get(11)? + get(12)?)
}

/// A `kB` line of `/proc/<pid>/status` (`VmHWM`, `VmRSS`).
fn proc_status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no {key} in /proc/{pid}/status"))
}

/// CPU ticks of every process named `postgres` visible here (approximate: it includes other
/// databases' work on the same server, and misses backends that exit inside the window).
fn postgres_cpu_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|pid| proc_cpu_ticks(&pid).ok())
        .sum()
}

/// Busy and total ticks of the whole machine (`/proc/stat`, first line).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// CPU readings at one instant, to be subtracted from a later one.
#[derive(Clone, Copy)]
struct CpuSample {
    at: Instant,
    service: u64,
    bench: u64,
    postgres: u64,
    machine_busy: u64,
    machine_total: u64,
}

impl CpuSample {
    fn take(server: &Server) -> Result<CpuSample> {
        let (machine_busy, machine_total) = machine_ticks();
        Ok(CpuSample {
            at: Instant::now(),
            service: proc_cpu_ticks(&server.pid.to_string())?,
            bench: proc_cpu_ticks("self").unwrap_or(0),
            postgres: postgres_cpu_ticks(),
            machine_busy,
            machine_total,
        })
    }

    /// Cores busy between two samples.
    fn usage_since(&self, before: &CpuSample, m: &Machine) -> CpuUsage {
        let wall = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let cores = |t: u64| m.ticks_to_secs(t) / wall;
        let total = self
            .machine_total
            .saturating_sub(before.machine_total)
            .max(1) as f64;
        CpuUsage {
            service_secs: m.ticks_to_secs(self.service.saturating_sub(before.service)),
            service_cores: cores(self.service.saturating_sub(before.service)),
            bench_cores: cores(self.bench.saturating_sub(before.bench)),
            postgres_cores: cores(self.postgres.saturating_sub(before.postgres)),
            machine_busy: self.machine_busy.saturating_sub(before.machine_busy) as f64 / total,
        }
    }
}

struct CpuUsage {
    service_secs: f64,
    service_cores: f64,
    bench_cores: f64,
    postgres_cores: f64,
    /// Fraction of all cores busy (any process).
    machine_busy: f64,
}

impl CpuUsage {
    fn line(&self, m: &Machine, store: StoreKind) -> String {
        let pg = if store == StoreKind::Postgres {
            format!("  postgres {:.2}", self.postgres_cores)
        } else {
            String::new()
        };
        format!(
            "CPU (cores busy)  service {:.2}{pg}  bench {:.2}  machine {:.0}% of {} cores",
            self.service_cores,
            self.bench_cores,
            self.machine_busy * 100.0,
            m.cores
        )
    }

    fn to_json(&self) -> Value {
        json!({
            "serviceCores": self.service_cores,
            "postgresCores": self.postgres_cores,
            "benchCores": self.bench_cores,
            "machineBusy": self.machine_busy,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The fake model.
// ---------------------------------------------------------------------------------------------

/// An instant OpenAI-compatible Chat Completions endpoint that answers by request shape.
struct FakeLlm {
    url: String,
    state: Arc<FakeState>,
}

struct FakeState {
    calls: AtomicU64,
    /// How long each reply waits.
    latency: Duration,
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(default)]
    response_format: Option<ResponseFormat>,
    #[serde(default)]
    messages: Vec<ChatMessage>,
}

#[derive(Deserialize)]
struct ResponseFormat {
    #[serde(default)]
    json_schema: Option<SchemaName>,
}

#[derive(Deserialize)]
struct SchemaName {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// The planner's note that a thread already has a plan (see `prompts::refinement_note`).
const REFINEMENT_MARK: &str = "This thread already has a plan";

impl FakeLlm {
    async fn start(latency_ms: u64) -> Result<FakeLlm> {
        let state = Arc::new(FakeState {
            calls: AtomicU64::new(0),
            latency: Duration::from_millis(latency_ms),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fake model")?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/v1/chat/completions", post(fake_completion))
            .with_state(state.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("pes-bench: the fake model stopped: {e}");
            }
        });
        Ok(FakeLlm {
            url: format!("http://{addr}/v1"),
            state,
        })
    }

    fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::Relaxed)
    }
}

async fn fake_completion(State(state): State<Arc<FakeState>>, body: Bytes) -> Response {
    let n = state.calls.fetch_add(1, Ordering::Relaxed);
    if !state.latency.is_zero() {
        tokio::time::sleep(state.latency).await;
    }
    let req: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let schema = req
        .response_format
        .as_ref()
        .and_then(|f| f.json_schema.as_ref())
        .map(|s| s.name.as_str());
    let reply = match schema {
        Some("pes_plan") => content_reply(plan_json(&req, n)),
        Some("pes_synthesis") => {
            content_reply(json!({"response": "done", "sources": [], "suggestions": []}).to_string())
        }
        _ if req.messages.last().is_some_and(|m| m.role == "tool") => content_reply("ok".into()),
        _ => calculator_call(n),
    };
    axum::Json(reply).into_response()
}

/// The 3-item plan; on a refinement (a follow-up query on a thread, SSE mode) the items get
/// fresh ids so that every run executes three new items.
fn plan_json(req: &ChatRequest, n: u64) -> String {
    let refining = req.messages.iter().any(|m| {
        m.role == "user"
            && m.content
                .as_ref()
                .and_then(Value::as_str)
                .is_some_and(|c| c.contains(REFINEMENT_MARK))
    });
    let suffix = if refining {
        format!("-{n}")
    } else {
        String::new()
    };
    let item = |id: &str, expr: &str| {
        json!({
            "id": format!("{id}{suffix}"),
            "description": format!("compute {expr}"),
            "stepType": "tool",
            "requiredTools": ["calculator"],
            "expectedOutcome": "n",
            "dependencies": [],
            "kind": "leaf",
            "role": null,
            "toolAllowlist": null,
        })
    };
    json!({
        "title": "t", "intent": "i", "plan": "p",
        "todoList": [item("a", "1+1"), item("b", "2+2"), item("c", "3+3")],
    })
    .to_string()
}

fn content_reply(content: String) -> Value {
    completion(json!({"role": "assistant", "content": content}), "stop")
}

fn calculator_call(n: u64) -> Value {
    let call = json!({
        "id": format!("call_{n}"),
        "type": "function",
        "function": {"name": "calculator", "arguments": "{\"expression\":\"1+1\"}"},
    });
    completion(
        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
        "tool_calls",
    )
}

fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "bench",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
}

// ---------------------------------------------------------------------------------------------
// The store.
// ---------------------------------------------------------------------------------------------

/// A fresh store for one bench run.
enum Database {
    Postgres {
        admin: PgPool,
        name: String,
        url: String,
    },
    Sqlite {
        dir: PathBuf,
        url: String,
    },
}

impl Database {
    async fn create(args: &Args) -> Result<Database> {
        let id = uuid::Uuid::now_v7().simple().to_string();
        match args.store {
            StoreKind::Postgres => Self::create_postgres(&args.database_url, &id).await,
            StoreKind::Sqlite => Self::create_sqlite(&id),
        }
    }

    async fn create_postgres(admin_url: &str, id: &str) -> Result<Database> {
        let mut url = reqwest::Url::parse(admin_url)
            .with_context(|| format!("--database-url {admin_url:?} is not a URL"))?;
        ensure!(
            matches!(url.scheme(), "postgres" | "postgresql"),
            "--database-url must be a postgres:// URL"
        );
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(admin_url)
            .await
            .with_context(|| format!("connecting to Postgres at {}", redact(&url)))?;
        let name = format!("pes_bench_{id}");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        url.set_path(&format!("/{name}"));
        Ok(Database::Postgres {
            admin,
            name,
            url: url.to_string(),
        })
    }

    fn create_sqlite(id: &str) -> Result<Database> {
        let dir = std::env::temp_dir().join(format!("pes-bench-{id}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let url = format!("sqlite://{}/pes.db", dir.display());
        Ok(Database::Sqlite { dir, url })
    }

    fn url(&self) -> &str {
        match self {
            Database::Postgres { url, .. } | Database::Sqlite { url, .. } => url,
        }
    }

    fn kind(&self) -> StoreKind {
        match self {
            Database::Postgres { .. } => StoreKind::Postgres,
            Database::Sqlite { .. } => StoreKind::Sqlite,
        }
    }

    fn kind_name(&self) -> &'static str {
        match self.kind() {
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
        }
    }

    /// Committed transactions of the bench database so far (Postgres only).
    async fn xact_commit(&self) -> Result<Option<i64>> {
        let Database::Postgres { admin, name, .. } = self else {
            return Ok(None);
        };
        let n: i64 =
            sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
                .bind(name)
                .fetch_one(admin)
                .await
                .context("reading pg_stat_database")?;
        Ok(Some(n))
    }

    async fn remove(&self) -> Result<()> {
        match self {
            Database::Postgres { admin, name, .. } => {
                sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(admin)
                    .await
                    .with_context(|| format!("dropping database {name}"))?;
                admin.close().await;
            }
            Database::Sqlite { dir, .. } => std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing {}", dir.display()))?,
        }
        Ok(())
    }
}

/// A URL without its password, for messages.
fn redact(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    u.to_string()
}

/// Postgres publishes a backend's statistics at most once a second while it is busy and within
/// 10 s once it is idle (PostgreSQL 15+), so `xact_commit` is read after the service has been
/// idle that long.
const PG_STATS_SETTLE: Duration = Duration::from_secs(11);

// ---------------------------------------------------------------------------------------------
// The service under test.
// ---------------------------------------------------------------------------------------------

struct Server {
    child: tokio::sync::Mutex<Child>,
    pid: u32,
    base: String,
    http: reqwest::Client,
}

impl Server {
    async fn spawn(
        bin: &Path,
        args: &Args,
        db_url: &str,
        llm_url: &str,
        worker_concurrency: usize,
    ) -> Result<Server> {
        let port = free_port()?;
        let mut cmd = Command::new("sh");
        // Raise the open-file limit where the hard limit allows it, then become the server.
        cmd.arg("-c")
            .arg(r#"ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$0""#)
            .arg(bin);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PES_")) {
            cmd.env_remove(k);
        }
        cmd.env("PES_BIND", format!("127.0.0.1:{port}"))
            .env("PES_DATABASE_URL", db_url)
            .env("PES_LLM_BASE_URL", llm_url)
            .env("PES_LLM_API_KEY", "x")
            .env("PES_LLM_MODEL", "bench")
            .env("PES_LOG", "warn")
            .env("PES_WORKER_CONCURRENCY", worker_concurrency.to_string())
            .env(
                "PES_MAX_PARALLEL_ITEMS",
                args.max_parallel_items.to_string(),
            )
            .env(
                "PES_DATABASE_MAX_CONNECTIONS",
                args.database_max_connections.to_string(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the server exited at once"))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        let server = Server {
            child: tokio::sync::Mutex::new(child),
            pid,
            base: format!("http://127.0.0.1:{port}"),
            http,
        };
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    async fn wait_ready(&self, deadline: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.lock().await.try_wait()? {
                bail!("the server exited before it was ready ({status})");
            }
            let ready = self
                .http
                .get(self.url("/readyz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            ensure!(
                start.elapsed() < deadline,
                "the server was not ready within {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM, then SIGKILL after 10 s.
    async fn stop(&self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let mut child = self.child.lock().await;
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }

    async fn get_json(&self, path: &str) -> Result<Value> {
        let resp = self
            .http
            .get(self.url(path))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        json_body(resp, path).await
    }

    async fn post_json(&self, path: &str, body: &Value, timeout: Duration) -> Result<Value> {
        let resp = self
            .http
            .post(self.url(path))
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        json_body(resp, path).await
    }

    /// A counter of `/metrics`.
    async fn metric(&self, name: &str) -> Result<u64> {
        let text = self
            .http
            .get(self.url("/metrics"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .context("GET /metrics")?
            .text()
            .await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("/metrics has no {name}"))
    }

    async fn create_thread(&self) -> Result<String> {
        let t = self
            .post_json("/v1/threads", &json!({}), Duration::from_secs(30))
            .await?;
        t["threadId"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("POST /v1/threads answered without a threadId: {t}"))
    }

    /// Create `n` threads, `parallel` at a time.
    async fn create_threads(&self, n: usize, parallel: usize) -> Result<Vec<String>> {
        futures::stream::iter(0..n)
            .map(|_| self.create_thread())
            .buffer_unordered(parallel.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    fn rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid, "VmRSS")
    }

    fn peak_rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid, "VmHWM")
    }
}

async fn json_body(resp: reqwest::Response, what: &str) -> Result<Value> {
    let status = resp.status();
    let text = resp.text().await.with_context(|| format!("{what}: body"))?;
    ensure!(
        status.is_success(),
        "{what} answered {status}: {}",
        truncate(&text, 300)
    );
    serde_json::from_str(&text)
        .with_context(|| format!("{what}: not JSON: {}", truncate(&text, 300)))
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Run a phase under the bench's deadline.
async fn phase<T>(name: &str, limit: Duration, fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| anyhow!("{name} did not finish within {limit:?} (--phase-timeout)"))?
}

// ---------------------------------------------------------------------------------------------
// Runs mode.
// ---------------------------------------------------------------------------------------------

struct RunsReport {
    n: usize,
    failures: Vec<String>,
    wall: Duration,
    latencies: Vec<Duration>,
    xact_per_run: Option<f64>,
    idle_xact_per_sec: Option<f64>,
    commits_per_run: f64,
    cpu: CpuUsage,
    peak_rss_kib: u64,
    llm_calls_per_run: f64,
}

async fn runs_mode(
    args: &Args,
    db: &Database,
    server: &Server,
    fake: &FakeLlm,
    machine: &Machine,
) -> Result<RunsReport> {
    let limit = args.phase_deadline();
    let threads = phase(
        "creating threads",
        limit,
        server.create_threads(args.runs, args.concurrency.max(16)),
    )
    .await?;
    let idle_xact_per_sec = idle_xact_rate(db).await?;
    let xact_before = db.xact_commit().await?;
    let commits_before = server.metric("pes_commits_total").await?;
    let calls_before = fake.calls();
    let cpu_before = CpuSample::take(server)?;
    let started = Instant::now();
    let results = phase(
        "the runs load",
        limit,
        load_runs(server, &threads, args.concurrency, limit),
    )
    .await?;
    let wall = started.elapsed();
    let cpu = CpuSample::take(server)?.usage_since(&cpu_before, machine);
    let commits = server.metric("pes_commits_total").await? - commits_before;
    let llm_calls = fake.calls() - calls_before;
    let xact_after = settled_xact(db).await?;
    let n = args.runs;
    let (latencies, failures) = split_results(results);
    Ok(RunsReport {
        n,
        failures,
        wall,
        latencies,
        xact_per_run: xact_before
            .zip(xact_after)
            .map(|(b, a)| (a - b) as f64 / n as f64),
        idle_xact_per_sec,
        commits_per_run: commits as f64 / n as f64,
        cpu,
        peak_rss_kib: server.peak_rss_kib()?,
        llm_calls_per_run: llm_calls as f64 / n as f64,
    })
}

/// Transactions per second of the idle service (its poll and sweep loops), measured between two
/// settled readings; also leaves the counter settled for the baseline.
async fn idle_xact_rate(db: &Database) -> Result<Option<f64>> {
    if db.kind() != StoreKind::Postgres {
        return Ok(None);
    }
    let a = settled_xact(db).await?;
    let t = Instant::now();
    let b = settled_xact(db).await?;
    Ok(a.zip(b)
        .map(|(a, b)| (b - a) as f64 / t.elapsed().as_secs_f64()))
}

async fn settled_xact(db: &Database) -> Result<Option<i64>> {
    if db.kind() == StoreKind::Postgres {
        tokio::time::sleep(PG_STATS_SETTLE).await;
    }
    db.xact_commit().await
}

/// Post one query per thread with `concurrency` in flight; each result is the run's latency or
/// why it did not complete.
async fn load_runs(
    server: &Server,
    threads: &[String],
    concurrency: usize,
    timeout: Duration,
) -> Result<Vec<Result<Duration, String>>> {
    Ok(futures::stream::iter(threads)
        .map(|t| run_and_wait(server, t, timeout))
        .buffer_unordered(concurrency)
        .collect()
        .await)
}

async fn run_and_wait(
    server: &Server,
    thread: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let path = format!("/v1/threads/{thread}/runs/wait");
    let sent = Instant::now();
    let run = server
        .post_json(&path, &json!({"query": "bench"}), timeout)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let took = sent.elapsed();
    match run["status"].as_str() {
        Some("completed") => Ok(took),
        other => Err(format!(
            "run on {thread} ended {}: {}",
            other.unwrap_or("without a status"),
            truncate(&run["error"].to_string(), 300)
        )),
    }
}

fn split_results(results: Vec<Result<Duration, String>>) -> (Vec<Duration>, Vec<String>) {
    let mut ok = Vec::with_capacity(results.len());
    let mut failed = Vec::new();
    for r in results {
        match r {
            Ok(d) => ok.push(d),
            Err(e) => failed.push(e),
        }
    }
    ok.sort_unstable();
    (ok, failed)
}

/// The `p` quantile (0–1) of sorted values, nearest rank.
fn quantile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

impl RunsReport {
    fn runs_per_sec(&self) -> f64 {
        self.n as f64 / self.wall.as_secs_f64()
    }

    fn cpu_ms_per_item(&self) -> f64 {
        self.cpu.service_secs * 1000.0 / (3 * self.n) as f64
    }

    fn print(&self, args: &Args, db: &Database, m: &Machine) {
        let what = format!("runs={}  concurrency={}", self.n, args.concurrency);
        println!("{}", m.header(db, &what));
        println!("runs/s            {:.1}", self.runs_per_sec());
        println!("items/s           {:.1}", 3.0 * self.runs_per_sec());
        println!(
            "latency p50/p95/p99   {:.1} / {:.1} / {:.1} ms",
            ms(quantile(&self.latencies, 0.50)),
            ms(quantile(&self.latencies, 0.95)),
            ms(quantile(&self.latencies, 0.99))
        );
        match self.xact_per_run {
            Some(x) => println!(
                "transactions/run  {x:.1} (pg xact_commit, incl. read-only; idle service {:.1} tx/s)   run-state commits/run {:.1}",
                self.idle_xact_per_sec.unwrap_or(f64::NAN),
                self.commits_per_run
            ),
            None => println!(
                "transactions/run  {:.1} (pes_commits_total: run-state commits only)",
                self.commits_per_run
            ),
        }
        println!("service CPU/item  {:.2} ms", self.cpu_ms_per_item());
        println!("model calls/run   {:.1}", self.llm_calls_per_run);
        println!(
            "peak RSS          {:.1} MB",
            self.peak_rss_kib as f64 / 1024.0
        );
        println!("{}", self.cpu.line(m, db.kind()));
        self.print_failures();
    }

    fn print_failures(&self) {
        if self.failures.is_empty() {
            println!("failures          0");
            return;
        }
        println!(
            "failures          {} (first: {})",
            self.failures.len(),
            self.failures[0]
        );
    }

    fn to_json(&self, args: &Args) -> Value {
        json!({
            "runs": self.n,
            "concurrency": args.concurrency,
            "failures": self.failures.len(),
            "wallSeconds": self.wall.as_secs_f64(),
            "runsPerSec": self.runs_per_sec(),
            "itemsPerSec": 3.0 * self.runs_per_sec(),
            "latencyMs": {
                "p50": ms(quantile(&self.latencies, 0.50)),
                "p95": ms(quantile(&self.latencies, 0.95)),
                "p99": ms(quantile(&self.latencies, 0.99)),
            },
            "pgXactPerRun": self.xact_per_run,
            "idlePgXactPerSec": self.idle_xact_per_sec,
            "runStateCommitsPerRun": self.commits_per_run,
            "serviceCpuMsPerItem": self.cpu_ms_per_item(),
            "peakRssMb": self.peak_rss_kib as f64 / 1024.0,
            "llmCallsPerRun": self.llm_calls_per_run,
            "cpu": self.cpu.to_json(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// SSE mode.
// ---------------------------------------------------------------------------------------------

struct SseReport {
    subscribers: usize,
    connected: usize,
    threads: usize,
    obs_first_run: usize,
    obs_follow_up: usize,
    runs_posted: usize,
    runs_failed: u64,
    generated: i64,
    generation_wall: Duration,
    expected_deliveries: u64,
    delivered: u64,
    latencies_us: Vec<u32>,
    kib_per_subscriber: f64,
    cpu: CpuUsage,
    errors: Vec<String>,
}

/// What every subscriber shares with the driver.
struct Board {
    /// The last `seq` each subscriber received.
    last_seq: Vec<AtomicI64>,
    connected: AtomicUsize,
    finished: AtomicUsize,
    stop: watch::Receiver<bool>,
    connect_gate: Semaphore,
}

/// What one subscriber saw.
#[derive(Default)]
struct SubResult {
    latencies_us: Vec<u32>,
    delivered: u64,
    error: Option<String>,
}

/// Tasks that read the subscribers' streams (each drives its share of the streams).
const READER_TASKS: usize = 4;
/// Subscriptions being opened at once.
const CONNECT_PARALLEL: usize = 64;

async fn sse_mode(args: &Args, server: &Server, machine: &Machine) -> Result<SseReport> {
    let limit = args.phase_deadline();
    let (first, follow) = phase("calibration", limit, observations_per_run(server)).await?;
    let t = args.sse_threads.min(args.subscribers);
    let threads = phase("creating threads", limit, server.create_threads(t, 16)).await?;
    let rss_before = server.rss_kib()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let board = Arc::new(Board {
        last_seq: (0..args.subscribers).map(|_| AtomicI64::new(0)).collect(),
        connected: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        stop: stop_rx,
        connect_gate: Semaphore::new(CONNECT_PARALLEL),
    });
    let readers = spawn_readers(server, &threads, &board);
    phase(
        "opening subscribers",
        limit,
        wait_connected(&board, args.subscribers),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = server.rss_kib()?;
    let kib_per_subscriber = (rss_after as f64 - rss_before as f64)
        / board.connected.load(Ordering::Relaxed).max(1) as f64;

    let completed_before = ended_runs(server).await?;
    let failed_before = server.metric("pes_runs_failed_total").await?;
    let cpu_before = CpuSample::take(server)?;
    let started = Instant::now();
    let runs_per_sec = f64::from(args.rate) / first.max(1) as f64;
    let runs_posted = phase(
        "generating observations",
        limit,
        drive(
            server,
            &threads,
            runs_per_sec,
            Duration::from_secs(args.duration),
        ),
    )
    .await?;
    phase(
        "draining runs",
        limit,
        wait_runs_ended(server, completed_before + runs_posted as u64),
    )
    .await?;
    let generation_wall = started.elapsed();
    let finals = phase("reading last seqs", limit, last_seqs(server, &threads)).await?;
    let expected = expected_seqs(&finals, args.subscribers);
    // Deliveries may trail the commits; give them a bounded moment.
    let _ = tokio::time::timeout(Duration::from_secs(30), wait_delivered(&board, &expected)).await;
    let cpu = CpuSample::take(server)?.usage_since(&cpu_before, machine);
    let _ = stop_tx.send(true);
    let results = collect_readers(readers).await;
    let runs_failed = server.metric("pes_runs_failed_total").await? - failed_before;

    Ok(SseReport {
        subscribers: args.subscribers,
        connected: board.connected.load(Ordering::Relaxed),
        threads: threads.len(),
        obs_first_run: first,
        obs_follow_up: follow,
        runs_posted,
        runs_failed,
        generated: finals.iter().sum(),
        generation_wall,
        expected_deliveries: expected.iter().map(|s| *s as u64).sum(),
        delivered: results.iter().map(|r| r.delivered).sum(),
        latencies_us: merged_latencies(&results),
        kib_per_subscriber,
        cpu,
        errors: results.into_iter().filter_map(|r| r.error).collect(),
    })
}

/// Observations of a first run and of a follow-up run on one thread.
async fn observations_per_run(server: &Server) -> Result<(usize, usize)> {
    let thread = server.create_thread().await?;
    let mut counts = Vec::new();
    for _ in 0..2 {
        let path = format!("/v1/threads/{thread}/runs/wait");
        let run = server
            .post_json(&path, &json!({"query": "bench"}), Duration::from_secs(60))
            .await?;
        ensure!(
            run["status"] == "completed",
            "the calibration run did not complete: {}",
            truncate(&run.to_string(), 500)
        );
        let run_id = run["runId"].as_str().unwrap_or_default();
        let page = server
            .get_json(&format!(
                "/v1/threads/{thread}/observations?runId={run_id}&limit=1000"
            ))
            .await?;
        counts.push(page["items"].as_array().map_or(0, Vec::len));
    }
    Ok((counts[0], counts[1]))
}

fn spawn_readers(
    server: &Server,
    threads: &[String],
    board: &Arc<Board>,
) -> Vec<tokio::task::JoinHandle<Vec<SubResult>>> {
    let n = board.last_seq.len();
    (0..READER_TASKS.min(n))
        .map(|task| {
            let subs: Vec<(usize, String)> = (task..n)
                .step_by(READER_TASKS)
                .map(|i| {
                    (
                        i,
                        server.url(&format!(
                            "/v1/threads/{}/events",
                            threads[i % threads.len()]
                        )),
                    )
                })
                .collect();
            let http = server.http.clone();
            let board = board.clone();
            tokio::spawn(async move {
                futures::future::join_all(
                    subs.into_iter()
                        .map(|(i, url)| subscribe(http.clone(), url, i, board.clone())),
                )
                .await
            })
        })
        .collect()
}

async fn collect_readers(readers: Vec<tokio::task::JoinHandle<Vec<SubResult>>>) -> Vec<SubResult> {
    let mut all = Vec::new();
    for r in readers {
        match r.await {
            Ok(results) => all.extend(results),
            Err(e) => all.push(SubResult {
                error: Some(format!("a reader task failed: {e}")),
                ..SubResult::default()
            }),
        }
    }
    all
}

/// One subscriber: open the stream, then record every observation's delivery latency until the
/// bench says stop.
async fn subscribe(
    http: reqwest::Client,
    url: String,
    index: usize,
    board: Arc<Board>,
) -> SubResult {
    let mut out = SubResult::default();
    let resp = match open_stream(&http, &url, &board).await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(e);
            board.finished.fetch_add(1, Ordering::Relaxed);
            return out;
        }
    };
    board.connected.fetch_add(1, Ordering::Relaxed);
    board.finished.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = read_stream(resp, index, &board, &mut out).await {
        out.error = Some(e);
    }
    out
}

async fn open_stream(
    http: &reqwest::Client,
    url: &str,
    board: &Board,
) -> Result<reqwest::Response, String> {
    let _permit = board
        .connect_gate
        .acquire()
        .await
        .map_err(|e| e.to_string())?;
    let resp = http
        .get(url)
        .header("accept", "text/event-stream")
        .send()
        .await
        .map_err(|e| format!("opening {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("opening {url}: {}", resp.status()));
    }
    Ok(resp)
}

async fn read_stream(
    mut resp: reqwest::Response,
    index: usize,
    board: &Board,
    out: &mut SubResult,
) -> Result<(), String> {
    let mut stop = board.stop.clone();
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let chunk = tokio::select! {
            _ = stop.changed() => return Ok(()),
            c = resp.chunk() => c.map_err(|e| format!("reading a stream: {e}"))?,
        };
        let Some(chunk) = chunk else {
            return Err("a stream ended before the bench did".into());
        };
        let now = chrono::Utc::now();
        buf.extend_from_slice(&chunk);
        let consumed = parse_frames(&buf, |seq, created| {
            out.delivered += 1;
            let lat = (now - created).num_microseconds().unwrap_or(0).max(0);
            out.latencies_us
                .push(u32::try_from(lat).unwrap_or(u32::MAX));
            board.last_seq[index].fetch_max(seq, Ordering::Relaxed);
        });
        buf.drain(..consumed);
    }
}

/// Handle every complete frame in `buf`; returns how many bytes they took.
fn parse_frames(buf: &[u8], mut on_obs: impl FnMut(i64, chrono::DateTime<chrono::Utc>)) -> usize {
    let mut start = 0;
    while let Some(len) = buf[start..].windows(2).position(|w| w == b"\n\n") {
        let frame = &buf[start..start + len];
        if let Some((seq, created)) = parse_frame(frame) {
            on_obs(seq, created);
        }
        start += len + 2;
    }
    start
}

/// `(seq, createdAt)` of an observation frame; `None` for comments and token frames.
fn parse_frame(frame: &[u8]) -> Option<(i64, chrono::DateTime<chrono::Utc>)> {
    let text = std::str::from_utf8(frame).ok()?;
    let mut seq = None;
    let mut data = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            seq = v.trim().parse::<i64>().ok();
        } else if let Some(v) = line.strip_prefix("data:") {
            data = Some(v);
        }
    }
    let data = data?;
    const KEY: &str = "\"createdAt\":\"";
    // The observation's own createdAt is its last field; content may hold others before it.
    let at = data.rfind(KEY)? + KEY.len();
    let end = data[at..].find('"')? + at;
    let created = chrono::DateTime::parse_from_rfc3339(&data[at..end]).ok()?;
    Some((seq?, created.with_timezone(&chrono::Utc)))
}

async fn wait_connected(board: &Board, n: usize) -> Result<()> {
    while board.finished.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connected = board.connected.load(Ordering::Relaxed);
    ensure!(
        connected == n,
        "only {connected} of {n} subscribers could open their stream"
    );
    Ok(())
}

/// Post runs round-robin on the threads at `runs_per_sec` for `duration`; the number posted.
async fn drive(
    server: &Server,
    threads: &[String],
    runs_per_sec: f64,
    duration: Duration,
) -> Result<usize> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / runs_per_sec.max(0.01)));
    let start = Instant::now();
    let mut posts = futures::stream::FuturesUnordered::new();
    let mut k = 0;
    while start.elapsed() < duration {
        tokio::select! {
            _ = tick.tick() => {
                let path = format!("/v1/threads/{}/runs", threads[k % threads.len()]);
                k += 1;
                posts.push(async move {
                    server.post_json(&path, &json!({"query": "bench"}), Duration::from_secs(30)).await
                });
            }
            Some(r) = posts.next(), if !posts.is_empty() => { r?; }
        }
    }
    while let Some(r) = posts.next().await {
        r?;
    }
    Ok(k)
}

/// Runs this process has ended (completed, failed or cancelled).
async fn ended_runs(server: &Server) -> Result<u64> {
    Ok(server.metric("pes_runs_completed_total").await?
        + server.metric("pes_runs_failed_total").await?
        + server.metric("pes_runs_cancelled_total").await?)
}

async fn wait_runs_ended(server: &Server, target: u64) -> Result<()> {
    while ended_runs(server).await? < target {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The last committed `seq` of every thread.
async fn last_seqs(server: &Server, threads: &[String]) -> Result<Vec<i64>> {
    let mut out = Vec::with_capacity(threads.len());
    for t in threads {
        out.push(last_seq(server, t).await?);
    }
    Ok(out)
}

async fn last_seq(server: &Server, thread: &str) -> Result<i64> {
    let mut after = 0;
    loop {
        let page = server
            .get_json(&format!(
                "/v1/threads/{thread}/observations?after={after}&limit=1000"
            ))
            .await?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if let Some(seq) = items.last().and_then(|o| o["seq"].as_i64()) {
            after = seq;
        }
        if items.len() < 1000 {
            return Ok(after);
        }
    }
}

/// The seq every subscriber should reach (subscriber `i` listens on thread `i % threads`).
fn expected_seqs(finals: &[i64], subscribers: usize) -> Vec<i64> {
    (0..subscribers).map(|i| finals[i % finals.len()]).collect()
}

async fn wait_delivered(board: &Board, expected: &[i64]) {
    loop {
        let behind = expected
            .iter()
            .zip(&board.last_seq)
            .any(|(e, s)| s.load(Ordering::Relaxed) < *e);
        if !behind {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn merged_latencies(results: &[SubResult]) -> Vec<u32> {
    let mut all: Vec<u32> = results
        .iter()
        .flat_map(|r| r.latencies_us.iter().copied())
        .collect();
    all.sort_unstable();
    all
}

fn us_to_ms(v: Option<u32>) -> f64 {
    v.map_or(f64::NAN, |v| f64::from(v) / 1000.0)
}

impl SseReport {
    fn generated_per_sec(&self) -> f64 {
        self.generated as f64 / self.generation_wall.as_secs_f64()
    }

    fn print(&self, args: &Args, db: &Database, m: &Machine) {
        let what = format!(
            "sse subscribers={} threads={} rate={}/s duration={}s",
            self.subscribers, self.threads, args.rate, args.duration
        );
        println!("{}", m.header(db, &what));
        println!(
            "observations/run  {} (first run), {} (follow-up)",
            self.obs_first_run, self.obs_follow_up
        );
        println!(
            "generated         {} observations by {} runs in {:.1} s = {:.0}/s ({} runs failed)",
            self.generated,
            self.runs_posted,
            self.generation_wall.as_secs_f64(),
            self.generated_per_sec(),
            self.runs_failed
        );
        println!(
            "delivered         {} of {} expected ({} subscribers connected)",
            self.delivered, self.expected_deliveries, self.connected
        );
        let q = |p| us_to_ms(quantile(&self.latencies_us, p));
        println!(
            "delivery p50/p99/max  {:.1} / {:.1} / {:.1} ms (commit to receipt)",
            q(0.50),
            q(0.99),
            q(1.0)
        );
        println!(
            "idle subscriber   {:.1} KiB (service RSS)",
            self.kib_per_subscriber
        );
        println!("{}", self.cpu.line(m, db.kind()));
        match self.errors.first() {
            None => println!("stream errors     0"),
            Some(e) => println!("stream errors     {} (first: {e})", self.errors.len()),
        }
    }

    fn to_json(&self, args: &Args) -> Value {
        let q = |p| us_to_ms(quantile(&self.latencies_us, p));
        json!({
            "subscribers": self.subscribers,
            "connected": self.connected,
            "threads": self.threads,
            "targetRate": args.rate,
            "durationSeconds": args.duration,
            "observationsPerRun": {"first": self.obs_first_run, "followUp": self.obs_follow_up},
            "runsPosted": self.runs_posted,
            "runsFailed": self.runs_failed,
            "generated": self.generated,
            "generatedPerSec": self.generated_per_sec(),
            "expectedDeliveries": self.expected_deliveries,
            "delivered": self.delivered,
            "deliveryMs": {"p50": q(0.50), "p99": q(0.99), "max": q(1.0)},
            "kibPerIdleSubscriber": self.kib_per_subscriber,
            "cpu": self.cpu.to_json(),
            "streamErrors": self.errors.len(),
        })
    }
}
