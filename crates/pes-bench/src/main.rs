//! `pes-bench`: load the real `pes-server` binary over HTTP and print what it costs.
//!
//! The bench starts `pes-server` (the release binary next to its own executable: build both with
//! `cargo build --release -p pes-server -p pes-bench`) as a child process on a free loopback port,
//! pointed at the workspace's fake OpenAI-compatible model (`fake-openai`, the one the tests
//! script) that the bench serves in-process, on a fresh store: a new Postgres database
//! `pes_bench_<uuid>` (dropped at the end) or a new SQLite file in a temporary folder.
//!
//! The workload is the peers' one (`fake_openai::Workload::Calculator3`): every query gets a
//! 3-item plan, every item makes one `calculator` call and then answers, then the run
//! synthesizes; that is 8 model calls and 3 tool executions per run, every step durable.
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
//! - `--mode inflight`: N runs in flight at once against a slow model. The service drives up to
//!   N runs (`PES_WORKER_CONCURRENCY`); the model holds every call while the bench posts one run
//!   on each of N threads (`POST /v1/threads/{id}/runs`) and until all N wait on it, then answers
//!   each call after `--model-latency-ms`. The bench polls `/metrics` once a second until every
//!   run has ended, then reads each run once. Prints the service's RSS with all N runs waiting,
//!   its peak RSS (`VmHWM`), the most model calls in flight at once, and whether every run
//!   completed.
//!
//! - `--mode long-thread`: `--runs` follow-ups on ONE thread, one after another (`What is
//!   2+<n>?`), each posted with `/runs/wait`. Prints the prompt tokens (`usage.promptTokens`) and
//!   latency of runs 1, 2, 10, 50, 100, 200 (those reached) and the last, and the last run's prompt
//!   tokens over run 2's: a long thread must stay as cheap as a short one. `--llm offline` runs
//!   the service's built-in offline model (and checks every answer holds its own result);
//!   `--server-url` measures a server already running instead of spawning one.
//!
//! - `--webhooks` (runs mode): the load without and with a webhook on every run (sent to a
//!   receiver the bench serves), in alternating rounds on one service; both sides' figures and
//!   the change are printed (W3 with webhooks must stay within 5 % of W3 without).
//! - `--mode store`: the memory store's full-text search latency over `--items` items (default
//!   100,000), filled through `PUT /v1/store/items`: p50/p99 of searches in one user's namespace,
//!   across the whole store, and of a listing without a query (see `memory_store`).
//! - `--mode history`: one thread grown to `--observations` observations (default 10,000) by
//!   follow-ups, then `--reads` past states read at seqs spread over its log: p50/p99/max of a
//!   past-state read (see `history`).
//! - `--mode fork-stall`: as one tenant, one thread grown to `--observations` observations, then
//!   `--forks` forks of it at once while another tenant writes memory-store items one after
//!   another: the other tenant's write latency alone and during the forks, against the bound
//!   (p99 ≤ 250 ms), and each fork's duration (see `fork_stall`). The service gets two API keys.
//!
//! Every phase has a deadline (`--phase-timeout`); the bench fails with a clear message when one
//! passes, and always stops the service and removes the store it made.

mod fork_stall;
mod history;
mod inflight;
mod long_thread;
mod memory_store;
mod receiver;
mod runs;
mod server;
mod sse;
mod store;
mod system;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::{Parser, ValueEnum};
use fake_openai::FakeLlm;
use serde_json::json;

use crate::server::Server;
use crate::store::Database;
use crate::system::Machine;

