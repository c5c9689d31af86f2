//! Executing an item: call the tool its brief requires once (with arguments read from the item's
//! description), then answer from the tool's result; a reasoning item answers from the earlier
//! results its brief holds.

use serde_json::{Value, json};

use super::plan::{ASK_PREFIX, ASK_QUESTION, CALCULATE_PREFIX, PART_PREFIX, called_tool};
use super::query::{detect_expressions, detect_zone};
use super::read::{ItemBrief, first_user_text, read_item_brief};
use super::{MAX_QUOTED_QUERY, truncate_chars};
use crate::llm::{ChatMessage, ChatRequest, Role, ToolCall};

/// The name of the tool a tool call id belongs to, from the assistant messages.
fn tool_name_of<'a>(messages: &'a [ChatMessage], call_id: &str) -> Option<&'a str> {
    messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|c| c.id == call_id)
        .map(|c| c.name.as_str())
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A sentence for one tool result.
fn describe_tool_result(messages: &[ChatMessage], msg: &ChatMessage) -> String {
    let name = msg
        .tool_call_id
        .as_deref()
        .and_then(|id| tool_name_of(messages, id))
        .unwrap_or("tool");
    let content = msg.content.as_deref().unwrap_or("");
    let parsed: Option<Value> = serde_json::from_str(content).ok();
    match parsed {
        Some(v) if v.get("expression").is_some() && v.get("result").is_some() => {
            format!(
                "{} = {}",
                scalar_text(&v["expression"]),
                scalar_text(&v["result"])
            )
        }
        Some(v) if v.get("iso8601").is_some() => format!(
            "The current time in {} is {}.",
            v.get("timezone").map_or_else(|| "UTC".into(), scalar_text),
            scalar_text(&v["iso8601"])
        ),
        Some(v) if v.get("error").is_some() => {
            format!("The {name} tool failed: {}", scalar_text(&v["error"]))
        }
        _ => format!(
            "The {name} tool returned: {}",
            truncate_chars(content, MAX_QUOTED_QUERY)
        ),
    }
}

/// Execute phase: call the item's tool once, then answer from its result.
pub(super) fn execute(req: &ChatRequest) -> (Option<String>, Vec<ToolCall>) {
    let results: Vec<&ChatMessage> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    if !results.is_empty() {
        let lines: Vec<String> = results
            .iter()
            .map(|m| describe_tool_result(&req.messages, m))
            .collect();
        return (Some(lines.join("\n")), vec![]);
    }
    let offered = |name: &str| req.tools.iter().any(|t| t.name == name);
    let brief = read_item_brief(first_user_text(req));
    let description = brief.description.clone();
    let made_before: usize = req.messages.iter().map(|m| m.tool_calls.len()).sum();
    let mut calls = Vec::new();
    let mut notes = Vec::new();
    for tool in &brief.required_tools {
        let arguments = match tool.as_str() {
            "calculator" => {
                let expr = description
                    .strip_prefix(CALCULATE_PREFIX)
                    .map(|e| e.trim().to_owned())
                    .or_else(|| detect_expressions(&description).into_iter().next());
                match expr {
                    Some(e) => json!({ "expression": e }),
                    None => {
                        notes.push(format!(
                            "I found no expression to calculate in \"{description}\"."
                        ));
                        continue;
                    }
                }
            }
            "ask_user" => json!({
                "question": description.strip_prefix(ASK_PREFIX).unwrap_or(ASK_QUESTION),
                "inputSchema": {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}},
            }),
            "current_time" => match detect_zone(&description) {
                Some(z) => json!({ "timezone": z }),
                None => json!({}),
            },
            other => match called_tool(&description) {
                Some((name, args)) if name == other => args,
                _ => {
                    notes.push(format!(
                        "The offline model cannot use the `{other}` tool unless the query names it."
                    ));
                    continue;
                }
            },
        };
        if !offered(tool) {
            notes.push(format!("The `{tool}` tool is not enabled for this thread."));
            continue;
        }
        calls.push(ToolCall {
            id: format!("call_{}_{}", brief.item_id, made_before + calls.len() + 1),
            name: tool.clone(),
            arguments,
        });
    }
    if !calls.is_empty() {
        return (None, calls);
    }
    if !notes.is_empty() {
        return (Some(notes.join(" ")), vec![]);
    }
    (Some(reasoning_answer(&brief)), vec![])
}

