//! The Messages API's wire format, both ways. Requests: system prompts go to `system`; our
//! messages become alternating `user`/`assistant` turns of content blocks (tool calls are
//! `tool_use` blocks, tool results `tool_result` blocks of a user turn, consecutive ones in one
//! turn); a structured request (`response_format`) offers one more tool whose `input_schema` is
//! the schema and forces it (`tool_choice: {type: "tool"}`), so the reply's JSON is that tool's
//! input. Replies: text blocks are the content, other `tool_use` blocks the tool calls, the
//! forced tool's input the structured content; `stop_reason` maps to OpenAI's finish reasons and
//! cached input tokens count as prompt tokens.

use serde_json::{Map, Value, json};

use super::super::openai::schema_instruction;
use super::super::transport::MAX_ERROR_BODY;
use super::super::{ChatMessage, ChatRequest, ChatResponse, JsonSchemaFormat, LlmError, Role};
use super::super::{ToolCall, truncate};
use crate::model::Usage;

/// What the forced tool of a structured request tells the model.
const STRUCTURED_TOOL_DESCRIPTION: &str = "Give your reply: the input of this tool is your whole answer, as the JSON object its schema describes.";

/// Text sent in place of an empty one (the API refuses empty text blocks).
const EMPTY_TEXT: &str = "(empty)";

/// How a request asks for structured output.
#[derive(Debug, Clone, Copy)]
pub(super) enum Structured<'a> {
    /// It does not.
    No,
    /// Through a forced tool whose input is the reply (the schema describes an object).
    Tool(&'a JsonSchemaFormat),
    /// In the system prompt (a schema that cannot be a tool's input: not an object).
    Inline(&'a JsonSchemaFormat),
}

impl<'a> Structured<'a> {
    pub(super) fn of(req: &'a ChatRequest) -> Self {
        match &req.response_format {
            None => Self::No,
            Some(fmt) if fmt.schema.get("type").and_then(Value::as_str) == Some("object") => {
                Self::Tool(fmt)
            }
            Some(fmt) => Self::Inline(fmt),
        }
    }

    /// The name of the forced tool, when there is one.
    pub(super) fn tool(self) -> Option<&'a str> {
        match self {
            Self::Tool(fmt) => Some(&fmt.name),
            _ => None,
        }
    }
}

/// A tool-use id as the API accepts it (`^[a-zA-Z0-9_-]+$`): ids another provider made keep
/// their letters, digits, `_` and `-`; anything else becomes `_`.
fn wire_id(id: &str) -> String {
    let cleaned = super::super::identifier_chars(id);
    if cleaned.is_empty() {
        "call".into()
    } else {
        cleaned
    }
}

/// `text`, or a stand-in when it is blank.
fn non_empty(text: &str) -> &str {
    if text.trim().is_empty() {
        EMPTY_TEXT
    } else {
        text
    }
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": non_empty(text)})
}

/// The blocks of one message, and the role of the turn they belong to.
fn blocks_of(m: &ChatMessage) -> (&'static str, Vec<Value>) {
    match m.role {
        Role::System | Role::User => ("user", vec![text_block(m.content.as_deref().unwrap_or(""))]),
        Role::Tool => (
            "user",
            vec![json!({
                "type": "tool_result",
                "tool_use_id": wire_id(m.tool_call_id.as_deref().unwrap_or("")),
                "content": non_empty(m.content.as_deref().unwrap_or("")),
            })],
        ),
        Role::Assistant => {
            let mut blocks = Vec::new();
            if let Some(t) = m.content.as_deref().filter(|t| !t.trim().is_empty()) {
                blocks.push(text_block(t));
            }
            for c in &m.tool_calls {
                // The API takes an object; arguments that did not parse were answered with an
                // error already, so the call is shown without them.
                let input = match &c.arguments {
                    v @ Value::Object(_) => v.clone(),
                    _ => json!({}),
                };
                blocks.push(json!({
                    "type": "tool_use",
                    "id": wire_id(&c.id),
                    "name": c.name,
                    "input": input,
                }));
            }
            if blocks.is_empty() {
                blocks.push(text_block(""));
            }
            ("assistant", blocks)
        }
    }
}

