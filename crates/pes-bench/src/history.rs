//! History mode: how long reading a past state of a long thread takes (the target: any past
//! state of a thread with 10,000 observations in at most 50 ms). The bench grows ONE thread with
//! follow-ups (each a run of the fake model's 3-item workload) until its log holds
//! `--observations` observations, then reads `GET /v1/threads/{id}/state?atSeq=N` at `--reads`
//! seqs spread over the whole log (early, middle and late points alike), one after another, and
//! prints the latency percentiles: each read timed from the request sent to the last byte of
//! its body received (the bench parses the JSON after the clock stops). The cost of recording
//! history on every commit is W3's before and after (`--mode runs` on the two builds), not this
//! mode's.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::Args;
use crate::server::{Server, phase, truncate};

/// What history mode measured.
pub(crate) struct HistoryReport {
    observations: i64,
    runs: usize,
    build: Duration,
    /// Each read's latency, sorted.
    reads: Vec<Duration>,
    /// The largest state read (bytes of JSON), to show the reads were not of empty states.
    largest_state: usize,
    /// The same number of reads of the present state (`GET …/state`), sorted: what a past
    /// read costs beyond reading the state at all.
    present: Vec<Duration>,
}

/// Grow the thread, then read past states.
pub(crate) async fn history_mode(args: &Args, server: &Server) -> Result<HistoryReport> {
    let Grown {
        thread,
        last,
        runs,
        took: build,
    } = grow_thread(server, args.phase_deadline(), args.observations).await?;
    let mut reads = Vec::with_capacity(args.reads);
    let mut largest_state = 0;
    for k in 0..args.reads {
        // Spread over the log, with a stride that visits early, middle and late seqs in turn.
        let at = 1 + (k as i64 * 7919) % last;
        let (st, took) = server
            .get_timed(&format!("/v1/threads/{thread}/state?atSeq={at}"))
            .await?;
        reads.push(took);
        if st["atSeq"].as_i64().is_none_or(|a| a < at) {
            bail!(
                "the state at {at} came back without its seq: {}",
                truncate(&st.to_string(), 300)
            );
        }
        largest_state = largest_state.max(st.to_string().len());
    }
    reads.sort_unstable();
    let mut present = Vec::with_capacity(args.reads);
    for _ in 0..args.reads {
        let (_, took) = server
            .get_timed(&format!("/v1/threads/{thread}/state"))
            .await?;
        present.push(took);
    }
    present.sort_unstable();
    Ok(HistoryReport {
        present,
        observations: last,
        runs,
        build,
        reads,
        largest_state,
    })
}

/// A thread grown by follow-ups ([`grow_thread`]).
pub(crate) struct Grown {
    pub(crate) thread: String,
    /// Its last seq (at least the observations asked for).
    pub(crate) last: i64,
    /// The follow-ups it took.
    pub(crate) runs: usize,
    pub(crate) took: Duration,
}

/// Create a thread and grow it with follow-ups (`What is 2+<n>?`, each a run of the fake
/// model's 3-item workload posted with `/runs/wait`, one after another) until its log holds
/// `observations` observations. A long thread is only made by using it: follow-ups write the
/// log, messages, state items and history a real conversation does. Every run has the phase
/// deadline `limit`, and must complete.
pub(crate) async fn grow_thread(
    server: &Server,
    limit: Duration,
    observations: i64,
) -> Result<Grown> {
    let thread = phase("creating the thread", limit, server.create_thread()).await?;
    let started = Instant::now();
    let mut runs = 0;
    let mut last = 0;
    while last < observations {
        runs += 1;
        let run = phase(
            &format!("run {runs}"),
            limit,
            server.post_json(
                &format!("/v1/threads/{thread}/runs/wait"),
                &json!({"query": format!("What is 2+{runs}?")}),
                limit,
            ),
        )
        .await?;
        if run["status"] != "completed" {
            bail!(
                "run {runs} ended {}: {}",
                run["status"],
                truncate(&run["error"].to_string(), 300)
            );
        }
        last = last_seq(server, &thread).await?;
    }
    Ok(Grown {
        thread,
        last,
        runs,
        took: started.elapsed(),
    })
}

/// The thread's last seq, from its newest history point (every run ends with a commit that
/// changes the state).
pub(crate) async fn last_seq(server: &Server, thread: &str) -> Result<i64> {
    let page = server
        .get_json(&format!("/v1/threads/{thread}/history?limit=1"))
        .await?;
    Ok(page["items"][0]["seq"].as_i64().unwrap_or(0))
}

impl HistoryReport {
    fn pct(&self, p: f64) -> Duration {
        pct(&self.reads, p)
    }

    pub(crate) fn print(&self, header: &str) {
        println!("{header}");
        println!(
            "thread            {} observations from {} runs (built in {:.1} s)",
            self.observations,
            self.runs,
            self.build.as_secs_f64()
        );
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "past-state read   {} reads: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (bound: 50 ms)",
            self.reads.len(),
            ms(self.pct(0.5)),
            ms(self.pct(0.99)),
            ms(*self.reads.last().unwrap_or(&Duration::ZERO))
        );
        println!(
            "present-state read {} reads: p50 {:.1} ms, p99 {:.1} ms (the same route without atSeq)",
            self.present.len(),
            ms(pct(&self.present, 0.5)),
            ms(pct(&self.present, 0.99))
        );
        println!("largest state     {} bytes of JSON", self.largest_state);
    }

    pub(crate) fn to_json(&self) -> Value {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        json!({
            "observations": self.observations,
            "runs": self.runs,
            "reads": self.reads.len(),
            "p50Ms": ms(self.pct(0.5)),
            "p99Ms": ms(self.pct(0.99)),
            "maxMs": ms(*self.reads.last().unwrap_or(&Duration::ZERO)),
            "presentP50Ms": ms(pct(&self.present, 0.5)),
            "presentP99Ms": ms(pct(&self.present, 0.99)),
        })
    }
}

/// The `p` quantile of sorted durations.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
