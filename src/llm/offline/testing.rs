//! What the offline model's tests share: requests built with the engine's own prompt builders (so
//! a prompt change that breaks the labels' contract breaks the tests), and the replies read back.

use serde_json::Value;

use super::OfflineProvider;
use crate::agent::plan::{self, PlanReply};
use crate::agent::prompts::{self, Brief, Outcome, ResultLine};
use crate::llm::{ChatMessage, ChatRequest, LlmProvider, Phase};
use crate::model::{AgentConfig, ItemStatus, TodoItem, ToolValidationMode};
use crate::tools::ToolRegistry;

pub(super) fn request(phase: Phase, messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest {
        phase,
        model: None,
        messages,
        tools: ToolRegistry::with_builtins().specs(None),
        response_format: None,
        tokens: crate::llm::Tokens::none(),
    }
}

/// A planning request as the planner builds it: system prompt, history, the refinement note
/// when a plan exists, then the query.
pub(super) fn plan_request(
    query: &str,
    max_items: u32,
    history: &[&str],
    existing: &[TodoItem],
) -> ChatRequest {
    let described: Vec<(String, String)> = ToolRegistry::with_builtins()
        .specs(None)
        .into_iter()
        .map(|t| (t.name, t.description))
        .collect();
    let mut messages = vec![ChatMessage::system(prompts::planning_system(
        &AgentConfig::default(),
        &described,
        max_items,
        true,
    ))];
    messages.extend(history.iter().map(|h| ChatMessage::user(*h)));
    if !existing.is_empty() {
        messages.push(ChatMessage::user(note_for(existing)));
    }
    messages.push(ChatMessage::user(query));
    request(Phase::Plan, messages)
}

/// The refinement note the planner writes for a thread holding `existing`: its finished
/// items as earlier runs' (the latest few shown), the pending ones whole.
pub(super) fn note_for(existing: &[TodoItem]) -> String {
    let finished: Vec<&TodoItem> = existing
        .iter()
        .filter(|i| i.status != ItemStatus::Pending)
        .collect();
    let skip = finished.len().saturating_sub(prompts::EARLIER_ITEMS_SHOWN);
    let earlier = prompts::Earlier {
        total: finished.len(),
        shown: finished[skip..]
            .iter()
            .map(|i| prompts::EarlierLine::of(i, i.result.as_deref().unwrap_or("")))
            .collect(),
    };
    let pending: Vec<TodoItem> = existing
        .iter()
        .filter(|i| i.status == ItemStatus::Pending)
        .cloned()
        .collect();
    prompts::refinement_note(&earlier, &pending)
}

pub(super) async fn reply(req: ChatRequest) -> Value {
    let r = OfflineProvider::new().complete(req).await.unwrap();
    assert_eq!(r.usage.llm_calls, 1);
    assert!(r.usage.total_tokens > 0);
    serde_json::from_str(r.content.as_deref().unwrap()).unwrap()
}

pub(super) async fn plan_for(query: &str, max_items: u32) -> Value {
    reply(plan_request(query, max_items, &[], &[])).await
}

/// The items of an offline plan as the engine stores them (validated), all completed.
pub(super) fn completed_items(plan_json: &Value) -> Vec<TodoItem> {
    let reply: PlanReply = serde_json::from_value(plan_json.clone()).unwrap();
    let known = ToolRegistry::with_builtins().names();
    plan::validate(
        &reply.todo_list,
        &[],
        &plan::Rules {
            known_tools: &known,
            roles: None,
            max_items: 20,
        },
    )
    .unwrap()
    .iter()
    .map(|v| {
        let mut it = plan::new_item(v, ToolValidationMode::Advisory);
        it.status = ItemStatus::Completed;
        it.result = Some(format!("done: {}\nsecond line", v.description));
        it
    })
    .collect()
}

pub(super) fn descriptions(plan: &Value) -> Vec<String> {
    plan["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["description"].as_str().unwrap().to_owned())
        .collect()
}

pub(super) fn completed(id: &str, description: &str, output: &str) -> ResultLine {
    ResultLine {
        id: id.into(),
        description: description.into(),
        outcome: Outcome::Completed(output.into()),
    }
}

/// An execution request as the executor builds it: system prompt, then the item's brief.
pub(super) fn execute_request(
    query: &str,
    description: &str,
    required_tools: &[&str],
    earlier: Vec<ResultLine>,
) -> ChatRequest {
    let required: Vec<String> = required_tools.iter().map(|t| (*t).to_owned()).collect();
    let brief = prompts::item_brief(&Brief {
        query,
        plan: Some("1. Something\n2. Something else"),
        earlier,
        role: Some(("Analyst", "You check numbers.\nYour item [x]: not this one")),
        item_id: "step-9",
        description,
        expected_outcome: Some("An outcome\nover two lines"),
        required_tools: &required,
    });
    request(
        Phase::Execute,
        vec![
            ChatMessage::system(prompts::execution_system(&AgentConfig::default(), true)),
            ChatMessage::user(brief),
        ],
    )
}
