//! The Prometheus metrics of one service instance: every series `/metrics` shows is named and
//! described here, and recorded through the typed methods of [`Metrics`] (so a label can only
//! take the values this file allows).
//!
//! Each [`App`](crate::App) owns its recorder: no process-global `metrics` recorder is installed.
//! A process that runs several instances (the tests spawn many apps in one process) therefore
//! keeps each instance's counters apart, and `/metrics` shows exactly what its instance did. The
//! price is that series are recorded through this handle rather than the `metrics` macros; a
//! library that records through the global facade is not seen (none of ours does).
//!
//! Labels are low-cardinality and hold no tenant data, by construction: run and item statuses,
//! outcomes, provider names, tools as the operator configured them (a built-in tool's name,
//! `mcp:<server>`, `a2a:<agent>`, `flowchart` for every tenant's flowchart, else `other`: see
//! [`crate::tools::ToolRegistry::metric_label`]) and the configured model names (any other model
//! a thread names is `other`). Never a thread, run or item id, nor anything a tenant named.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::model::Usage;

/// Configured model names kept as label values at most; any other model is counted as `other`.
pub const MAX_MODELS: usize = 32;

const RUNS_CLAIMED: &str = "pes_runs_claimed_total";
const RUNS: &str = "pes_runs_total";
const RUN_DURATION: &str = "pes_run_duration_seconds";
const LEASES_LOST: &str = "pes_leases_lost_total";
const LEASE_TAKEOVERS: &str = "pes_lease_takeovers_total";
const COMMITS: &str = "pes_commits_total";
const ITEM_DURATION: &str = "pes_item_duration_seconds";
const MODEL_CALLS: &str = "pes_model_calls_total";
const MODEL_DURATION: &str = "pes_model_call_duration_seconds";
const MODEL_TOKENS: &str = "pes_model_tokens_total";
const TOOL_CALLS: &str = "pes_tool_calls_total";
const TOOL_DURATION: &str = "pes_tool_call_duration_seconds";
const RUNS_IN_FLIGHT: &str = "pes_runs_in_flight";
const RUNS_QUEUED: &str = "pes_runs_queued";
const SUSPENSIONS_PENDING: &str = "pes_suspensions_pending";
const STREAM_SUBSCRIBERS: &str = "pes_stream_subscribers";
const STREAMED_THREADS: &str = "pes_streamed_threads";
const TOKEN_REMOTE_THREADS: &str = "pes_token_remote_threads";
const TOKEN_PAYLOADS: &str = "pes_token_relay_payloads_total";
const TOKEN_DROPPED: &str = "pes_token_relay_dropped_total";
const THREADS_EXPIRED: &str = "pes_threads_expired_total";
const THREADS_PRUNED: &str = "pes_threads_pruned_total";
const RETENTION_PASSES: &str = "pes_retention_passes_total";

