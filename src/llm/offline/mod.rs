//! The `offline` provider: deterministic, no network, the default when no model is configured,
//! so a new user sees the whole Plan-Execute-Synthesize pipeline (plan, parallel items, tool calls,
//! results, synthesis, compaction) work end to end. It is NOT a language model and says so: the
//! service warns at start when it is the default provider, every run it serves says so in
//! `RUN_STARTED`, and every synthesized response starts with [`OFFLINE_NOTICE`].
//!
//! It reads a request as any model does: the phase, the messages and the offered tools, nothing
//! else. The engine's prompts follow a written contract, the labelled lines of
//! [`crate::llm::labels`], and that is where the offline model finds what it needs:
//!
//! - plan: the query is the last user message; the cap is the system prompt's
//!   `Use at most N items.`; a refinement note (`This thread already has a plan.`) lists the
//!   latest items earlier runs finished and how many there are (for fresh ids) and the items not
//!   started yet, `- <id> [<status>]: <description>` (the latter with their `depends on:`); the
//!   cap bounds this run's items, never the thread's;
//! - execute: the item brief (the first user message) gives `Your item [<id>]: <description>`,
//!   `Required tools: …` and the `Results of earlier items:` section; tool results are the `tool`
//!   messages;
//! - synthesize: the synthesis brief's `Results of the plan's items:` section (this run's items;
//!   the earlier items it summarizes for context are not part of the answer);
//! - compact: the user message after its first line (`Result of item [<id>] …:`).
//!
//! Its tests build their requests with the engine's own prompt builders, so a prompt change that
//! breaks the contract breaks them. The only prose it interprets is the query: arithmetic
//! expressions (checked with the calculator's own parser), a question about the time, "ask me",
//! the name of any other available tool (an MCP tool, the HTTP tool, …) optionally followed by a
//! JSON object of arguments (`call web__echo with {"text": "hi"}`), and its independent parts
//! (split at `?`, `;` and line breaks) when no tool applies.
//!
//! Like the HTTP providers, it hands its reply's text to the request's token sink, word by word
//! (all at once: nothing here is slow), so token streaming can be watched without a model.
//!
//! The files, in the order a request meets them: `read` (the engine's prompts, through their
//! labels), `query` (the query's prose), `plan`, `execute`, `answer` (synthesis and compaction)
//! and `flowchart` (an `llm` stage); this file holds the provider itself.

use super::{ChatRequest, ChatResponse, LlmError, LlmProvider, Phase};
use crate::model::Usage;

mod answer;
mod execute;
mod flowchart;
mod plan;
mod query;
mod read;
#[cfg(test)]
mod testing;

/// Prefix of every synthesized response of the offline model.
pub const OFFLINE_NOTICE: &str = "[offline model: not a real LLM] ";

/// Longest query quoted in an item description.
pub(super) const MAX_QUOTED_QUERY: usize = 500;

/// The deterministic stand-in model (see the module docs).
#[derive(Debug)]
pub struct OfflineProvider {
    _private: (),
}

impl Default for OfflineProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl OfflineProvider {
    /// Build the offline model. It is always registered (a thread may name it), so building it
    /// says nothing: the start-up warning is for when it is the default provider.
    pub fn new() -> Self {
        Self { _private: () }
    }
}

pub(super) fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{}…", cut.trim_end())
    }
}

/// Rough token count: a token per four characters.
fn tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[async_trait::async_trait]
impl LlmProvider for OfflineProvider {
    fn name(&self) -> &'static str {
        "offline"
    }

    fn is_offline(&self) -> bool {
        true
    }

    fn default_model(&self) -> Option<&str> {
        Some("offline")
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let (content, tool_calls) = match request.phase {
            Phase::Plan => (Some(plan::plan(&request).to_string()), vec![]),
            Phase::Execute => execute::execute(&request),
            Phase::Synthesize => (Some(answer::synthesize(&request).to_string()), vec![]),
            Phase::Compact => (Some(answer::compact(&request).to_string()), vec![]),
            Phase::Flowchart => (Some(flowchart::flowchart_stage(&request)), vec![]),
        };
        let prompt_chars: usize = request
            .messages
            .iter()
            .map(|m| {
                m.content.as_deref().map_or(0, str::len)
                    + m.tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            })
            .sum();
        let completion_chars = content.as_deref().map_or(0, str::len)
            + tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.to_string().len())
                .sum::<usize>();
        if let Some(text) = &content
            && request.tokens.listening()
        {
            for word in text.split_inclusive(' ') {
                request.tokens.send(word);
            }
        }
        let (prompt_tokens, completion_tokens) = (tokens(prompt_chars), tokens(completion_chars));
        let finish_reason = if tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(ChatResponse {
            content,
            tool_calls,
            usage: Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
                llm_calls: 1,
                ..Default::default()
            },
            finish_reason: Some(finish_reason.into()),
            model: Some("offline".into()),
        })
    }
}
