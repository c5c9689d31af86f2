//! The AG-UI 1.0 events this server sends, as the protocol's schema names them (camelCase
//! fields, `type` in SCREAMING_SNAKE_CASE, optional fields left out rather than `null`), and the
//! interrupt and usage objects they carry. Only the events the fold of [`super::fold`] makes are
//! here; every one is checked against the official `ag-ui-protocol` models by the tests.

use serde::Serialize;
use serde_json::Value;

/// The protocol version this server speaks, declared on every `RUN_STARTED` (the 1.0 rules:
/// a producer MUST send its own declaration).
pub const PROTOCOL_VERSION: &str = "1.0";

/// One AG-UI event. `timestamp` is milliseconds since the Unix epoch: when the observation the
/// event comes from was committed (or when the event was made, for those that come from none).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(flatten)]
    pub body: Body,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
}

/// What an event says, by type.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "SCREAMING_SNAKE_CASE",
    rename_all_fields = "camelCase"
)]
pub enum Body {
    /// Opens a run: our ids beside the AG-UI ones in `metadata.pes`.
    RunStarted {
        thread_id: String,
        run_id: String,
        protocol_version: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Value>,
    },
    /// Closes a run that did not fail: completed, interrupted, or cancelled.
    RunFinished {
        thread_id: String,
        run_id: String,
        outcome: Outcome,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Vec<TokenUsage>>,
    },
    /// Ends a run that failed.
    RunError {
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Vec<TokenUsage>>,
    },
    /// A todo item started (`stepName` = the item id).
    StepStarted {
        step_name: String,
    },
    /// A todo item ended, or the run stopped while it was open.
    StepFinished {
        step_name: String,
    },
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
    },
    /// The call's arguments, as JSON text, in one piece.
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    ToolCallEnd {
        tool_call_id: String,
    },
    /// What a tool call returned, as text (JSON for structured output).
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: &'static str,
    },
    /// The final answer starts (as the model writes it, when tokens stream).
    TextMessageStart {
        message_id: String,
        role: &'static str,
    },
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    TextMessageEnd {
        message_id: String,
    },
    /// The whole state: `{todoList: [...]}`.
    StateSnapshot {
        snapshot: Value,
    },
    /// A change of the state, as an RFC 6902 patch.
    StateDelta {
        delta: json_patch::Patch,
    },
}

/// Why a run ended (`RUN_FINISHED.outcome`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Outcome {
    Success,
    /// The run waits for people: one interrupt per pending suspension.
    Interrupt {
        interrupts: Vec<Interrupt>,
    },
    Cancelled,
}

/// Something the run needs from a person: one pending suspension, answered by a resume entry
/// whose `interruptId` is its id (the suspension id).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    pub id: String,
    /// `tool_approval`, `input_required` or `remote_input_required`.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The call an approval concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// What the resume entry's `payload` must look like.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// `{"pes": {kind, itemId, runId, allowedDecisions, toolCall}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// Token counts of a run, in the protocol's accounting (input and output are totals; total is
/// their sum).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

impl Event {
    /// An event of `body` made at `timestamp` (ms).
    pub fn at(body: Body, timestamp: Option<i64>) -> Self {
        Self { body, timestamp }
    }

    /// The event's `type`, as it is on the wire.
    #[cfg(test)]
    pub fn kind(&self) -> &'static str {
        match &self.body {
            Body::RunStarted { .. } => "RUN_STARTED",
            Body::RunFinished { .. } => "RUN_FINISHED",
            Body::RunError { .. } => "RUN_ERROR",
            Body::StepStarted { .. } => "STEP_STARTED",
            Body::StepFinished { .. } => "STEP_FINISHED",
            Body::ToolCallStart { .. } => "TOOL_CALL_START",
            Body::ToolCallArgs { .. } => "TOOL_CALL_ARGS",
            Body::ToolCallEnd { .. } => "TOOL_CALL_END",
            Body::ToolCallResult { .. } => "TOOL_CALL_RESULT",
            Body::TextMessageStart { .. } => "TEXT_MESSAGE_START",
            Body::TextMessageContent { .. } => "TEXT_MESSAGE_CONTENT",
            Body::TextMessageEnd { .. } => "TEXT_MESSAGE_END",
            Body::StateSnapshot { .. } => "STATE_SNAPSHOT",
            Body::StateDelta { .. } => "STATE_DELTA",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_camel_case_with_their_type_and_no_nulls() {
        let e = Event::at(
            Body::RunStarted {
                thread_id: "t".into(),
                run_id: "r".into(),
                protocol_version: PROTOCOL_VERSION,
                metadata: None,
            },
            Some(5),
        );
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r", "protocolVersion": "1.0", "timestamp": 5})
        );
        let e = Event::at(
            Body::RunFinished {
                thread_id: "t".into(),
                run_id: "r".into(),
                outcome: Outcome::Interrupt {
                    interrupts: vec![Interrupt {
                        id: "s".into(),
                        reason: "tool_approval".into(),
                        message: None,
                        tool_call_id: Some("c".into()),
                        response_schema: None,
                        expires_at: None,
                        metadata: None,
                    }],
                },
                result: None,
                usage: None,
            },
            None,
        );
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r",
                   "outcome": {"type": "interrupt", "interrupts": [{"id": "s", "reason": "tool_approval", "toolCallId": "c"}]}})
        );
        assert_eq!(e.kind(), "RUN_FINISHED");
        let step = Event::at(
            Body::StepStarted {
                step_name: "a".into(),
            },
            None,
        );
        assert_eq!(
            serde_json::to_value(&step).unwrap(),
            json!({"type": "STEP_STARTED", "stepName": "a"})
        );
    }
}