/// Every series: name, kind, help. `/metrics` describes each, and the book lists them (docs/src/operations/metrics.md).
const CATALOGUE: &[(&str, Kind, &str)] = &[
    (
        RUNS_CLAIMED,
        Kind::Counter,
        "Runs claimed by this process (each attempt counts).",
    ),
    (
        RUNS,
        Kind::Counter,
        "Run attempts driven here, by how they ended: completed, failed, cancelled, suspended, or released (given back at shutdown, lease lost, store error).",
    ),
    (
        RUN_DURATION,
        Kind::Histogram,
        "Time from a run's creation to its end (queueing and any wait for a person included), by final status.",
    ),
    (
        LEASES_LOST,
        Kind::Counter,
        "Runs this process stopped driving because another worker took their lease.",
    ),
    (
        LEASE_TAKEOVERS,
        Kind::Counter,
        "Runs this process claimed after their previous worker's lease expired (a crash or a stall).",
    ),
    (COMMITS, Kind::Counter, "Run state commits."),
    (
        ITEM_DURATION,
        Kind::Histogram,
        "Time from an item's start to its end, by final status (completed, failed, cancelled).",
    ),
    (
        MODEL_CALLS,
        Kind::Counter,
        "Model calls (retries inside a call included in it), by provider, model and outcome (ok, or the error code).",
    ),
    (
        MODEL_DURATION,
        Kind::Histogram,
        "Model call latency, by provider, model and outcome.",
    ),
    (
        MODEL_TOKENS,
        Kind::Counter,
        "Tokens the model reported, by provider, model and kind (prompt, completion).",
    ),
    (
        TOOL_CALLS,
        Kind::Counter,
        "Tool calls, by tool and outcome (ok, error, suspended, cancelled).",
    ),
    (
        TOOL_DURATION,
        Kind::Histogram,
        "Tool call latency, by tool and outcome.",
    ),
    (RUNS_IN_FLIGHT, Kind::Gauge, "Runs this process drives now."),
    (
        RUNS_QUEUED,
        Kind::Gauge,
        "Runs waiting in the queue (all replicas; read from the store at scrape).",
    ),
    (
        SUSPENSIONS_PENDING,
        Kind::Gauge,
        "Suspensions waiting for a person's decision (all replicas; read from the store at scrape).",
    ),
    (
        STREAM_SUBSCRIBERS,
        Kind::Gauge,
        "Live subscribers to thread events here: SSE streams and waiting requests.",
    ),
    (
        STREAMED_THREADS,
        Kind::Gauge,
        "Threads with at least one live subscriber here.",
    ),
    (
        TOKEN_REMOTE_THREADS,
        Kind::Gauge,
        "Threads another replica streams token deltas of now: runs of them driven here send their deltas there.",
    ),
    (
        TOKEN_PAYLOADS,
        Kind::Counter,
        "Token delta payloads (NOTIFYs) this process sent to the other replicas.",
    ),
    (
        TOKEN_DROPPED,
        Kind::Counter,
        "Token deltas meant for other replicas that were dropped: the outbox was full, or sending failed.",
    ),
    (
        THREADS_EXPIRED,
        Kind::Counter,
        "Threads this process deleted because their time-to-live passed (each thread is counted by the one replica that deleted it).",
    ),
    (
        THREADS_PRUNED,
        Kind::Counter,
        "Threads this process deleted for POST /v1/threads/prune.",
    ),
    (
        RETENTION_PASSES,
        Kind::Counter,
        "Retention passes this process completed (each looks once for threads whose time-to-live passed).",
    ),
];

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Statuses of `pes_runs_total`; every one is shown from the start, at zero.
pub const RUN_ENDS: &[&str] = &[
    "completed",
    "failed",
    "cancelled",
    "suspended",
    "waiting_remote",
    "released",
];

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

/// Bucket bounds (seconds) of the run and item histograms: seconds to an hour.
const LONG_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];
/// Bucket bounds (seconds) of the model and tool call histograms: milliseconds to minutes.
const CALL_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Gauges read when `/metrics` is scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Levels {
    pub runs_in_flight: usize,
    pub stream_subscribers: usize,
    pub streamed_threads: usize,
    pub token_remote_threads: usize,
    /// `None` when the store could not be read: the last value stays.
    pub runs_queued: Option<u64>,
    pub suspensions_pending: Option<u64>,
}

