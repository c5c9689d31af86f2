//! A provider wrapped so every model call is seen: a `chat {model}` span with the GenAI
//! attributes (provider, model, token usage, finish reason, error type), and the call counted in
//! the metrics by provider, model and outcome, with its latency and tokens. The wrapped provider
//! is unchanged, so every provider gets this without knowing of it.
//!
//! Every [`LlmProvider`] method must be forwarded here: one left to its default would silently
//! change what the wrapped provider does.

use std::sync::Arc;

use async_trait::async_trait;

use super::{ChatRequest, ChatResponse, LlmError, LlmProvider};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::spans;

/// A provider whose calls are traced and counted.
pub struct Instrumented {
    inner: Arc<dyn LlmProvider>,
    metrics: Metrics,
}

impl Instrumented {
    /// `inner`, its calls traced and counted in `metrics`.
    pub fn wrap(inner: Arc<dyn LlmProvider>, metrics: Metrics) -> Arc<dyn LlmProvider> {
        Arc::new(Self { inner, metrics })
    }
}

#[async_trait]
impl LlmProvider for Instrumented {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn is_offline(&self) -> bool {
        self.inner.is_offline()
    }

    fn default_model(&self) -> Option<&str> {
        self.inner.default_model()
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let provider = self.inner.name();
        let model = request
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .or_else(|| self.inner.default_model().map(str::to_owned))
            .unwrap_or_else(|| "unknown".into());
        let span = spans::chat(provider, &model);
        let metrics = &self.metrics;
        spans::timed(
            span.clone(),
            self.inner.complete(request),
            |result, took| {
                spans::chat_done(
                    &span,
                    match result {
                        Ok(r) => Ok(spans::ChatAnswered {
                            input_tokens: r.usage.prompt_tokens,
                            output_tokens: r.usage.completion_tokens,
                            model: r.model.as_deref(),
                            finish_reason: r.finish_reason.as_deref(),
                        }),
                        Err(e) => Err(e.code()),
                    },
                );
                match result {
                    Ok(r) => metrics.model_call(provider, &model, "ok", took, Some(&r.usage)),
                    Err(e) => metrics.model_call(provider, &model, e.code(), took, None),
                }
            },
            |took| metrics.model_call(provider, &model, "cancelled", took, None),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::offline::OfflineProvider;
    use crate::llm::{ChatMessage, Phase};

    #[tokio::test]
    async fn a_wrapped_provider_answers_as_before_and_its_calls_are_counted() {
        let metrics = Metrics::new();
        metrics.configure_models(["m1"]);
        let plain: Arc<dyn LlmProvider> = Arc::new(OfflineProvider::new());
        let wrapped = Instrumented::wrap(plain.clone(), metrics.clone());
        assert_eq!(wrapped.name(), plain.name());
        assert_eq!(wrapped.is_offline(), plain.is_offline());
        assert_eq!(wrapped.default_model(), plain.default_model());
        let request = ChatRequest {
            phase: Phase::Synthesize,
            model: Some("m1".into()),
            messages: vec![ChatMessage::user("hello")],
            tools: vec![],
            response_format: None,
            tokens: Default::default(),
        };
        let a = plain.complete(request.clone()).await.unwrap();
        let b = wrapped.complete(request).await.unwrap();
        assert_eq!(a.content, b.content);
        let text = metrics.render();
        assert!(
            text.contains(
                "pes_model_calls_total{provider=\"offline\",model=\"m1\",outcome=\"ok\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("pes_model_call_duration_seconds_count{provider=\"offline\",model=\"m1\",outcome=\"ok\"} 1"),
            "{text}"
        );
    }
}