/// Our conversation as alternating turns: messages of one role in a row share a turn (tool
/// results first, as the API requires them to lead a user turn), and the first turn is the
/// user's.
pub(super) fn wire_messages(messages: &[ChatMessage]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in messages.iter().filter(|m| m.role != Role::System) {
        let (role, blocks) = blocks_of(m);
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    if turns.first().is_none_or(|(role, _)| *role != "user") {
        turns.insert(0, ("user", vec![text_block("(the conversation so far)")]));
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// The request body.
pub(super) fn build_body(req: &ChatRequest, model: &str, max_tokens: u32, stream: bool) -> Value {
    let structured = Structured::of(req);
    let mut system: Vec<String> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .filter_map(|m| m.content.clone())
        .filter(|t| !t.trim().is_empty())
        .collect();
    if let Structured::Inline(fmt) = structured {
        system.push(schema_instruction(&fmt.schema));
    }
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("max_tokens".into(), max_tokens.into());
    if !system.is_empty() {
        body.insert("system".into(), system.join("\n\n").into());
    }
    body.insert("messages".into(), wire_messages(&req.messages).into());
    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "input_schema": t.parameters,
            })
        })
        .collect();
    if let Structured::Tool(fmt) = structured {
        tools.push(json!({
            "name": fmt.name,
            "description": STRUCTURED_TOOL_DESCRIPTION,
            "input_schema": fmt.schema,
        }));
        body.insert(
            "tool_choice".into(),
            json!({"type": "tool", "name": fmt.name}),
        );
    }
    if !tools.is_empty() {
        body.insert("tools".into(), tools.into());
    }
    if stream {
        body.insert("stream".into(), true.into());
    }
    Value::Object(body)
}

/// `stop_reason` in OpenAI's words (the service's one vocabulary); an unknown one as it is.
pub(super) fn finish_reason(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        "refusal" => "content_filter",
        other => other,
    }
    .to_owned()
}

/// Anthropic's usage as ours: cached input (read or written) is input too.
pub(super) fn usage_of(u: Option<&Value>) -> Usage {
    let count = |key: &str| {
        u.and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let prompt = count("input_tokens")
        + count("cache_creation_input_tokens")
        + count("cache_read_input_tokens");
    let completion = count("output_tokens");
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        llm_calls: 0,
        cached_prompt_tokens: count("cache_read_input_tokens"),
        cost_usd: 0.0,
    }
}

/// A message (parsed, or assembled from a stream) as a [`ChatResponse`]; `forced` names the
/// structured request's tool, whose input is the content; `raw` is what an error quotes.
pub(super) fn parse_message(
    mut v: Value,
    forced: Option<&str>,
    raw: &str,
) -> Result<ChatResponse, LlmError> {
    // What a model writes is stored: no store may be handed a NUL.
    crate::model::scrub_nul(&mut v);
    let Some(blocks) = v.get("content").and_then(Value::as_array) else {
        return Err(LlmError::BadReply(format!(
            "no `content` in the reply: {}",
            truncate(raw, MAX_ERROR_BODY)
        )));
    };
    let mut text = String::new();
    let mut structured: Option<String> = None;
    let mut tool_calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                let Some(name) = block.get("name").and_then(Value::as_str) else {
                    return Err(LlmError::BadReply(format!("tool use {i} has no name")));
                };
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                if forced == Some(name) && structured.is_none() {
                    structured = Some(match input {
                        // Input that did not parse is shown as it came, for the repair request.
                        Value::String(raw) => raw,
                        other => other.to_string(),
                    });
                    continue;
                }
                let id = block
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("toolu_{}", i + 1), str::to_owned);
                tool_calls.push(ToolCall {
                    id,
                    name: name.to_owned(),
                    arguments: input,
                });
            }
            // Thinking and other blocks are not the answer.
            _ => {}
        }
    }
    let content = structured.or((!text.is_empty()).then_some(text));
    Ok(ChatResponse {
        content,
        tool_calls,
        usage: usage_of(v.get("usage")),
        finish_reason: v
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(finish_reason),
        model: v.get("model").and_then(Value::as_str).map(str::to_owned),
    })
}

/// What an error reply says: `<type>: <message>` of Anthropic's error object, else the body.
pub(super) fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    match (
        err.and_then(|e| e.get("type")).and_then(Value::as_str),
        err.and_then(|e| e.get("message")).and_then(Value::as_str),
    ) {
        (Some(kind), Some(message)) => truncate(&format!("{kind}: {message}"), MAX_ERROR_BODY),
        (None, Some(message)) => truncate(message, MAX_ERROR_BODY),
        _ => truncate(body, MAX_ERROR_BODY),
    }
}