/// The metrics of one service instance. Cheap to clone: clones share the recorder.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// The configured model names (label values), at most [`MAX_MODELS`].
    models: Mutex<HashSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh recorder with every series described and the unlabelled ones (and each run
    /// status) at zero, so a dashboard sees them before anything happened.
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(RUN_DURATION.into()), LONG_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(ITEM_DURATION.into()), LONG_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(MODEL_DURATION.into()), CALL_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(TOOL_DURATION.into()), CALL_BUCKETS)
            })
            .expect("bucket lists are not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        for (name, kind, help) in CATALOGUE {
            let key = KeyName::from_const_str(name);
            let help = metrics::SharedString::const_str(help);
            match kind {
                Kind::Counter => recorder.describe_counter(key, None, help),
                Kind::Gauge => recorder.describe_gauge(key, None, help),
                Kind::Histogram => recorder.describe_histogram(key, None, help),
            }
        }
        let metrics = Self {
            inner: Arc::new(Inner {
                recorder,
                handle,
                models: Mutex::new(HashSet::new()),
            }),
        };
        for name in [
            RUNS_CLAIMED,
            LEASES_LOST,
            LEASE_TAKEOVERS,
            COMMITS,
            TOKEN_PAYLOADS,
            TOKEN_DROPPED,
            THREADS_EXPIRED,
            THREADS_PRUNED,
            RETENTION_PASSES,
        ] {
            metrics.counter(name, vec![]).absolute(0);
        }
        for status in RUN_ENDS {
            metrics
                .counter(RUNS, vec![Label::new("status", *status)])
                .absolute(0);
        }
        metrics.set_levels(Levels::default());
        metrics
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.inner
            .recorder
            .register_counter(&Key::from_parts(name, labels), &METADATA)
    }

    fn gauge(&self, name: &'static str) -> Gauge {
        self.inner
            .recorder
            .register_gauge(&Key::from_static_name(name), &METADATA)
    }

    fn histogram(&self, name: &'static str, labels: Vec<Label>) -> Histogram {
        self.inner
            .recorder
            .register_histogram(&Key::from_parts(name, labels), &METADATA)
    }

    /// The Prometheus text exposition of everything recorded so far.
    pub fn render(&self) -> String {
        self.inner.handle.render()
    }

    /// Fold recent histogram samples into their buckets; run every few seconds so memory stays
    /// flat when nobody scrapes.
    pub fn upkeep(&self) {
        self.inner.handle.run_upkeep();
    }

    /// Set the gauges read at scrape time.
    pub fn set_levels(&self, l: Levels) {
        self.gauge(RUNS_IN_FLIGHT).set(l.runs_in_flight as f64);
        self.gauge(STREAM_SUBSCRIBERS)
            .set(l.stream_subscribers as f64);
        self.gauge(STREAMED_THREADS).set(l.streamed_threads as f64);
        self.gauge(TOKEN_REMOTE_THREADS)
            .set(l.token_remote_threads as f64);
        if let Some(n) = l.runs_queued {
            self.gauge(RUNS_QUEUED).set(n as f64);
        }
        if let Some(n) = l.suspensions_pending {
            self.gauge(SUSPENSIONS_PENDING).set(n as f64);
        }
    }

    /// A run was claimed.
    pub fn run_claimed(&self) {
        self.counter(RUNS_CLAIMED, vec![]).increment(1);
    }

    /// Runs a claim took back from workers whose lease expired.
    pub fn lease_takeovers(&self, n: usize) {
        if n > 0 {
            self.counter(LEASE_TAKEOVERS, vec![]).increment(n as u64);
        }
    }

    /// An attempt ended: `status` is one of [`RUN_ENDS`]; `since_created` is the run's age when
    /// it reached a final status (completed, failed, cancelled).
    pub fn run_ended(&self, status: &'static str, since_created: Option<Duration>) {
        self.counter(RUNS, vec![Label::new("status", status)])
            .increment(1);
        if let Some(d) = since_created {
            self.histogram(RUN_DURATION, vec![Label::new("status", status)])
                .record(d.as_secs_f64());
        }
    }

    /// Another worker took the lease of a run driven here.
    pub fn lease_lost(&self) {
        self.counter(LEASES_LOST, vec![]).increment(1);
    }

    /// Token delta payloads were sent to the other replicas.
    pub fn token_payloads_sent(&self, n: u64) {
        self.counter(TOKEN_PAYLOADS, vec![]).increment(n);
    }

    /// Token deltas meant for other replicas were dropped.
    pub fn token_deltas_dropped(&self, n: u64) {
        if n > 0 {
            self.counter(TOKEN_DROPPED, vec![]).increment(n);
        }
    }

    /// A retention pass ended, having deleted `expired` threads whose time-to-live passed.
    pub fn retention_pass(&self, expired: u64) {
        self.counter(THREADS_EXPIRED, vec![]).increment(expired);
        self.counter(RETENTION_PASSES, vec![]).increment(1);
    }

    /// A prune deleted `n` threads.
    pub fn threads_pruned(&self, n: u64) {
        self.counter(THREADS_PRUNED, vec![]).increment(n);
    }

    /// A batch was committed.
    pub fn committed(&self) {
        self.counter(COMMITS, vec![]).increment(1);
    }

    /// An item reached a final status after running for `took`.
    pub fn item_ended(&self, status: &'static str, took: Duration) {
        self.histogram(ITEM_DURATION, vec![Label::new("status", status)])
            .record(took.as_secs_f64());
    }

    /// A model call ended (`outcome` is `ok` or an error code), with the usage it reported.
    pub fn model_call(
        &self,
        provider: &'static str,
        model: &str,
        outcome: &'static str,
        took: Duration,
        usage: Option<&Usage>,
    ) {
        let model = self.model_label(model);
        let labels = |extra: Label| {
            vec![
                Label::new("provider", provider),
                Label::new("model", model.clone()),
                extra,
            ]
        };
        self.counter(MODEL_CALLS, labels(Label::new("outcome", outcome)))
            .increment(1);
        self.histogram(MODEL_DURATION, labels(Label::new("outcome", outcome)))
            .record(took.as_secs_f64());
        if let Some(u) = usage {
            self.counter(MODEL_TOKENS, labels(Label::new("kind", "prompt")))
                .increment(u.prompt_tokens);
            self.counter(MODEL_TOKENS, labels(Label::new("kind", "completion")))
                .increment(u.completion_tokens);
        }
    }

    /// A tool call ended. `tool` must be a name the registry (or the run's flowcharts) knows:
    /// callers pass `unknown` for a name the model made up.
    pub fn tool_call(&self, tool: &str, outcome: &'static str, took: Duration) {
        let labels = || {
            vec![
                Label::new("tool", tool.to_owned()),
                Label::new("outcome", outcome),
            ]
        };
        self.counter(TOOL_CALLS, labels()).increment(1);
        self.histogram(TOOL_DURATION, labels())
            .record(took.as_secs_f64());
    }

    /// Declare the model names the operator configured (each provider's default model): the
    /// only model names a label may carry, at most [`MAX_MODELS`].
    pub fn configure_models<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut known = self
            .inner
            .models
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for name in names {
            if known.len() < MAX_MODELS {
                known.insert(name.to_owned());
            }
        }
    }

    /// `model` as a label value: itself when the operator configured it, else `other`. A thread
    /// may name any model string: it is tenant data, never a label (it would leak one tenant's
    /// names to whoever reads `/metrics`, and grow the page without bound).
    fn model_label(&self, model: &str) -> String {
        let known = self
            .inner
            .models
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if known.contains(model) {
            model.to_owned()
        } else {
            "other".to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_instances_keep_their_counts_apart() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.run_ended("completed", Some(Duration::from_millis(1500)));
        a.tool_call("calculator", "ok", Duration::from_millis(3));
        let text = a.render();
        assert!(
            text.contains("pes_runs_total{status=\"completed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("pes_run_duration_seconds_bucket{status=\"completed\",le=\"2.5\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("pes_tool_calls_total{tool=\"calculator\",outcome=\"ok\"} 1"),
            "{text}"
        );
        let other = b.render();
        assert!(
            other.contains("pes_runs_total{status=\"completed\"} 0"),
            "{other}"
        );
        assert!(!other.contains("calculator"), "{other}");
    }

    #[test]
    fn only_configured_model_names_are_labels() {
        let m = Metrics::new();
        m.configure_models(["gpt-x"]);
        m.model_call("openai", "gpt-x", "ok", Duration::ZERO, None);
        for i in 0..5 {
            m.model_call(
                "openai",
                &format!("tenant-model-{i}"),
                "ok",
                Duration::ZERO,
                None,
            );
        }
        let text = m.render();
        assert!(text.contains("model=\"gpt-x\""), "{text}");
        assert!(!text.contains("tenant-model"), "{text}");
        assert!(
            text.contains(
                "pes_model_calls_total{provider=\"openai\",model=\"other\",outcome=\"ok\"} 5"
            ),
            "{text}"
        );
    }
}
