//! Replies in OpenAI's Chat Completions format: one `chat.completion`, or, for a request with
//! `stream: true`, its `chat.completion.chunk`s (a role chunk, the content in pieces, each tool
//! call's name then its arguments in two halves, the finish reason, the usage chunk, `[DONE]`).

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::{Pace, Reply, error_response, pieces, sse_response};

/// The model every reply says answered, as a real API names a dated snapshot of the model asked
/// for (so a client can tell what it asked from what answered).
pub const ANSWERING_MODEL: &str = "fake-model-2026-01-01";

/// The `usage` object of a reply that used `prompt` and `completion` tokens.
fn usage_of((prompt, completion): (u64, u64)) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn completion(content: Option<String>, tool_calls: Vec<Value>, usage: (u64, u64)) -> Value {
    let finish = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": ANSWERING_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage_of(usage)
    })
}

/// The text and the tool calls (id, name, arguments as JSON text) a reply is made of.
fn parts(reply: Reply, n: u64) -> (Option<String>, Vec<(String, String, String)>) {
    match reply {
        Reply::Json(v) => (Some(v.to_string()), vec![]),
        Reply::Text(t) => (Some(t), vec![]),
        Reply::ToolCalls(calls) => (
            None,
            calls
                .into_iter()
                .enumerate()
                .map(|(i, (name, args))| (format!("call_{n}_{i}"), name, args.to_string()))
                .collect(),
        ),
        Reply::Status(..) | Reply::Delay(..) => unreachable!("answered before"),
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": ANSWERING_MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
    .to_string()
}

/// Answer with `reply` (its delays already waited), streamed when the request asked.
pub(crate) async fn render(
    reply: Reply,
    n: u64,
    stream: bool,
    pace: Pace,
    usage: (u64, u64),
) -> Response {
    if let Reply::Status(code, body, retry_after) = reply {
        return error_response(code, body, retry_after);
    }
    let (content, calls) = parts(reply, n);
    if !stream {
        let calls = calls
            .into_iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
        return Json(completion(content, calls, usage)).into_response();
    }
    let mut frames = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    if let Some(text) = &content {
        for piece in pieces(text, pace.chunks) {
            frames.push(chunk(json!({"content": piece}), None));
        }
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        frames.push(chunk(
            json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        for piece in pieces(args, 2) {
            frames.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    frames.push(chunk(json!({}), Some(finish)));
    frames.push(
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": ANSWERING_MODEL, "choices": [],
               "usage": usage_of(usage)})
        .to_string(),
    );
    frames.push("[DONE]".into());
    let frames = frames
        .into_iter()
        .map(|data| format!("data: {data}\n\n"))
        .collect();
    sse_response(frames, pace.delay)
}
