//! The same fake model behind Anthropic's Messages API (`POST /v1/messages`). A request is read
//! into the Chat Completions shape the rest of the crate scripts against (the `system` prompt
//! first, each text block a user message, each `tool_result` a tool message, `tool_use` blocks
//! tool calls, the forced tool of a structured request its `response_format`), so phases, items,
//! scripts, holds and the default workload work unchanged; the wire request is kept as it came.
//! A reply is rendered as a message, or, for `stream: true`, as its events (`message_start`,
//! blocks started, written in pieces and stopped, `message_delta`, `message_stop`).

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::{Pace, Reply, error_response, pieces, sse_response};

/// The text of a `content` field: a string, or the text blocks of an array.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The name of a structured request's forced tool.
pub(crate) fn forced_tool(req: &Value) -> Option<&str> {
    (req["tool_choice"]["type"] == "tool")
        .then(|| req["tool_choice"]["name"].as_str())
        .flatten()
}

/// A Messages request in the Chat Completions shape.
pub(crate) fn to_chat(req: &Value) -> Value {
    let mut messages = Vec::new();
    let system = text_of(&req["system"]);
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    for m in req["messages"].as_array().into_iter().flatten() {
        let blocks = match &m["content"] {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => vec![],
        };
        if m["role"] == "assistant" {
            let text = text_of(&Value::Array(blocks.clone()));
            let calls: Vec<Value> = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| {
                    json!({"id": b["id"], "type": "function",
                           "function": {"name": b["name"], "arguments": b["input"].to_string()}})
                })
                .collect();
            let mut msg =
                json!({"role": "assistant", "content": (!text.is_empty()).then_some(text)});
            if !calls.is_empty() {
                msg["tool_calls"] = calls.into();
            }
            messages.push(msg);
            continue;
        }
        for b in blocks {
            if b["type"] == "tool_result" {
                messages.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"],
                                     "content": text_of(&b["content"])}));
            } else if b["type"] == "text" {
                messages.push(json!({"role": "user", "content": b["text"]}));
            }
        }
    }
    let forced = forced_tool(req);
    let mut chat = json!({"model": req["model"], "messages": messages, "stream": req["stream"]});
    let tools: Vec<Value> = req["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["name"].as_str() != forced)
        .map(|t| {
            json!({"type": "function", "function": {"name": t["name"],
                   "description": t["description"], "parameters": t["input_schema"]}})
        })
        .collect();
    if !tools.is_empty() {
        chat["tools"] = tools.into();
    }
    if let Some(name) = forced {
        let schema = req["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["name"] == name)
            .map(|t| t["input_schema"].clone())
            .unwrap_or(Value::Null);
        chat["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}});
    }
    chat
}

/// One content block of a reply, before it is written out.
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

fn usage(output: u64) -> Value {
    json!({"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": output})
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// Answer with `reply` (its delays already waited), streamed when the request asked.
pub(crate) async fn render(reply: Reply, n: u64, req: &Value, pace: Pace) -> Response {
    let forced = forced_tool(req).map(str::to_owned);
    let blocks = match reply {
        Reply::Status(code, body, retry_after) => return error_response(code, body, retry_after),
        Reply::Json(v) => match &forced {
            Some(name) => vec![Block::ToolUse {
                id: format!("toolu_{n}_0"),
                name: name.clone(),
                input: v,
            }],
            None => vec![Block::Text(v.to_string())],
        },
        Reply::Text(t) => vec![Block::Text(t)],
        Reply::ToolCalls(calls) => calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, input))| Block::ToolUse {
                id: format!("toolu_{n}_{i}"),
                name,
                input,
            })
            .collect(),
        Reply::Delay(..) => unreachable!("waited before"),
    };
    let stop = if blocks.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
        "tool_use"
    } else {
        "end_turn"
    };
    let model = req["model"].clone();
    if req["stream"] != true {
        let content: Vec<Value> = blocks
            .into_iter()
            .map(|b| match b {
                Block::Text(t) => json!({"type": "text", "text": t}),
                Block::ToolUse { id, name, input } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
            })
            .collect();
        return Json(json!({
            "id": format!("msg_fake_{n}"), "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": stop, "stop_sequence": null,
            "usage": usage(5),
        }))
        .into_response();
    }
    let mut frames = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_fake_{n}"), "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "usage": usage(1)}}),
    )];
    frames.push(event("ping", json!({"type": "ping"})));
    for (index, b) in blocks.into_iter().enumerate() {
        let (start, deltas) = match b {
            Block::Text(t) => (
                json!({"type": "text", "text": ""}),
                pieces(&t, pace.chunks)
                    .into_iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect::<Vec<_>>(),
            ),
            Block::ToolUse { id, name, input } => {
                // The reply of a structured request is written in pieces like text; a tool
                // call's input in two.
                let n = if forced.as_deref() == Some(name.as_str()) {
                    pace.chunks
                } else {
                    2
                };
                (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    pieces(&input.to_string(), n)
                        .into_iter()
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect(),
                )
            }
        };
        frames.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for d in deltas {
            frames.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": d}),
            ));
        }
        frames.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    frames.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
    ));
    frames.push(event("message_stop", json!({"type": "message_stop"})));
    sse_response(frames, pace.delay)
}
