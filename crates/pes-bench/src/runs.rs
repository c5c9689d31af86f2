//! Runs mode: throughput, latency and cost of runs posted with `/runs/wait`, C at a time.

use std::time::{Duration, Instant};

use anyhow::Result;
use fake_openai::FakeLlm;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::server::{Server, phase, truncate};
use crate::store::{Database, PG_STATS_SETTLE};
use crate::system::{CpuSample, CpuUsage, Machine};
use crate::{Args, StoreKind};

/// What runs mode measured.
pub(crate) struct RunsReport {
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
    /// How many rounds were added up (1: one load).
    n_rounds: usize,
}

pub(crate) async fn runs_mode(
    args: &Args,
    db: &Database,
    server: &Server,
    fake: &FakeLlm,
    machine: &Machine,
) -> Result<RunsReport> {
    runs_round(args, db, server, fake, machine, &Round::plain(args.runs)).await
}

/// One load of `n` runs: with a webhook on each when `webhook` is given; `xact` reads Postgres's
/// transaction counter (which needs the statistics to settle, seconds each side).
pub(crate) struct Round<'a> {
    pub(crate) n: usize,
    pub(crate) webhook: Option<&'a str>,
    pub(crate) xact: bool,
}

impl Round<'_> {
    fn plain(n: usize) -> Self {
        Round {
            n,
            webhook: None,
            xact: true,
        }
    }
}

pub(crate) async fn runs_round(
    args: &Args,
    db: &Database,
    server: &Server,
    fake: &FakeLlm,
    machine: &Machine,
    round: &Round<'_>,
) -> Result<RunsReport> {
    let limit = args.phase_deadline();
    let threads = phase(
        "creating threads",
        limit,
        server.create_threads(round.n, args.concurrency.max(16)),
    )
    .await?;
    let idle_xact_per_sec = if round.xact {
        idle_xact_rate(db).await?
    } else {
        None
    };
    let xact_before = if round.xact {
        db.xact_commit().await?
    } else {
        None
    };
    let commits_before = server.metric("pes_commits_total").await?;
    let calls_before = fake.calls();
    let cpu_before = CpuSample::take(server.pid)?;
    let started = Instant::now();
    let results = phase(
        "the runs load",
        limit,
        load_runs(
            server,
            &threads,
            args.concurrency,
            limit,
            round.webhook,
            args.budget,
        ),
    )
    .await?;
    let wall = started.elapsed();
    let cpu = CpuSample::take(server.pid)?.usage_since(&cpu_before, machine);
    let commits = server.metric("pes_commits_total").await? - commits_before;
    let llm_calls = fake.calls() - calls_before;
    let xact_after = if round.xact {
        settled_xact(db).await?
    } else {
        None
    };
    let n = round.n;
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
        n_rounds: 1,
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
    webhook: Option<&str>,
    budget: bool,
) -> Result<Vec<Result<Duration, String>>> {
    let mut body = json!({"query": "bench"});
    if let Some(url) = webhook {
        body["webhook"] = json!({"url": url});
    }
    if budget {
        body["config"] =
            json!({"budget": {"maxTokens": 1_000_000_000_000_u64, "maxCostUsd": 1_000_000.0}});
    }
    Ok(futures::stream::iter(threads)
        .map(|t| run_and_wait(server, t, timeout, &body))
        .buffer_unordered(concurrency)
        .collect()
        .await)
}

async fn run_and_wait(
    server: &Server,
    thread: &str,
    timeout: Duration,
    body: &Value,
) -> Result<Duration, String> {
    let path = format!("/v1/threads/{thread}/runs/wait");
    let sent = Instant::now();
    let run = server
        .post_json(&path, body, timeout)
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
pub(crate) fn quantile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

pub(crate) fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// The change from `before` to `after`, in percent.
pub(crate) fn change(before: f64, after: f64) -> f64 {
    (after - before) / before * 100.0
}

impl RunsReport {
    /// Several rounds as one: their runs, time, latencies and CPU added up.
    pub(crate) fn combine(rounds: Vec<RunsReport>) -> RunsReport {
        let n: usize = rounds.iter().map(|r| r.n).sum();
        let wall: Duration = rounds.iter().map(|r| r.wall).sum();
        let secs = wall.as_secs_f64().max(1e-9);
        let weighted = |f: &dyn Fn(&RunsReport) -> f64| {
            rounds
                .iter()
                .map(|r| f(r) * r.wall.as_secs_f64())
                .sum::<f64>()
                / secs
        };
        let per_run = |f: &dyn Fn(&RunsReport) -> f64| {
            rounds.iter().map(|r| f(r) * r.n as f64).sum::<f64>() / n.max(1) as f64
        };
        let cpu = CpuUsage {
            service_secs: rounds.iter().map(|r| r.cpu.service_secs).sum(),
            service_cores: weighted(&|r| r.cpu.service_cores),
            bench_cores: weighted(&|r| r.cpu.bench_cores),
            postgres_cores: weighted(&|r| r.cpu.postgres_cores),
            machine_busy: weighted(&|r| r.cpu.machine_busy),
        };
        let mut latencies: Vec<Duration> = rounds
            .iter()
            .flat_map(|r| r.latencies.iter().copied())
            .collect();
        latencies.sort_unstable();
        RunsReport {
            n,
            failures: rounds.iter().flat_map(|r| r.failures.clone()).collect(),
            wall,
            latencies,
            xact_per_run: None,
            idle_xact_per_sec: None,
            commits_per_run: per_run(&|r| r.commits_per_run),
            cpu,
            peak_rss_kib: rounds.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0),
            llm_calls_per_run: per_run(&|r| r.llm_calls_per_run),
            n_rounds: rounds.len(),
        }
    }

    /// Postgres's CPU per run, in milliseconds.
    pub(crate) fn postgres_ms_per_run(&self) -> f64 {
        self.cpu.postgres_cores * self.wall.as_secs_f64() * 1000.0 / self.n.max(1) as f64
    }

    pub(crate) fn runs_per_sec(&self) -> f64 {
        self.n as f64 / self.wall.as_secs_f64()
    }

    pub(crate) fn p50_ms(&self) -> f64 {
        ms(quantile(&self.latencies, 0.50))
    }

    pub(crate) fn cpu_ms_per_item(&self) -> f64 {
        self.cpu.service_secs * 1000.0 / (3 * self.n) as f64
    }

    pub(crate) fn print(&self, args: &Args, db: &Database, m: &Machine) {
        let what = if self.n_rounds > 1 {
            format!(
                "runs={} (in {} rounds)  concurrency={}",
                self.n, self.n_rounds, args.concurrency
            )
        } else {
            format!("runs={}  concurrency={}", self.n, args.concurrency)
        };
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

    pub(crate) fn to_json(&self, args: &Args) -> Value {
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
