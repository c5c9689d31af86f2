//! Inflight mode: N runs in flight at once against a slow model, what they cost the service in
//! memory, and whether every one of them completes.
//!
//! The model holds every call while the bench posts one run on each of N threads, so that all N
//! runs are accepted, claimed and waiting on their plan call at the same moment (however long
//! posting takes); the service's RSS is read then. The model then answers every call after its
//! latency, and the bench reads `/metrics` once a second until every run has ended, then reads
//! each run once to count how it ended.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fake_openai::FakeLlm;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::Args;
use crate::server::{Server, phase, truncate};
use crate::sse::ended_runs;
use crate::store::Database;
use crate::system::{CpuSample, CpuUsage, Machine};

/// How often the bench looks whether every run has ended.
const POLL: Duration = Duration::from_secs(1);

/// A run the service accepted: its thread and id.
struct Posted {
    thread: String,
    run_id: String,
}

/// What inflight mode measured.
pub(crate) struct InflightReport {
    runs: usize,
    posted: usize,
    refused: Vec<String>,
    /// From the first post until every posted run waited on the model.
    to_all_waiting: Duration,
    post_wall: Duration,
    /// `pes_runs_in_flight` while every run waited on the model.
    service_driving: u64,
    rss_before_kib: u64,
    rss_waiting_kib: u64,
    peak_rss_kib: u64,
    /// From the model's release until every run had ended (or the phase deadline passed).
    drain_wall: Duration,
    /// Every run ended before the phase deadline.
    drained: bool,
    model_calls: u64,
    peak_model_calls: usize,
    /// How each posted run ended (its `status`; `unreadable` when it could not be read).
    statuses: BTreeMap<String, usize>,
    first_not_completed: Option<String>,
    /// Runs that took more than one attempt (a lease lost and taken back).
    reclaimed: usize,
    leases_lost: u64,
    cpu: CpuUsage,
}

/// What the hold phase saw.
struct Held {
    posted: Vec<Posted>,
    refused: Vec<String>,
    post_wall: Duration,
    to_all_waiting: Duration,
    service_driving: u64,
    rss_waiting_kib: u64,
}

/// Run inflight mode (see the module's doc).
pub(crate) async fn inflight_mode(
    args: &Args,
    server: &Server,
    fake: &FakeLlm,
    machine: &Machine,
) -> Result<InflightReport> {
    let limit = args.phase_deadline();
    let parallel = args.concurrency.max(16);
    let threads = phase(
        "creating threads",
        limit,
        server.create_threads(args.runs, parallel),
    )
    .await?;
    let rss_before_kib = server.rss_kib()?;
    let leases_before = server.metric("pes_leases_lost_total").await?;
    let ended_before = ended_runs(server).await?;
    let calls_before = fake.calls();

    fake.hold();
    let held = hold_every_run(args, server, fake, &threads).await;
    let cpu_before = CpuSample::take(server.pid);
    fake.release();
    let held = held?;
    let cpu_before = cpu_before?;

    let released = Instant::now();
    let target = ended_before + held.posted.len() as u64;
    // Past the deadline the bench still reports what it saw, runs left unended included.
    let drained = match tokio::time::timeout(limit, wait_ended(server, target)).await {
        Ok(ended) => ended.map(|()| true)?,
        Err(_) => false,
    };
    let drain_wall = released.elapsed();
    let cpu = CpuSample::take(server.pid)?.usage_since(&cpu_before, machine);
    let peak_rss_kib = server.peak_rss_kib()?;
    let model_calls = fake.calls() - calls_before;
    let leases_lost = server.metric("pes_leases_lost_total").await? - leases_before;
    let endings = phase(
        "reading every run",
        limit,
        read_runs(server, &held.posted, parallel),
    )
    .await?;

    Ok(InflightReport {
        runs: args.runs,
        posted: held.posted.len(),
        refused: held.refused,
        to_all_waiting: held.to_all_waiting,
        post_wall: held.post_wall,
        service_driving: held.service_driving,
        rss_before_kib,
        rss_waiting_kib: held.rss_waiting_kib,
        peak_rss_kib,
        drain_wall,
        drained,
        model_calls,
        peak_model_calls: fake.peak_in_flight(),
        statuses: endings.statuses,
        first_not_completed: endings.first_not_completed,
        reclaimed: endings.reclaimed,
        leases_lost,
        cpu,
    })
}

