//! A streamed completion (`chat.completion.chunk`s, the usage chunk, `[DONE]`) assembled into the
//! completion a non-streamed call returns, read by the same parser.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::super::transport::{MAX_ERROR_BODY, SseEvent, StreamFault, StreamReader, StreamedReply};
use super::super::{ChatResponse, LlmError, Tokens, truncate};
use super::wire::parse_completion;

/// A tool call being assembled from its deltas.
#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Assembles a streamed completion (`chat.completion.chunk`s, then the usage chunk, then
/// `[DONE]`) into the completion a non-streamed call returns, forwarding content deltas to the
/// request's token sink (tool-call arguments are not text the model shows: they are not sent).
pub(super) struct ChunkAssembler {
    tokens: Tokens,
    content: String,
    saw_content: bool,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    /// The model every chunk names.
    model: Option<String>,
    done: bool,
}

impl ChunkAssembler {
    pub(super) fn new(tokens: Tokens) -> Self {
        Self {
            tokens,
            content: String::new(),
            saw_content: false,
            calls: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            model: None,
            done: false,
        }
    }

    /// The completion the chunks make (the shape of a non-streamed reply).
    fn completion(self) -> Value {
        let tool_calls: Vec<Value> = self
            .calls
            .into_iter()
            .map(|(i, c)| {
                json!({
                    "id": c.id.unwrap_or_else(|| format!("call_{}", i + 1)),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        // A reply that made tool calls and wrote no text has no content, as when not streamed.
        let content = if self.content.is_empty() && (!self.saw_content || !tool_calls.is_empty()) {
            Value::Null
        } else {
            Value::String(self.content)
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !tool_calls.is_empty() {
            message["tool_calls"] = tool_calls.into();
        }
        let mut reply = json!({
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        });
        if let Some(u) = self.usage {
            reply["usage"] = u;
        }
        if let Some(m) = self.model {
            reply["model"] = m.into();
        }
        reply
    }
}

impl StreamedReply for ChunkAssembler {
    fn finish(self: Box<Self>) -> Result<ChatResponse, StreamFault> {
        let completion = self.completion();
        parse_completion(completion.clone(), &completion.to_string()).map_err(StreamFault::Fatal)
    }
}

impl StreamReader for ChunkAssembler {
    fn event(&mut self, event: SseEvent) -> Result<(), StreamFault> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() || self.done {
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            StreamFault::Fatal(LlmError::BadReply(format!(
                "a streamed chunk is not JSON ({e}): {}",
                truncate(data, MAX_ERROR_BODY)
            )))
        })?;
        if let Some(err) = chunk.get("error") {
            // A server that fails mid-stream says so in the stream.
            return Err(StreamFault::Transient(format!(
                "error in the stream: {err}"
            )));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        if let Some(m) = chunk.get("model").and_then(Value::as_str) {
            self.model = Some(m.to_owned());
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return Ok(());
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(());
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.saw_content = true;
            self.content.push_str(text);
            self.tokens.send(text);
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (pos, call) in calls.iter().enumerate() {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(pos as u64);
                let partial = self.calls.entry(index).or_default();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    partial.id = Some(id.to_owned());
                }
                let function = call.get("function");
                if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
                    partial.name.push_str(name);
                }
                match function.and_then(|f| f.get("arguments")) {
                    Some(Value::String(piece)) => partial.arguments.push_str(piece),
                    Some(v @ Value::Object(_)) => partial.arguments.push_str(&v.to_string()),
                    _ => {}
                }
            }
        }
        Ok(())
    }
}
