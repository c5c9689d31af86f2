//! The run's answer and an item's summary: the `pes_synthesis` reply (every item of the synthesis
//! brief, with its output) and the `pes_compaction` reply (the beginning of the result).

use serde_json::{Value, json};

use super::OFFLINE_NOTICE;
use super::read::{brief_query, first_user_text, last_user_text, results_section};
use crate::llm::ChatRequest;
use crate::llm::labels;

/// Longest compaction summary, in bytes.
const MAX_SUMMARY: usize = 1000;

/// The `pes_synthesis` reply: every item of the synthesis brief, with its output (or why it did
/// not complete).
pub(super) fn synthesize(req: &ChatRequest) -> Value {
    let lines: Vec<&str> = first_user_text(req).lines().collect();
    let (query, after_query) = brief_query(&lines);
    let results = results_section(&lines[after_query..], labels::ITEM_RESULTS);
    let mut response = String::from(OFFLINE_NOTICE);
    if results.is_empty() {
        response.push_str(&format!("No step produced a result for \"{query}\"."));
    } else {
        response.push_str(&format!("Results for \"{query}\":"));
        for entry in &results {
            response.push_str(&format!("\n- {}", entry.replace('\n', "\n  ")));
        }
    }
    json!({
        "response": response,
        "sources": [],
        "suggestions": [
            "Configure a real model (PES_LLM_BASE_URL, PES_LLM_API_KEY, PES_LLM_MODEL) for real answers."
        ],
    })
}

/// The `pes_compaction` reply: the beginning of the result to compact (the user message after its
/// `Result of item [<id>] …:` line), at most [`MAX_SUMMARY`] bytes. A longer result gets a strict
/// prefix, so the summary is always shorter than what it replaces, in bytes and in characters.
pub(super) fn compact(req: &ChatRequest) -> Value {
    let text = last_user_text(req).unwrap_or_default();
    let result = match text.split_once('\n') {
        Some((first, rest)) if first.starts_with(labels::TO_COMPACT) => rest,
        _ => text,
    };
    let mut end = result.len().min(MAX_SUMMARY);
    while !result.is_char_boundary(end) {
        end -= 1;
    }
    json!({ "summary": &result[..end] })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::agent::plan;
    use crate::agent::prompts::{self, Outcome, ResultLine};
    use crate::llm::offline::OfflineProvider;
    use crate::llm::offline::testing::*;
    use crate::llm::{ChatMessage, LlmProvider, Phase};
    use crate::model::{AgentConfig, ItemId, ItemStatus, ToolValidationMode};

    #[tokio::test]
    async fn synthesis_says_it_is_offline_and_includes_every_result() {
        let brief = prompts::synthesis_brief(
            "what is 2+2 and 3*3",
            Some("1. Calculate 2+2\n2. Calculate 3*3"),
            &prompts::Earlier::default(),
            &[
                completed("step-1", "Calculate 2+2", "2+2 = 4"),
                completed("step-2", "Calculate 3*3", "3*3 = 9\nnine"),
                ResultLine {
                    id: "step-3".into(),
                    description: "Look up the current time".into(),
                    outcome: Outcome::Failed("the clock broke".into()),
                },
                ResultLine {
                    id: "step-4".into(),
                    description: "Compose the answer to: what is 2+2 and 3*3".into(),
                    outcome: Outcome::Cancelled("depends on failed item step-3".into()),
                },
            ],
        );
        let request = request(
            Phase::Synthesize,
            vec![
                ChatMessage::system(prompts::synthesis_system(&AgentConfig::default())),
                ChatMessage::user(brief),
            ],
        );
        let offline = OfflineProvider::new();
        assert!(offline.is_offline());
        assert_eq!(offline.name(), "offline");
        let v = reply(request).await;
        assert_eq!(
            v["response"],
            format!(
                "{OFFLINE_NOTICE}Results for \"what is 2+2 and 3*3\":\n\
                 - Calculate 2+2: 2+2 = 4\n\
                 - Calculate 3*3: 3*3 = 9\n  nine\n\
                 - Look up the current time: FAILED (the clock broke)\n\
                 - Compose the answer to: what is 2+2 and 3*3: CANCELLED (depends on failed item step-3)"
            )
        );
        assert_eq!(v["sources"], json!([]));
        assert!(!v["suggestions"].as_array().unwrap().is_empty());

        let empty = prompts::synthesis_brief("hi", None, &prompts::Earlier::default(), &[]);
        let v = reply(request_with_user(Phase::Synthesize, empty)).await;
        assert_eq!(
            v["response"],
            format!("{OFFLINE_NOTICE}No step produced a result for \"hi\".")
        );
    }

    #[tokio::test]
    async fn a_follow_up_is_answered_from_its_own_items_not_the_earlier_ones() {
        let earlier_item = |n: usize| {
            let v = plan::ValidItem {
                id: ItemId::parse(&format!("step-{n}")).unwrap(),
                description: format!("Calculate 2+{n}"),
                step_type: crate::model::StepType::Tool,
                required_tools: vec!["calculator".into()],
                expected_outcome: None,
                dependencies: vec![],
                kind: crate::model::ItemKind::Leaf,
                role: None,
                tool_allowlist: None,
            };
            let mut it = plan::new_item(&v, ToolValidationMode::Advisory);
            it.status = ItemStatus::Completed;
            prompts::EarlierLine::of(&it, &format!("2+{n} = {}\nmore", n + 2))
        };
        let earlier = prompts::Earlier {
            shown: (31..=40).map(earlier_item).collect(),
            total: 40,
        };
        let brief = prompts::synthesis_brief(
            "What is 2+41?",
            None,
            &earlier,
            &[completed("step-41", "Calculate 2+41", "2+41 = 43")],
        );
        assert!(
            brief.contains("40 in all, the last 10 below (30 older ones not shown)"),
            "{brief}"
        );
        assert!(
            brief.contains("- [step-40] Calculate 2+40: 2+40 = 42 more\n"),
            "{brief}"
        );
        let v = reply(request_with_user(Phase::Synthesize, brief)).await;
        assert_eq!(
            v["response"],
            format!("{OFFLINE_NOTICE}Results for \"What is 2+41?\":\n- Calculate 2+41: 2+41 = 43")
        );
    }

    fn request_with_user(phase: Phase, text: String) -> ChatRequest {
        request(
            phase,
            vec![ChatMessage::system("system"), ChatMessage::user(text)],
        )
    }

    async fn summary_of(result: &str) -> String {
        let req = request(
            Phase::Compact,
            vec![
                ChatMessage::system(prompts::compaction_system(1500)),
                ChatMessage::user(prompts::compaction_request("step-1", "Look it up", result)),
            ],
        );
        reply(req).await["summary"].as_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn compaction_keeps_the_beginning_of_the_result_and_is_always_shorter() {
        // A short result is its own summary, without the request's first line.
        assert_eq!(summary_of("2+2 = 4\nfour").await, "2+2 = 4\nfour");
        // Long results, with multi-byte characters placed so a byte cut would split them.
        for result in [
            "x".repeat(5000),
            "é".repeat(MAX_SUMMARY),
            format!("{}😀", "a".repeat(MAX_SUMMARY - 3)),
            format!("{}😀b", "a".repeat(MAX_SUMMARY - 1)),
        ] {
            let summary = summary_of(&result).await;
            assert!(summary.len() <= MAX_SUMMARY, "{} bytes", summary.len());
            assert!(result.starts_with(&summary));
            assert!(summary.len() < result.len());
            assert!(summary.chars().count() < result.chars().count());
            assert!(!summary.is_empty());
        }
    }
}
