//! OpenTelemetry traces: the service's `tracing` spans exported over OTLP/HTTP (protobuf) when the
//! standard `OTEL_*` variables ask for it (the trace context a run carries is in `context.rs`).
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set,
//! or `OTEL_TRACES_EXPORTER=otlp`; `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` turns
//! it off. Off, no layer is installed: spans cost what they cost for the logs, nothing more. The
//! exporter crate reads the endpoint, headers, timeout and compression variables itself, the SDK
//! the batch (`OTEL_BSP_*`), sampler and resource (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`) ones.
//!
//! Spans leave the process from the SDK's batch thread, never from a run's task: a slow or dead
//! collector costs a full queue (spans dropped), not a slower run. The batch thread sends with the
//! service's own `reqwest` client ([`OtlpClient`]), its requests spawned on the tokio runtime
//! the service started on, so no second HTTP or TLS stack is built.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// Set once the OpenTelemetry layer is installed: spans are exported.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (the OpenTelemetry layer is installed in this process).
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Largest collector reply read (its body is a small protobuf message, or an error text).
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// What the standard variables ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// No export.
    Off,
    /// Export over OTLP/HTTP.
    Otlp,
}

/// Read the standard variables through `var` (the environment in the service).
pub fn wanted(var: impl Fn(&str) -> Option<String>) -> Wanted {
    let set = |k: &str| {
        var(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Wanted::Off;
    }
    match set("OTEL_TRACES_EXPORTER") {
        Some(list) => {
            let names: Vec<String> = list.split(',').map(|s| s.trim().to_lowercase()).collect();
            if names.iter().any(|n| n == "otlp") {
                Wanted::Otlp
            } else {
                Wanted::Off
            }
        }
        None if set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() =>
        {
            Wanted::Otlp
        }
        None => Wanted::Off,
    }
}

/// Owns the exporting pipeline; [`OtelGuard::shutdown`] flushes what is queued.
#[derive(Default)]
pub struct OtelGuard {
    provider: Option<SdkTracerProvider>,
}

impl OtelGuard {
    /// Export the spans still queued and stop the batch thread (bounded by the exporter's
    /// timeout). Runs on a blocking thread: the SDK blocks while the batch thread sends through
    /// the runtime.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("pes-server: exporting the last spans failed: {e}"),
            Err(e) => eprintln!("pes-server: exporting the last spans failed: {e}"),
        }
    }
}

/// Why span export was asked for but cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("OpenTelemetry export needs the tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    #[error(transparent)]
    Client(#[from] ClientBuildError),
    #[error("building the OTLP exporter: {0}")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// The OTLP HTTP client cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("building the OTLP client: {0}")]
pub struct ClientBuildError(#[source] reqwest::Error);

/// The tracer spans go to, and the guard that flushes them, when the variables ask for export.
///
/// # Errors
/// A message for the log when export was asked for but cannot start (no tokio runtime, a bad
/// endpoint, an unsupported protocol is only warned about).
pub fn pipeline() -> Result<Option<(SdkTracer, OtelGuard)>, PipelineError> {
    if wanted(|k| std::env::var(k).ok()) == Wanted::Off {
        return Ok(None);
    }
    let runtime = tokio::runtime::Handle::try_current().map_err(PipelineError::NoRuntime)?;
    let client = OtlpClient::new(runtime, export_timeout())?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(export_timeout())
        .with_http_client(client)
        .build()
        .map_err(PipelineError::Exporter)?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource())
        .build();
    let tracer = provider.tracer("pes-server");
    ACTIVE.store(true, Ordering::Relaxed);
    Ok(Some((
        tracer,
        OtelGuard {
            provider: Some(provider),
        },
    )))
}

/// Say so when the variables ask for an OTLP protocol other than the one spoken (logged once
/// the subscriber is installed).
pub fn warn_if_unsupported_protocol() {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(p) = std::env::var(var)
            && !p.trim().is_empty()
            && p.trim() != "http/protobuf"
        {
            tracing::warn!(
                variable = var,
                value = %p,
                "only OTLP over http/protobuf is supported: spans are sent that way"
            );
        }
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else
/// 10 s: how long one export may take.
fn export_timeout() -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse::<u64>().ok())
    .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The resource the SDK reads from the environment, named `pes-server` unless
/// `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) names it.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if named {
        builder.build()
    } else {
        builder.with_service_name("pes-server").build()
    }
}

/// The OTLP exporter's HTTP client: the service's `reqwest` client, its requests spawned on the
/// service's runtime (the SDK's batch thread, which calls it, has no runtime of its own).
#[derive(Debug)]
pub struct OtlpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl OtlpClient {
    /// # Errors
    /// The client cannot be built.
    pub fn new(
        runtime: tokio::runtime::Handle,
        timeout: Duration,
    ) -> Result<Self, ClientBuildError> {
        let client = crate::net::client_builder()
            .timeout(timeout)
            .build()
            .map_err(ClientBuildError)?;
        Ok(Self { client, runtime })
    }
}

#[async_trait]
impl HttpClient for OtlpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let request = reqwest::Request::try_from(request)?;
        let task = self.runtime.spawn(async move {
            let mut reply = client.execute(request).await?;
            let mut out = Response::builder().status(reply.status());
            if let Some(h) = out.headers_mut() {
                *h = reply.headers().clone();
            }
            let mut body = Vec::new();
            while let Some(chunk) = reply.chunk().await? {
                let room = MAX_REPLY_BYTES.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if room <= chunk.len() {
                    break;
                }
            }
            Ok::<_, HttpError>(out.body(Bytes::from(body))?)
        });
        task.await?
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn export_is_on_only_when_the_standard_variables_ask_for_it() {
        assert_eq!(wanted(env(&[])), Wanted::Off);
        let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(wanted(env(&[ep])), Wanted::Otlp);
        assert_eq!(
            wanted(env(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c/v1/traces"
            )])),
            Wanted::Otlp
        );
        assert_eq!(
            wanted(env(&[("OTEL_TRACES_EXPORTER", "otlp")])),
            Wanted::Otlp
        );
        assert_eq!(
            wanted(env(&[ep, ("OTEL_TRACES_EXPORTER", "none")])),
            Wanted::Off
        );
        assert_eq!(
            wanted(env(&[ep, ("OTEL_SDK_DISABLED", "true")])),
            Wanted::Off
        );
        assert_eq!(
            wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            Wanted::Off
        );
    }
}
