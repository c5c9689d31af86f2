//! What operators watch: logs, traces and metrics.
//!
//! - Logs (this file): text lines by default, JSON lines with `PES_LOG_FORMAT=json`; the filter
//!   comes from `PES_LOG`, else `RUST_LOG`, else `info` (with the MCP SDK's own transport logs
//!   off: every failed reconnection to a down MCP server would log an error there, while the
//!   service logs one warning with the cause and then retries quietly).
//! - Traces ([`otel`]): the same `tracing` spans, exported over OTLP when the standard `OTEL_*`
//!   variables ask for it, with their own filter (the log filter does not hide spans from a
//!   collector); [`spans`] makes the spans of runs, model calls and tool calls, and [`context`]
//!   carries a run's trace context from the request that made it to every attempt.
//! - Metrics ([`metrics`]): the Prometheus series of one service instance.

pub mod context;
pub mod metrics;
pub mod otel;
pub mod spans;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub use context::TraceContext;

/// Log line format (`PES_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
pub use otel::OtelGuard;

/// The log filter when none is given.
const DEFAULT_FILTER: &str = "info,rmcp=off";

/// What is exported as spans, whatever the log filter: the service's own spans and events at
/// `info` and above (not the SDKs' internals, nor the exporter's own logs).
const SPAN_FILTER: &str = "info,rmcp=off,opentelemetry=off,opentelemetry_sdk=off,\
                           opentelemetry_otlp=off,opentelemetry_http=off";

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Install the global subscriber (once; later calls are ignored): logs to stderr, and spans to
/// an OTLP collector when the `OTEL_*` variables ask for it (needs the tokio runtime). Keep the
/// guard and [`OtelGuard::shutdown`] it at exit so the last spans are sent.
pub fn init(log: Option<&str>, format: LogFormat) -> OtelGuard {
    let filter = log
        .map(str::to_owned)
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| DEFAULT_FILTER.into());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let logs: BoxedLayer = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        // Colours for a person at a terminal; plain lines into a file or a log collector.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let mut layers = vec![logs];
    let mut guard = OtelGuard::default();
    let mut problem = None;
    match otel::pipeline() {
        Ok(Some((tracer, g))) => {
            layers.push(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(EnvFilter::new(SPAN_FILTER))
                    .boxed(),
            );
            guard = g;
        }
        Ok(None) => {}
        Err(e) => problem = Some(e),
    }
    let _ = tracing_subscriber::registry().with(layers).try_init();
    if let Some(e) = problem {
        tracing::error!(error = %e, "OpenTelemetry export is off");
    } else if otel::active() {
        otel::warn_if_unsupported_protocol();
        tracing::info!("OpenTelemetry: spans are exported over OTLP/HTTP");
    }
    guard
}
