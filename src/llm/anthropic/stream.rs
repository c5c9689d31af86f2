//! A streamed Messages reply (`message_start`, `content_block_start`/`_delta`/`_stop`,
//! `message_delta`, `message_stop`, `ping`, `error`) assembled into the message a non-streamed
//! call returns, so the same parser reads both. Text deltas go to the request's token sink as
//! they arrive, and so do the JSON deltas of a structured request's forced tool (the reply being
//! written); other tools' input is not text the model shows, and is not sent.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::super::transport::{MAX_ERROR_BODY, SseEvent, StreamFault, StreamReader, StreamedReply};
use super::super::{ChatResponse, LlmError, Tokens, truncate};

/// One content block being assembled.
#[derive(Debug)]
enum Block {
    Text(String),
    /// A tool use; its input arrives as JSON text in pieces.
    ToolUse {
        id: String,
        name: String,
        json: String,
        /// The input the start event carried (used when no piece follows).
        initial: Value,
    },
    /// Thinking and other blocks, kept as they started (they are not the answer).
    Other(Value),
}

/// Assembles one attempt's stream.
pub(super) struct EventAssembler {
    tokens: Tokens,
    /// The structured request's forced tool, whose input is forwarded as it is written.
    forced: Option<String>,
    blocks: BTreeMap<u64, Block>,
    usage: Map<String, Value>,
    stop_reason: Option<String>,
    /// The model `message_start` names.
    model: Option<String>,
    stopped: bool,
}

/// The stream ended before the message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the streamed reply ended before `message_stop`")]
struct CutShort;

impl EventAssembler {
    pub(super) fn new(tokens: Tokens, forced: Option<String>) -> Self {
        Self {
            tokens,
            forced,
            blocks: BTreeMap::new(),
            usage: Map::new(),
            stop_reason: None,
            model: None,
            stopped: false,
        }
    }

    /// The message the events make (the shape of a non-streamed reply).
    ///
    /// # Errors
    /// The stream ended before the message did (a transient failure: worth another attempt).
    fn message(self) -> Result<Value, CutShort> {
        if !self.stopped && self.stop_reason.is_none() {
            return Err(CutShort);
        }
        let content: Vec<Value> = self
            .blocks
            .into_values()
            .map(|b| match b {
                Block::Text(text) => json!({"type": "text", "text": text}),
                Block::ToolUse {
                    id,
                    name,
                    json,
                    initial,
                } => {
                    let input = if json.trim().is_empty() {
                        initial
                    } else {
                        // Input that does not parse is kept as written: the tool's argument
                        // check (or the structured repair) reports it to the model.
                        serde_json::from_str(&json).unwrap_or(Value::String(json))
                    };
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
                Block::Other(v) => v,
            })
            .collect();
        Ok(json!({
            "type": "message",
            "role": "assistant",
            "content": content,
            "stop_reason": self.stop_reason,
            "usage": Value::Object(self.usage),
            "model": self.model,
        }))
    }

    /// Take the counts a usage object carries (later events carry the final ones).
    fn take_usage(&mut self, u: Option<&Value>) {
        if let Some(Value::Object(u)) = u {
            for (k, v) in u {
                if v.is_u64() {
                    self.usage.insert(k.clone(), v.clone());
                }
            }
        }
    }

    fn start_block(&mut self, index: u64, block: &Value) {
        let b = match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                self.tokens.send(text);
                Block::Text(text.to_owned())
            }
            Some("tool_use") => Block::ToolUse {
                id: block
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                name: block
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                json: String::new(),
                initial: block.get("input").cloned().unwrap_or_else(|| json!({})),
            },
            _ => Block::Other(block.clone()),
        };
        self.blocks.insert(index, b);
    }

    fn delta(&mut self, index: u64, delta: &Value) {
        let piece = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
        match (
            delta.get("type").and_then(Value::as_str),
            self.blocks.get_mut(&index),
        ) {
            (Some("text_delta"), Some(Block::Text(text))) => {
                let t = piece("text");
                text.push_str(t);
                self.tokens.send(t);
            }
            (Some("input_json_delta"), Some(Block::ToolUse { name, json, .. })) => {
                let p = piece("partial_json");
                json.push_str(p);
                if self.forced.as_deref() == Some(name.as_str()) {
                    self.tokens.send(p);
                }
            }
            // Thinking, signatures, citations: not the answer.
            _ => {}
        }
    }
}

impl StreamedReply for EventAssembler {
    fn finish(self: Box<Self>) -> Result<ChatResponse, StreamFault> {
        let forced = self.forced.clone();
        let message = self
            .message()
            .map_err(|e| StreamFault::Transient(e.to_string()))?;
        let raw = message.to_string();
        super::wire::parse_message(message, forced.as_deref(), &raw).map_err(StreamFault::Fatal)
    }
}

impl StreamReader for EventAssembler {
    fn event(&mut self, event: SseEvent) -> Result<(), StreamFault> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            StreamFault::Fatal(LlmError::BadReply(format!(
                "a streamed event is not JSON ({e}): {}",
                truncate(data, MAX_ERROR_BODY)
            )))
        })?;
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        match kind {
            "message_start" => {
                let message = v.get("message");
                self.model = message
                    .and_then(|m| m.get("model"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.take_usage(message.and_then(|m| m.get("usage")));
            }
            "content_block_start" => {
                if let Some(block) = v.get("content_block") {
                    self.start_block(index, block);
                }
            }
            "content_block_delta" => {
                if let Some(delta) = v.get("delta") {
                    self.delta(index, delta);
                }
            }
            "message_delta" => {
                if let Some(reason) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.take_usage(v.get("usage"));
            }
            "message_stop" => self.stopped = true,
            "error" => {
                // Overloaded or a server error in the middle of a reply: another attempt may do.
                let message = super::wire::error_message(data);
                return Err(StreamFault::Transient(format!(
                    "error in the stream: {message}"
                )));
            }
            // `ping`, `content_block_stop`, and events added later.
            _ => {}
        }
        Ok(())
    }
}
