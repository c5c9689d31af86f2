//! Long-thread mode: N follow-ups on ONE thread, one after another, each posted with
//! `/runs/wait`. A thread used like a conversation must answer its 200th follow-up like its
//! first: every run completes, and its prompt tokens (`usage.promptTokens`) and latency stay flat
//! as the thread grows (the target: run 200's prompt tokens at most 1.5× run 2's).
//!
//! Run `n` asks `What is 2+<n>?`: the same kind of query every time, each with its own answer.
//! With the offline model the bench also checks that each answer holds its own result
//! (`2+<n> = <n+2>`), not an earlier run's.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::server::{Server, phase, truncate};
use crate::{Args, LlmKind};

/// The runs whose figures are printed (those the thread reaches), then the last one.
const MARKS: &[usize] = &[1, 2, 10, 50, 100, 200];

/// Runs whose median latency is printed beside each printed run (it and those just before).
const WINDOW: usize = 10;

/// What one run of the thread cost.
#[derive(Debug, Clone)]
struct RunFigures {
    prompt_tokens: u64,
    latency: Duration,
    /// Whether the answer holds this run's own result (checked with the offline model only).
    own_answer: Option<bool>,
}

/// What long-thread mode measured.
pub(crate) struct LongThreadReport {
    runs: Vec<RunFigures>,
    wall: Duration,
}

/// Post `--runs` follow-ups on one new thread; stop at the first run that does not complete.
pub(crate) async fn long_thread_mode(args: &Args, server: &Server) -> Result<LongThreadReport> {
    let limit = args.phase_deadline();
    let thread = phase("creating the thread", limit, server.create_thread()).await?;
    let started = Instant::now();
    let mut runs = Vec::with_capacity(args.runs);
    for n in 1..=args.runs {
        let query = format!("What is 2+{n}?");
        let sent = Instant::now();
        let run = phase(
            &format!("run {n}"),
            limit,
            server.post_json(
                &format!("/v1/threads/{thread}/runs/wait"),
                &json!({"query": query}),
                limit,
            ),
        )
        .await?;
        let latency = sent.elapsed();
        if run["status"] != "completed" {
            bail!(
                "run {n} of thread {thread} ended {}: {}",
                run["status"],
                truncate(&run["error"].to_string(), 300)
            );
        }
        let prompt_tokens = run["usage"]["promptTokens"].as_u64().unwrap_or(0);
        let own_answer = (args.llm == LlmKind::Offline).then(|| {
            run["finalResponse"]["response"]
                .as_str()
                .is_some_and(|a| a.contains(&format!("2+{n} = {}", n + 2)))
        });
        runs.push(RunFigures {
            prompt_tokens,
            latency,
            own_answer,
        });
    }
    Ok(LongThreadReport {
        runs,
        wall: started.elapsed(),
    })
}

impl LongThreadReport {
    /// The 1-based run numbers printed: the marks the thread reached, and its last run.
    fn marks(&self) -> Vec<usize> {
        let n = self.runs.len();
        let mut marks: Vec<usize> = MARKS.iter().copied().filter(|m| *m <= n).collect();
        if !marks.contains(&n) {
            marks.push(n);
        }
        marks
    }

    fn run(&self, n: usize) -> &RunFigures {
        &self.runs[n - 1]
    }

    /// The median latency of the (up to) [`WINDOW`] runs that end with run `n`: one run's
    /// latency is noisy on a shared machine.
    fn window_median(&self, n: usize) -> Duration {
        let mut window: Vec<Duration> = self.runs[n.saturating_sub(WINDOW)..n]
            .iter()
            .map(|r| r.latency)
            .collect();
        window.sort_unstable();
        window[window.len() / 2]
    }

    /// Prompt tokens of the last run over run 2's (the target is at most 1.5).
    fn growth(&self) -> Option<f64> {
        let (second, last) = (self.runs.get(1)?, self.runs.last()?);
        (second.prompt_tokens > 0).then(|| last.prompt_tokens as f64 / second.prompt_tokens as f64)
    }

    /// Runs whose answer does not hold their own result (offline model only).
    fn wrong_answers(&self) -> Vec<usize> {
        self.runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.own_answer == Some(false))
            .map(|(i, _)| i + 1)
            .collect()
    }

    pub(crate) fn print(&self, header: &str) {
        println!("{header}");
        println!("run    prompt tokens   latency    median of the {WINDOW} runs up to it");
        for n in self.marks() {
            let r = self.run(n);
            println!(
                "{n:<6} {:>13}   {:>7.1} ms {:>7.1} ms",
                r.prompt_tokens,
                r.latency.as_secs_f64() * 1000.0,
                self.window_median(n).as_secs_f64() * 1000.0
            );
        }
        match self.growth() {
            Some(g) => println!(
                "prompt tokens, run {} / run 2: {g:.2} (bound: 1.5)",
                self.runs.len()
            ),
            None => println!("prompt tokens, last run / run 2: n/a (fewer than 2 runs)"),
        }
        println!(
            "all {} runs completed in {:.1} s",
            self.runs.len(),
            self.wall.as_secs_f64()
        );
        if self.runs.iter().any(|r| r.own_answer.is_some()) {
            let wrong = self.wrong_answers();
            if wrong.is_empty() {
                println!("every answer holds its own query's result");
            } else {
                println!(
                    "answers without their own query's result: {} (first: run {})",
                    wrong.len(),
                    wrong[0]
                );
            }
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let marks: Vec<Value> = self
            .marks()
            .into_iter()
            .map(|n| {
                let r = self.run(n);
                json!({
                    "run": n,
                    "promptTokens": r.prompt_tokens,
                    "latencyMs": r.latency.as_secs_f64() * 1000.0,
                    "windowMedianLatencyMs": self.window_median(n).as_secs_f64() * 1000.0,
                })
            })
            .collect();
        json!({
            "runs": self.runs.len(),
            "marks": marks,
            "promptTokensLastOverRun2": self.growth(),
            "wallSeconds": self.wall.as_secs_f64(),
            "wrongAnswers": self.wrong_answers().len(),
        })
    }
}