/// With the model holding every call: post a run on every thread, then wait until every posted
/// run waits on its plan call, and read the service then.
async fn hold_every_run(
    args: &Args,
    server: &Server,
    fake: &FakeLlm,
    threads: &[String],
) -> Result<Held> {
    let limit = args.phase_deadline();
    let started = Instant::now();
    let results = phase(
        "posting runs",
        limit,
        post_runs(server, threads, args.concurrency.max(16)),
    )
    .await?;
    let post_wall = started.elapsed();
    let mut posted = Vec::with_capacity(results.len());
    let mut refused = Vec::new();
    for r in results {
        match r {
            Ok(p) => posted.push(p),
            Err(e) => refused.push(e),
        }
    }
    phase("waiting for every run to reach the model", limit, async {
        fake.wait_in_flight(posted.len()).await;
        Ok(())
    })
    .await?;
    let to_all_waiting = started.elapsed();
    Ok(Held {
        service_driving: server.metric("pes_runs_in_flight").await?,
        rss_waiting_kib: server.rss_kib()?,
        posted,
        refused,
        post_wall,
        to_all_waiting,
    })
}

/// Post one run on every thread, `parallel` posts at a time.
async fn post_runs(
    server: &Server,
    threads: &[String],
    parallel: usize,
) -> Result<Vec<Result<Posted, String>>> {
    Ok(futures::stream::iter(threads)
        .map(|thread| async move {
            let path = format!("/v1/threads/{thread}/runs");
            let run = server
                .post_json(&path, &json!({"query": "bench"}), Duration::from_secs(60))
                .await
                .map_err(|e| format!("{e:#}"))?;
            let run_id = run["runId"]
                .as_str()
                .ok_or_else(|| format!("POST {path} answered without a runId: {run}"))?;
            Ok(Posted {
                thread: thread.clone(),
                run_id: run_id.to_owned(),
            })
        })
        .buffer_unordered(parallel)
        .collect()
        .await)
}

/// Read the service's run counters every [`POLL`] until `target` runs have ended.
async fn wait_ended(server: &Server, target: u64) -> Result<()> {
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        if ended_runs(server).await? >= target {
            return Ok(());
        }
    }
}

/// How the posted runs ended.
struct Endings {
    statuses: BTreeMap<String, usize>,
    first_not_completed: Option<String>,
    reclaimed: usize,
}

