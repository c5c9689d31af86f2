//! SSE mode: what an idle subscriber costs the service, and how fast observations reach many
//! subscribers while runs generate them.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};

use crate::Args;
use crate::runs::quantile;
use crate::server::{Server, phase, truncate};
use crate::store::Database;
use crate::system::{CpuSample, CpuUsage, Machine};

/// What SSE mode measured.
pub(crate) struct SseReport {
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

pub(crate) async fn sse_mode(args: &Args, server: &Server, machine: &Machine) -> Result<SseReport> {
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
    let failed_before = server.metric(r#"pes_runs_total{status="failed"}"#).await?;
    let cpu_before = CpuSample::take(server.pid)?;
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
    let cpu = CpuSample::take(server.pid)?.usage_since(&cpu_before, machine);
    let _ = stop_tx.send(true);
    let results = collect_readers(readers).await;
    let runs_failed = server.metric(r#"pes_runs_total{status="failed"}"#).await? - failed_before;

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
            // Awaited by `collect_readers` before the mode returns.
            #[allow(clippy::disallowed_methods)]
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
pub(crate) async fn ended_runs(server: &Server) -> Result<u64> {
    Ok(server
        .metric(r#"pes_runs_total{status="completed"}"#)
        .await?
        + server.metric(r#"pes_runs_total{status="failed"}"#).await?
        + server
            .metric(r#"pes_runs_total{status="cancelled"}"#)
            .await?)
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

    pub(crate) fn print(&self, args: &Args, db: &Database, m: &Machine) {
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

    pub(crate) fn to_json(&self, args: &Args) -> Value {
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