/// Load the real pes-server over loopback HTTP and print throughput, latency and cost figures.
#[derive(Debug, Clone, Parser)]
#[command(name = "pes-bench", version, about)]
pub(crate) struct Args {
    /// Store behind the service.
    #[arg(long, value_enum, default_value = "postgres")]
    pub(crate) store: StoreKind,
    /// Admin URL of a Postgres server; the bench creates (and drops) a fresh database there.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub(crate) database_url: String,
    /// `PES_DATABASE_MAX_CONNECTIONS` of the service.
    #[arg(long, default_value_t = 16)]
    pub(crate) database_max_connections: u32,
    /// What to measure.
    #[arg(long, value_enum, default_value = "runs")]
    pub(crate) mode: Mode,
    /// Runs and inflight modes: runs (one per fresh thread).
    #[arg(long, default_value_t = 500)]
    pub(crate) runs: usize,
    /// Runs mode: requests in flight (inflight mode: posts in flight, at least 16).
    #[arg(long, default_value_t = 8)]
    pub(crate) concurrency: usize,
    /// SSE mode: subscribers.
    #[arg(long, default_value_t = 1000)]
    pub(crate) subscribers: usize,
    /// SSE mode: threads the subscribers are spread over (each run adds 3 items to its
    /// thread's plan, so few threads mean long plans and large PLAN_UPDATE observations).
    #[arg(long, default_value_t = 100)]
    pub(crate) sse_threads: usize,
    /// SSE mode: observations per second to generate (about).
    #[arg(long, default_value_t = 1000)]
    pub(crate) rate: u32,
    /// SSE mode: seconds to generate observations.
    #[arg(long, default_value_t = 10)]
    pub(crate) duration: u64,
    /// Deadline of every phase, in seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) phase_timeout: u64,
    /// Also print one JSON line with the results.
    #[arg(long)]
    pub(crate) json: bool,
    /// History and fork-stall modes: observations the thread is grown to before reading its
    /// past states (forking it).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) observations: i64,
    /// History mode: past states read, one after another.
    #[arg(long, default_value_t = 500)]
    pub(crate) reads: usize,
    /// Fork-stall mode: forks of the grown thread, all at once.
    #[arg(long, default_value_t = 10)]
    pub(crate) forks: usize,
    /// Store mode: items written before searching.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) items: usize,
    /// Store mode: searches of each kind, one after another.
    #[arg(long, default_value_t = 2000)]
    pub(crate) searches: usize,
    /// How long the fake model takes to answer each request, in milliseconds (0: at once). With
    /// a latency, the effect of parallel items on run latency shows: the plan's 3 items are
    /// independent. Inflight mode: 2 s is the target's model.
    #[arg(long, default_value_t = 0)]
    pub(crate) model_latency_ms: u64,
    /// `PES_MAX_PARALLEL_ITEMS` of the service (1 runs the items one at a time).
    #[arg(long, default_value_t = 4)]
    pub(crate) max_parallel_items: u32,
    /// The model the spawned service uses: the bench's fake OpenAI-compatible model, or the
    /// service's built-in offline model.
    #[arg(long, value_enum, default_value = "fake")]
    pub(crate) llm: LlmKind,
    /// Runs mode: measure the load on one service without and with a webhook on every run
    /// (`webhook: {url}`, to a receiver the bench serves on loopback; the service signs and
    /// sends them), in eight rounds of `--runs`/8 alternating off, on, on, off, and print both
    /// sides' figures and the change. The bench waits
    /// until every run's webhook has arrived, and says how many did.
    #[arg(long)]
    pub(crate) webhooks: bool,
    /// Long-thread mode: measure the server already listening at this base URL (e.g.
    /// `http://127.0.0.1:8080`, with no API keys) instead of spawning one; its own store and
    /// model are used, and `--store`/`--llm` only label the report.
    #[arg(long)]
    pub(crate) server_url: Option<String>,
    /// Runs mode: give every run a budget it never reaches (`maxTokens`, `maxCostUsd`) and the
    /// service a price table, so every model call passes the budget check and is priced: what a
    /// budget costs, against the same run without.
    #[arg(long)]
    pub(crate) budget: bool,
}

