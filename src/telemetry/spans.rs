//! The spans of a run, named and attributed after the OpenTelemetry GenAI conventions so a
//! collector shows them as agent, model and tool operations: `invoke_agent` per attempt, `plan`,
//! `item` and `synthesize` inside it, `chat {model}` per model call and `execute_tool {name}` per
//! tool call. The attributes are `tracing` fields (the logs carry them too); what `tracing`
//! cannot hold (the list of finish reasons) is set on the exported span only.
//!
//! [`timed`] puts a call's future in its span and counts its outcome and latency, including a
//! call abandoned half-way (the run was cancelled or the process stopped): it is `cancelled`.

use std::time::{Duration, Instant};

use opentelemetry::{Array, StringValue, Value};
use tracing::field::Empty;
use tracing::{Instrument, Span, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{context, otel};
use crate::model::Run;

/// The span of one attempt at a run, continuing the trace stored with the run.
pub fn invoke_agent(run: &Run) -> Span {
    let span = info_span!(
        "invoke_agent",
        otel.name = "invoke_agent pes",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = "pes",
        gen_ai.conversation.id = %run.thread_id,
        run_id = %run.run_id,
        thread_id = %run.thread_id,
        attempt = run.attempt,
    );
    context::continue_trace(&span, run.trace_context.as_deref());
    span
}

/// The planning phase (a first plan or a refinement).
pub fn plan() -> Span {
    info_span!("plan")
}

/// The synthesis of the final answer.
pub fn synthesize() -> Span {
    info_span!("synthesize")
}

/// One item of the plan, under the current span (the attempt's) or under `team`, the span of
/// the team item it belongs to.
pub fn item(item_id: &str, team: Option<&Span>) -> Span {
    match team {
        Some(parent) => info_span!(parent: parent, "item", item_id),
        None => info_span!("item", item_id),
    }
}

/// One model call.
pub fn chat(provider: &'static str, model: &str) -> Span {
    info_span!(
        "chat",
        otel.name = format!("chat {model}").as_str(),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.system = provider,
        gen_ai.request.model = model,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
    )
}

/// How a model call that answered went, as its span records it.
pub struct ChatAnswered<'a> {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The model that answered, as the provider named it.
    pub model: Option<&'a str>,
    pub finish_reason: Option<&'a str>,
}

/// Record how a model call ended on its span: what it answered with, or the error's code.
pub fn chat_done(span: &Span, result: Result<ChatAnswered<'_>, &str>) {
    match result {
        Ok(r) => {
            // As i64: the exporter keeps unsigned integers only as text.
            span.record("gen_ai.usage.input_tokens", int(r.input_tokens));
            span.record("gen_ai.usage.output_tokens", int(r.output_tokens));
            if let Some(m) = r.model {
                span.record("gen_ai.response.model", m);
            }
            if otel::active()
                && let Some(reason) = r.finish_reason
            {
                span.set_attribute(
                    "gen_ai.response.finish_reasons",
                    Value::Array(Array::String(vec![StringValue::from(reason.to_owned())])),
                );
            }
        }
        Err(code) => {
            span.record("error.type", code);
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// `n` as an attribute value: `tracing-opentelemetry` exports unsigned integers as text.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One tool call (`call_id` is the model's id for it).
pub fn execute_tool(name: &str, call_id: &str) -> Span {
    info_span!(
        "execute_tool",
        otel.name = format!("execute_tool {name}").as_str(),
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.type = "function",
        error.type = Empty,
    )
}

/// Mark a span failed with a short error type.
pub fn failed(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "ERROR");
}

/// Run `fut` inside `span`; when it ends, `done` gets its output and the time it took (to count
/// it); when it is dropped unfinished, `cancelled` gets the time instead.
pub async fn timed<F: Future>(
    span: Span,
    fut: F,
    done: impl FnOnce(&F::Output, Duration),
    cancelled: impl FnOnce(Duration),
) -> F::Output {
    struct OnDrop<C: FnOnce(Duration)> {
        start: Instant,
        cancelled: Option<C>,
    }
    impl<C: FnOnce(Duration)> Drop for OnDrop<C> {
        fn drop(&mut self) {
            if let Some(c) = self.cancelled.take() {
                c(self.start.elapsed());
            }
        }
    }
    let mut guard = OnDrop {
        start: Instant::now(),
        cancelled: Some(cancelled),
    };
    let out = fut.instrument(span).await;
    guard.cancelled = None;
    done(&out, guard.start.elapsed());
    out
}