/// A reasoning item's answer. An independent part is answered for itself, whatever else has
/// finished (parts run in parallel, so what they see of each other depends on timing); any other
/// item quotes the earlier results its brief holds.
fn reasoning_answer(brief: &ItemBrief) -> String {
    if let Some(part) = brief.description.strip_prefix(PART_PREFIX) {
        return format!(
            "The offline model cannot work out \"{part}\"; a real model would answer this part here."
        );
    }
    let query = brief.query.trim();
    if brief.earlier.is_empty() {
        format!("Answer to \"{query}\": no earlier step produced a result.")
    } else {
        format!("Answer to \"{query}\": {}", brief.earlier.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::agent::prompts::ResultLine;
    use crate::llm::offline::OfflineProvider;
    use crate::llm::offline::testing::*;
    use crate::llm::{LlmProvider, ToolSpec};
    use crate::tools::ToolRegistry;

    #[tokio::test]
    async fn execute_calls_the_tool_then_answers_from_its_result() {
        let offline = OfflineProvider::new();
        let mut request = execute_request(
            "what is 12*(3+4)",
            "Calculate 12*(3+4)",
            &["calculator"],
            vec![],
        );
        let r = offline.complete(request.clone()).await.unwrap();
        assert_eq!(r.content, None);
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "call_step-9_1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "12*(3+4)"})
            }]
        );
        // Run it for real through the registry, as the agent would.
        let registry = ToolRegistry::with_builtins();
        let ctx = crate::tools::ToolContext {
            tenant: "t".into(),
            thread_id: "th".into(),
            idempotency_key: "k".into(),
            memory_namespace: None,
        };
        let outcome = registry
            .invoke("calculator", r.tool_calls[0].arguments.clone(), &ctx)
            .await;
        request
            .messages
            .push(ChatMessage::assistant(None, r.tool_calls.clone()));
        request
            .messages
            .push(ChatMessage::tool("call_step-9_1", outcome.to_model_text()));
        let r = offline.complete(request).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("12*(3+4) = 84"));
        assert!(r.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn execute_reports_tool_errors_and_time_results() {
        let mut request = execute_request("1/0", "Calculate 1/0", &["calculator"], vec![]);
        request.messages.push(ChatMessage::assistant(
            None,
            vec![ToolCall {
                id: "call_step-9_1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "1/0"}),
            }],
        ));
        request.messages.push(ChatMessage::tool(
            "call_step-9_1",
            r#"{"error":"division by zero"}"#,
        ));
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("The calculator tool failed: division by zero")
        );

        let request = execute_request(
            "time in Europe/Paris",
            "Look up the current time in Europe/Paris",
            &["current_time"],
            vec![],
        );
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(r.tool_calls[0].name, "current_time");
        assert_eq!(
            r.tool_calls[0].arguments,
            json!({"timezone": "Europe/Paris"})
        );
    }

    #[tokio::test]
    async fn a_disabled_tool_is_not_called() {
        let mut request = execute_request("2+2", "Calculate 2+2", &["calculator"], vec![]);
        request.tools = vec![ToolSpec {
            name: "current_time".into(),
            description: String::new(),
            parameters: json!({}),
        }];
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert!(r.tool_calls.is_empty());
        assert_eq!(
            r.content.as_deref(),
            Some("The `calculator` tool is not enabled for this thread.")
        );
    }

    #[tokio::test]
    async fn reasoning_items_summarize_previous_outputs() {
        let request = execute_request(
            "what is 2+2",
            "Compose the answer to: what is 2+2",
            &[],
            vec![completed("step-1", "Calculate 2+2", "2+2 = 4")],
        );
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("Answer to \"what is 2+2\": Calculate 2+2: 2+2 = 4")
        );
        let request = execute_request("hello", "Compose the answer to: hello", &[], vec![]);
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("Answer to \"hello\": no earlier step produced a result.")
        );
    }

    #[tokio::test]
    async fn a_part_item_answers_its_part_whatever_else_finished() {
        let answer = |earlier: Vec<ResultLine>| async move {
            let request = execute_request(
                "Who built Rome? Who built Athens?",
                "Answer this part: Who built Rome",
                &[],
                earlier,
            );
            let r = OfflineProvider::new().complete(request).await.unwrap();
            r.content.unwrap()
        };
        let alone = answer(vec![]).await;
        assert!(alone.contains("\"Who built Rome\""), "{alone}");
        let after_a_sibling = answer(vec![completed(
            "step-2",
            "Answer this part: Who built Athens",
            "x",
        )])
        .await;
        assert_eq!(alone, after_a_sibling);
    }
}