/// The key the service signs the bench's webhooks with (`--webhooks`).
const BENCH_WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LlmKind {
    /// The fake OpenAI-compatible model served by the bench (`fake-openai`'s 3-item workload).
    Fake,
    /// The service's built-in deterministic offline model (`PES_LLM_PROVIDER=offline`).
    Offline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreKind {
    Postgres,
    Sqlite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Throughput, latency and cost of runs posted with `/runs/wait`.
    Runs,
    /// Idle subscriber cost and delivery latency of the SSE streams.
    Sse,
    /// Runs, then SSE.
    Both,
    /// `--runs` runs in flight at once against a slow model: memory and completion.
    Inflight,
    /// `--runs` follow-ups on one thread: prompt tokens and latency as the thread grows.
    LongThread,
    /// Memory store search latency over `--items` items.
    Store,
    /// Past-state reads of one thread grown to `--observations` observations.
    History,
    /// Another tenant's write latency while `--forks` forks of a long thread run.
    ForkStall,
}

impl Args {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.mode != Mode::Inflight || self.model_latency_ms > 0,
            "--mode inflight needs a slow model: give --model-latency-ms (e.g. 2000)"
        );
        ensure!(self.runs > 0, "--runs must be at least 1");
        ensure!(self.items > 0, "--items must be at least 1");
        ensure!(
            self.observations > 0 && self.reads > 0,
            "--observations and --reads must be at least 1"
        );
        ensure!(self.searches > 0, "--searches must be at least 1");
        ensure!(self.forks > 0, "--forks must be at least 1");
        ensure!(
            self.server_url.is_none() || self.mode == Mode::LongThread,
            "--server-url is for --mode long-thread only"
        );
        ensure!(
            self.llm == LlmKind::Fake || self.mode == Mode::LongThread,
            "--llm offline is for --mode long-thread only"
        );
        ensure!(self.concurrency > 0, "--concurrency must be at least 1");
        ensure!(
            !self.webhooks || self.mode == Mode::Runs,
            "--webhooks is for --mode runs only"
        );
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

    pub(crate) fn phase_deadline(&self) -> Duration {
        Duration::from_secs(self.phase_timeout)
    }

    fn wants_runs(&self) -> bool {
        matches!(self.mode, Mode::Runs | Mode::Both)
    }

    fn wants_sse(&self) -> bool {
        matches!(self.mode, Mode::Sse | Mode::Both)
    }

    /// The service's settings for this mode: it drives at least 64 runs at once (inflight
    /// mode: every run), and in inflight mode a model call may wait for as long as posting
    /// takes (the model holds every call until all runs wait on it).
    pub(crate) fn service_settings(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (
                "PES_MAX_PARALLEL_ITEMS",
                self.max_parallel_items.to_string(),
            ),
            (
                "PES_DATABASE_MAX_CONNECTIONS",
                self.database_max_connections.to_string(),
            ),
        ];
        if self.webhooks {
            // The bench's receiver is on loopback; the secret only has to be well formed.
            env.push(("PES_WEBHOOK_SECRET", BENCH_WEBHOOK_SECRET.to_owned()));
            env.push(("PES_WEBHOOK_ALLOW", "127.0.0.1".to_owned()));
        }
        if self.mode == Mode::Store {
            env.push((
                "PES_TENANT_MAX_STORE_ITEMS",
                (self.items + 1000).to_string(),
            ));
        }
        if self.mode == Mode::ForkStall {
            // Two tenants; the bystander writes a new item each time, for as long as forks take.
            env.push(("PES_API_KEYS", fork_stall::api_keys()));
            env.push(("PES_TENANT_MAX_STORE_ITEMS", "100000000".to_owned()));
        }
        if self.budget {
            env.push((
                "PES_MODEL_PRICES",
                r#"{"*": {"input": 0.15, "output": 0.6}}"#.to_owned(),
            ));
        }
        if self.mode == Mode::Inflight {
            let hold = self.phase_timeout * 2 + self.model_latency_ms / 1000 + 60;
            env.push(("PES_WORKER_CONCURRENCY", self.runs.max(64).to_string()));
            env.push(("PES_LLM_TIMEOUT_SECONDS", hold.to_string()));
            // Every run waits on the model at once: one call each.
            env.push(("PES_LLM_MAX_IN_FLIGHT", self.runs.max(1).to_string()));
        } else {
            env.push((
                "PES_WORKER_CONCURRENCY",
                self.concurrency.max(64).to_string(),
            ));
        }
        env
    }

    /// Sockets the bench may hold at once: subscribers, or the model calls of the runs in
    /// flight (every run's plan call is held at once).
    fn open_files_needed(&self) -> usize {
        match self.mode {
            Mode::Runs | Mode::LongThread | Mode::History => 0,
            Mode::Store => self.concurrency,
            Mode::ForkStall => self.forks + 1,
            Mode::Sse | Mode::Both => self.subscribers,
            Mode::Inflight => self.runs,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // reqwest has TLS without a crypto provider when built beside pes-server: install ring's.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    if let Some(url) = &args.server_url {
        let server = Server::remote(url)?;
        server.wait_ready(Duration::from_secs(10)).await?;
        let r = long_thread::long_thread_mode(&args, &server).await?;
        return print_long_thread(&args, &r, &format!("given server {url}"));
    }
    system::raise_open_files();
    system::check_open_files(args.open_files_needed())?;
    let server_bin = server::server_binary()?;
    let fake = FakeLlm::bench(Duration::from_millis(args.model_latency_ms))
        .await
        .context("starting the fake model")?;
    let db = Database::create(&args).await?;
    let outcome = bench_on(&args, &db, &fake, &server_bin).await;
    if let Err(e) = db.remove().await {
        eprintln!("pes-bench: could not remove the bench store: {e:#}");
    }
    outcome
}