/// Read every posted run once, `parallel` at a time.
async fn read_runs(server: &Server, posted: &[Posted], parallel: usize) -> Result<Endings> {
    let runs: Vec<Result<Value>> = futures::stream::iter(posted)
        .map(|p| async move {
            server
                .get_json(&format!("/v1/threads/{}/runs/{}", p.thread, p.run_id))
                .await
                .with_context(|| format!("reading run {}", p.run_id))
        })
        .buffer_unordered(parallel)
        .collect()
        .await;
    let mut endings = Endings {
        statuses: BTreeMap::new(),
        first_not_completed: None,
        reclaimed: 0,
    };
    for run in runs {
        let (status, why) = match &run {
            Ok(run) => {
                if run["attempt"].as_i64().is_some_and(|a| a > 1) {
                    endings.reclaimed += 1;
                }
                let status = run["status"].as_str().unwrap_or("without a status");
                let why = format!(
                    "run {} ended {status}: {}",
                    run["runId"].as_str().unwrap_or("?"),
                    truncate(&run["error"].to_string(), 300)
                );
                (status.to_owned(), why)
            }
            Err(e) => ("unreadable".to_owned(), format!("{e:#}")),
        };
        if status != "completed" && endings.first_not_completed.is_none() {
            endings.first_not_completed = Some(why);
        }
        *endings.statuses.entry(status).or_default() += 1;
    }
    Ok(endings)
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl InflightReport {
    fn completed(&self) -> usize {
        self.statuses.get("completed").copied().unwrap_or(0)
    }

    /// Every run was accepted and had completed when the bench read it (within the drain
    /// deadline or not: the drain line says which).
    fn every_run_completed(&self) -> bool {
        self.refused.is_empty() && self.completed() == self.runs
    }

    /// Service RSS added per run waiting on the model.
    fn kib_per_run(&self) -> f64 {
        (self.rss_waiting_kib as f64 - self.rss_before_kib as f64) / self.posted.max(1) as f64
    }

    fn cpu_ms_per_item(&self) -> f64 {
        self.cpu.service_secs * 1000.0 / (3 * self.posted.max(1)) as f64
    }

    fn statuses_line(&self) -> String {
        self.statuses
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) fn print(&self, args: &Args, db: &Database, m: &Machine) {
        let what = format!(
            "inflight runs={}  model latency={} ms",
            self.runs, args.model_latency_ms
        );
        println!("{}", m.header(db, &what));
        println!(
            "posted            {} runs in {:.1} s ({} refused)",
            self.posted,
            self.post_wall.as_secs_f64(),
            self.refused.len()
        );
        println!(
            "in flight         {} runs waiting on the model {:.1} s after the first post \
             (the service drove {})",
            self.posted,
            self.to_all_waiting.as_secs_f64(),
            self.service_driving
        );
        println!(
            "RSS               {:.1} MB before, {:.1} MB with every run waiting ({:.1} KiB per run)",
            mb(self.rss_before_kib),
            mb(self.rss_waiting_kib),
            self.kib_per_run()
        );
        println!("peak RSS          {:.1} MB", mb(self.peak_rss_kib));
        if self.drained {
            println!(
                "drained           every run ended {:.1} s after the model started answering \
                 ({:.1} runs/s)",
                self.drain_wall.as_secs_f64(),
                self.posted as f64 / self.drain_wall.as_secs_f64()
            );
        } else {
            println!(
                "drained           NOT every run ended within {:.0} s (--phase-timeout) after the \
                 model started answering",
                self.drain_wall.as_secs_f64()
            );
        }
        println!(
            "model calls       {:.1} per run, at most {} in flight at once",
            self.model_calls as f64 / self.posted.max(1) as f64,
            self.peak_model_calls
        );
        println!(
            "leases lost       {} ({} runs took more than one attempt)",
            self.leases_lost, self.reclaimed
        );
        println!(
            "service CPU/item  {:.2} ms (after the release)",
            self.cpu_ms_per_item()
        );
        println!("{}", self.cpu.line(m, db.kind()));
        if self.every_run_completed() {
            println!(
                "completed         {} of {}: every run completed{}",
                self.completed(),
                self.runs,
                if self.drained {
                    ""
                } else {
                    " (the last ones after the deadline)"
                }
            );
        } else {
            println!(
                "completed         {} of {}: NOT every run completed ({}{})",
                self.completed(),
                self.runs,
                self.statuses_line(),
                if self.refused.is_empty() {
                    String::new()
                } else {
                    format!(", {} refused", self.refused.len())
                }
            );
            let first = self
                .refused
                .first()
                .or(self.first_not_completed.as_ref())
                .map_or("no detail", String::as_str);
            println!("first failure     {first}");
        }
    }

    pub(crate) fn to_json(&self, args: &Args) -> Value {
        json!({
            "runs": self.runs,
            "modelLatencyMs": args.model_latency_ms,
            "posted": self.posted,
            "refused": self.refused.len(),
            "postSeconds": self.post_wall.as_secs_f64(),
            "allWaitingSeconds": self.to_all_waiting.as_secs_f64(),
            "serviceRunsInFlight": self.service_driving,
            "rssBeforeMb": mb(self.rss_before_kib),
            "rssAllWaitingMb": mb(self.rss_waiting_kib),
            "kibPerRunWaiting": self.kib_per_run(),
            "peakRssMb": mb(self.peak_rss_kib),
            "drainSeconds": self.drain_wall.as_secs_f64(),
            "drained": self.drained,
            "modelCallsPerRun": self.model_calls as f64 / self.posted.max(1) as f64,
            "peakModelCallsInFlight": self.peak_model_calls,
            "statuses": self.statuses,
            "everyRunCompleted": self.every_run_completed(),
            "leasesLost": self.leases_lost,
            "runsReclaimed": self.reclaimed,
            "serviceCpuMsPerItem": self.cpu_ms_per_item(),
            "cpu": self.cpu.to_json(),
        })
    }
}
