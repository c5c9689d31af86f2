//! The W3C trace context a run carries: taken from the request that made (or resumed) the run,
//! stored with it, and restored as the parent of every attempt's span, so the run's spans continue
//! the caller's trace wherever and whenever the run is driven (later, on another replica, after a
//! suspension, after a crash recovery).

use std::collections::HashMap;

use axum::http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::otel::active;

/// The W3C trace context a run continues (`traceparent`, `tracestate`), stored with the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context in the caller's headers, when they carry a valid `traceparent`.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let carrier: HashMap<String, String> = ["traceparent", "tracestate"]
            .iter()
            .filter_map(|k| Some(((*k).to_owned(), headers.get(*k)?.to_str().ok()?.to_owned())))
            .collect();
        // Extracted onto an empty context: on the current one, a missing or bad header would
        // yield the current span's context instead of nothing.
        let cx = TraceContextPropagator::new()
            .extract_with_context(&opentelemetry::Context::new(), &carrier);
        Self::of(&cx)
    }

    /// The context of the current span (the request's, under the caller's), when spans are
    /// exported.
    pub fn current() -> Option<Self> {
        if !active() {
            return None;
        }
        Self::of(&tracing::Span::current().context())
    }

    fn of(cx: &opentelemetry::Context) -> Option<Self> {
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(cx, &mut carrier);
        Some(Self {
            traceparent: carrier.remove("traceparent")?,
            tracestate: carrier.remove("tracestate").filter(|s| !s.is_empty()),
        })
    }

    /// What a new or resumed run stores: the current span's context when spans are exported
    /// (the request span, itself a child of the caller's `traceparent`), else the caller's
    /// `traceparent` as it came (a worker that exports continues it).
    pub fn for_run(headers: &HeaderMap) -> Option<Self> {
        Self::current().or_else(|| Self::from_headers(headers))
    }

    /// What a resumed run stores: like [`TraceContext::for_run`], but only when the caller sent
    /// a `traceparent` (otherwise the run keeps the trace it was created in).
    pub fn for_resume(headers: &HeaderMap) -> Option<Self> {
        Self::from_headers(headers)?;
        Self::for_run(headers)
    }

    /// As stored: a JSON object.
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).expect("two strings serialize")
    }

    /// From its stored form; `None` when it does not parse.
    pub fn from_stored(raw: &str) -> Option<Self> {
        serde_json::from_str(raw).ok()
    }

    fn context(&self) -> opentelemetry::Context {
        let mut carrier = HashMap::from([("traceparent".to_owned(), self.traceparent.clone())]);
        if let Some(s) = &self.tracestate {
            carrier.insert("tracestate".to_owned(), s.clone());
        }
        TraceContextPropagator::new().extract_with_context(&opentelemetry::Context::new(), &carrier)
    }
}

/// Make `span` (just created, not yet entered) a child of the stored trace context, so a run's
/// spans continue the trace it was created in. Nothing happens when spans are not exported or
/// nothing is stored.
pub fn continue_trace(span: &tracing::Span, stored: Option<&str>) {
    if !active() {
        return;
    }
    if let Some(tc) = stored.and_then(TraceContext::from_stored) {
        let _ = span.set_parent(tc.context());
    }
}

/// Make the request span `span` a child of the caller's `traceparent`, when spans are exported.
pub fn continue_request(span: &tracing::Span, headers: &HeaderMap) {
    if !active() {
        return;
    }
    if let Some(tc) = TraceContext::from_headers(headers) {
        let _ = span.set_parent(tc.context());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_kept_and_a_bad_one_is_ignored() {
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        h.insert("tracestate", "congo=t61rcWkgMzE".parse().unwrap());
        let tc = TraceContext::from_headers(&h).expect("valid");
        assert_eq!(
            tc.traceparent,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(tc.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(TraceContext::from_stored(&tc.to_stored()), Some(tc));

        let mut bad = HeaderMap::new();
        bad.insert("traceparent", "00-000-nope-01".parse().unwrap());
        assert_eq!(TraceContext::from_headers(&bad), None);
        assert_eq!(TraceContext::from_headers(&HeaderMap::new()), None);
        assert_eq!(TraceContext::from_stored("not json"), None);
    }
}
