//! The Chat Completions wire format: the request body (messages, tools, `response_format`, the
//! stream options) and a completion read into a [`ChatResponse`].

use serde_json::{Map, Value, json};

use super::super::transport::MAX_ERROR_BODY;
use super::super::{ChatMessage, ChatRequest, ChatResponse, LlmError, Role, ToolCall, truncate};
use crate::model::Usage;

/// The wire form of one message; empty fields are omitted.
fn wire_message(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut o = Map::new();
    o.insert("role".into(), role.into());
    if let Some(c) = &m.content {
        o.insert("content".into(), c.clone().into());
    } else if m.role == Role::Tool {
        // A tool message must carry content.
        o.insert("content".into(), "".into());
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                // A raw (unparseable) argument string goes back exactly as the model wrote it.
                let arguments = match &c.arguments {
                    Value::String(raw) => raw.clone(),
                    other => other.to_string(),
                };
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": arguments},
                })
            })
            .collect();
        o.insert("tool_calls".into(), calls.into());
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), id.clone().into());
    }
    Value::Object(o)
}

/// The text added to the system prompt when a provider refuses `response_format` (or, for
/// Anthropic, when the schema cannot be a tool's input).
pub(crate) fn schema_instruction(schema: &Value) -> String {
    format!("Reply with only a JSON object that matches this JSON Schema: {schema}")
}

/// The request body. With `inline_schema`, `response_format` is left out and the schema is put
/// in the system prompt instead.
pub(super) fn build_body(
    req: &ChatRequest,
    model: &str,
    inline_schema: bool,
    stream: bool,
) -> Value {
    let mut messages: Vec<ChatMessage> = req.messages.clone();
    if inline_schema && let Some(fmt) = &req.response_format {
        let instruction = schema_instruction(&fmt.schema);
        match messages.first_mut() {
            Some(first) if first.role == Role::System => {
                let text = first.content.take().unwrap_or_default();
                first.content = Some(if text.is_empty() {
                    instruction
                } else {
                    format!("{text}\n\n{instruction}")
                });
            }
            _ => messages.insert(0, ChatMessage::system(instruction)),
        }
    }
    let mut body = json!({
        "model": model,
        "messages": messages.iter().map(wire_message).collect::<Vec<_>>(),
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect::<Vec<_>>()
            .into();
    }
    if !inline_schema && let Some(fmt) = &req.response_format {
        // The service's own schemas meet strict mode's rules (a unit test checks each); a schema
        // an operator wrote (a flowchart's `outputSchema`) may not, and OpenAI refuses such a
        // schema with `strict: true`: it goes without, and the reply is validated here anyway.
        let strict = super::super::strict::strict_mode_violations(&fmt.schema).is_empty();
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {"name": fmt.name, "strict": strict, "schema": fmt.schema},
        });
    }
    body
}

/// Parse a 2xx reply body into a [`ChatResponse`] (usage without `llm_calls`).
pub(super) fn parse_reply(body: &str) -> Result<ChatResponse, LlmError> {
    let v: Value = serde_json::from_str(body).map_err(|e| {
        LlmError::BadReply(format!(
            "not JSON ({e}): {}",
            truncate(body, MAX_ERROR_BODY)
        ))
    })?;
    parse_completion(v, body)
}

/// A chat completion (parsed, or assembled from a stream) as a [`ChatResponse`]; `raw` is what
/// an error quotes.
pub(super) fn parse_completion(mut v: Value, raw: &str) -> Result<ChatResponse, LlmError> {
    // What a model writes is stored: no store may be handed a NUL.
    crate::model::scrub_nul(&mut v);
    let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
        return Err(LlmError::BadReply(format!(
            "no `choices[0]` in the reply: {}",
            truncate(raw, MAX_ERROR_BODY)
        )));
    };
    let message = choice.get("message").cloned().unwrap_or(Value::Null);
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, call) in calls.iter().enumerate() {
            let function = call.get("function").cloned().unwrap_or(Value::Null);
            let Some(name) = function.get("name").and_then(Value::as_str) else {
                return Err(LlmError::BadReply(format!(
                    "tool call {i} has no function name"
                )));
            };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{}", i + 1), str::to_owned);
            let mut arguments = match function.get("arguments") {
                Some(Value::String(raw)) if raw.trim().is_empty() => json!({}),
                Some(Value::String(raw)) => {
                    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.clone()))
                }
                // Some servers send the object itself.
                Some(other @ Value::Object(_)) => other.clone(),
                None | Some(Value::Null) => json!({}),
                Some(other) => Value::String(other.to_string()),
            };
            // The arguments were JSON text inside the reply: scrub what parsing it revealed.
            crate::model::scrub_nul(&mut arguments);
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            });
        }
    }
    let finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let u = v.get("usage");
    let count = |key: &str| {
        u.and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (prompt, completion) = (count("prompt_tokens"), count("completion_tokens"));
    let total = match count("total_tokens") {
        0 => prompt + completion,
        t => t,
    };
    Ok(ChatResponse {
        content,
        tool_calls,
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total,
            llm_calls: 0,
            cached_prompt_tokens: u
                .and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens"))
                .and_then(Value::as_u64)
                .unwrap_or(0),
            cost_usd: 0.0,
        },
        finish_reason,
        model: v.get("model").and_then(Value::as_str).map(str::to_owned),
    })
}