async fn bench_on(args: &Args, db: &Database, fake: &FakeLlm, bin: &Path) -> Result<()> {
    let server = Server::spawn(bin, args, db.url(), &fake.url).await?;
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
    if args.mode == Mode::LongThread {
        let r = long_thread::long_thread_mode(args, server).await?;
        return print_long_thread(args, &r, db.kind_name());
    }
    if args.mode == Mode::History {
        let r = history::history_mode(args, server).await?;
        r.print(&format!(
            "pes-bench  mode=history  store={}  machine: {} cores, {}",
            db.kind_name(),
            machine.cores,
            machine.model
        ));
        if args.json {
            println!(
                "{}",
                json!({"store": db.kind_name(), "history": r.to_json()})
            );
        }
        return Ok(());
    }
    if args.mode == Mode::Store {
        let r = memory_store::store_mode(args, server).await?;
        r.print(args, db, machine);
        report["store"] = r.to_json(args);
    }
    if args.mode == Mode::ForkStall {
        let r = fork_stall::fork_stall_mode(args, server).await?;
        r.print(args, db, machine);
        report["forkStall"] = r.to_json(args);
    }
    if args.mode == Mode::Inflight {
        let r = inflight::inflight_mode(args, server, fake, machine).await?;
        r.print(args, db, machine);
        report["inflight"] = r.to_json(args);
    }
    if args.wants_runs() && args.webhooks {
        webhooks_compared(args, db, server, fake, machine, &mut report).await?;
    } else if args.wants_runs() {
        let r = runs::runs_mode(args, db, server, fake, machine).await?;
        r.print(args, db, machine);
        report["runs"] = r.to_json(args);
    }
    if args.wants_sse() {
        let s = sse::sse_mode(args, server, machine).await?;
        s.print(args, db, machine);
        report["sse"] = s.to_json(args);
    }
    if args.json {
        println!("{report}");
    }
    Ok(())
}

/// `--webhooks`: the runs load in rounds without and with a webhook on every run, in the order
/// off, on, on, off (twice), so that a machine growing busier or quieter while the bench runs
/// weighs on both alike; each side's rounds are added up and compared.
async fn webhooks_compared(
    args: &Args,
    db: &Database,
    server: &Server,
    fake: &FakeLlm,
    machine: &Machine,
    report: &mut serde_json::Value,
) -> Result<()> {
    const ORDER: [bool; 8] = [false, true, true, false, false, true, true, false];
    let hooks = receiver::Receiver::start().await?;
    let n = (args.runs / ORDER.len()).max(1);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for with in ORDER {
        let round = runs::Round {
            n,
            webhook: with.then_some(hooks.url.as_str()),
            xact: false,
        };
        let r = runs::runs_round(args, db, server, fake, machine, &round).await?;
        if with { on.push(r) } else { off.push(r) }
    }
    let (off, on) = (
        runs::RunsReport::combine(off),
        runs::RunsReport::combine(on),
    );
    // Every run's webhook, once: wait for the last ones still in flight.
    let sent = n * ORDER.iter().filter(|w| **w).count();
    let all = hooks.wait_for(sent, args.phase_deadline()).await;
    println!("without webhooks");
    off.print(args, db, machine);
    println!("\nwith a webhook on every run ({})", hooks.url);
    on.print(args, db, machine);
    let (requests, ids) = hooks.counts();
    println!(
        "webhooks          {ids} of {sent} runs' webhooks delivered, {requests} requests{}",
        if all { "" } else { " (the others never came)" }
    );
    let postgres = if db.kind() == StoreKind::Postgres {
        format!(
            ", postgres CPU/run {:+.1} % ({:.2} → {:.2} ms; every Postgres process of the \
             machine counts)",
            runs::change(off.postgres_ms_per_run(), on.postgres_ms_per_run()),
            off.postgres_ms_per_run(),
            on.postgres_ms_per_run()
        )
    } else {
        String::new()
    };
    println!(
        "webhooks cost     runs/s {:+.1} %, p50 latency {:+.1} %, service CPU/item {:+.1} %{postgres}",
        runs::change(off.runs_per_sec(), on.runs_per_sec()),
        runs::change(off.p50_ms(), on.p50_ms()),
        runs::change(off.cpu_ms_per_item(), on.cpu_ms_per_item()),
    );
    report["runs"] = off.to_json(args);
    report["runsWithWebhooks"] = on.to_json(args);
    report["webhooks"] = json!({"sent": sent, "delivered": ids, "requests": requests});
    Ok(())
}

/// Long-thread mode's report: the figures, and the JSON line when asked.
fn print_long_thread(args: &Args, r: &long_thread::LongThreadReport, store: &str) -> Result<()> {
    let machine = Machine::read();
    r.print(&format!(
        "pes-bench  mode=long-thread  store={store}  llm={}  runs={}  machine: {} cores, {}",
        match args.llm {
            LlmKind::Fake => "fake",
            LlmKind::Offline => "offline",
        },
        args.runs,
        machine.cores,
        machine.model
    ));
    if args.json {
        println!("{}", json!({"store": store, "longThread": r.to_json()}));
    }
    Ok(())
}
